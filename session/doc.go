// Package session is a live training engine behind an RPC API, and the Go client for it.
//
// A session process holds one engine (a train.Trainer: model, optimizer, data) and outlives its
// clients. It listens on a unix socket (0600, in a 0700 directory) named after the session
// under RuntimeDir, and optionally on TCP with a bearer token. Clients (the REPL, the TUI, the
// Jupyter kernel, `halo-shell launch` progress) attach with Dial or DialOrStart and call the
// methods of Client; each method is one RPC of halo.v1.SessionService (session/proto/halo/v1).
//
// # Control and observation
//
// Exactly one client controls a session at a time; any number observe. Control calls (Load,
// Step, Run, Pause, Resume, Eval, Generate, Save, SetHyper, SetLayout, Profile) from a client that is not
// the controller fail with code failed_precondition naming the controller ("observe, or take
// over with --take-over"). The first control call of a client claims control when nobody holds
// it; TakeOver takes it from another client and Release gives it up. Read-only calls (Status,
// Hyper, Inspect without capture, Events) never need control. A client is identified by the id
// in its Options (a random one by default), sent as the Halo-Client-Id header.
//
// # The engine goroutine
//
// One goroutine owns the trainer. RPC handlers submit commands as futures (with the caller's
// context, a timeout and the server's shutdown) to a queue that the engine goroutine executes
// only at step boundaries, so state is never torn. States: empty -> idle (loaded) <->
// running/paused -> stopping. Pause takes effect at the next step boundary.
//
// # Events
//
// Events streams per-step metrics, logs, state changes and profiles to every observer. Each
// observer has a bounded buffer; when it falls behind, the oldest events are dropped and a
// DroppedEvent tells it how many, so a slow observer never blocks the engine.
//
// # Processes and files
//
// Start runs `halo-shell session start --foreground` detached (its own process session) and
// waits for the socket; Stop sends SIGTERM, on which a session stops at the next step boundary,
// saves a checkpoint when ServerOptions.SaveOnStop is set, removes its socket and exits 0. List
// finds live sessions and removes stale sockets. Each session NAME owns NAME.sock, NAME.pid,
// NAME.log, and with TCP NAME.token (0600) and NAME.tcp, in RuntimeDir. Calls over TCP need
// "Authorization: Bearer TOKEN"; others are refused with code unauthenticated and logged.
//
// # Batch runs and profiling
//
// ServeRun serves a train.Run batch loop (`halo-shell launch`) as a session, so observers
// attach to it by name. Profile and activation capture need the trainer's backend to be a
// profile.Wrap'ed one: EnableProfiling arranges that for every trainer built afterwards.
// On one GPU a profiled step times each op between CUDA events, so it runs at full speed and
// its split is device time. On several devices each device has its own recorder of compute ops
// and collectives, all timed on the host (a Sync after each op); a
// step's profile is the mean over the devices of each op class, collective kind and idle
// time, and its trace has one process (compute and collective tracks) per device.
//
// # Layouts
//
// SetLayout moves the run to another parallel layout at a step boundary (train.SetLayout):
// parameters and optimizer state are redistributed in memory; the response and a log event
// carry how long it took. A refused target leaves the run in its layout. Status reports the
// layout and devices.
//
// The package is not the engine (engine/train) and not a front-end (repl, tui, kernel): it knows
// nothing about terminals or notebooks, and it executes no user code.
package session
