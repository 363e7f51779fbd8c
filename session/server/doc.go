// Package server is a live training engine behind an RPC API: the session server that
// `halo-shell session start` and `halo-shell launch` run, and that clients (package session)
// attach to.
//
// A server holds one engine (a train.Trainer: model, optimizer, data) and outlives its
// clients. It listens on a unix socket (0600, in a 0700 directory) named after the session
// (session.PathsFor), and optionally on TCP with a bearer token: calls over TCP need
// "Authorization: Bearer TOKEN"; others are refused with code unauthenticated and logged. TCP
// binds loopback only unless Options.AllowRemote (then it warns), serves TLS with
// Options.TLSCert and TLSKey, and confines its clients' Load and Save paths to the session's
// directories; no error about a file quotes the file's contents (remote.go). It serves halo.v1.SessionService (session/proto/halo/v1); the rules of control and observation
// are those the session package describes, enforced here.
//
// # The engine goroutine
//
// One goroutine owns the trainer. RPC handlers submit commands as futures (with the caller's
// context, a timeout and the server's shutdown) to a queue that the engine goroutine executes
// only at step boundaries, so state is never torn. States: empty -> idle (loaded) <->
// running/paused -> stopping. Pause takes effect at the next step boundary. SIGTERM (Serve's
// context) stops the server at the next step boundary, saves a checkpoint when
// Options.SaveOnStop is set, removes the socket and returns.
//
// # Events
//
// Each observer of Events has a bounded buffer; when it falls behind, the oldest events are
// dropped and a DroppedEvent tells it how many, so a slow observer never blocks the engine.
//
// # Batch runs and profiling
//
// ServeRun serves a train.Run batch loop (`halo-shell launch`) as a session, so observers
// attach to it by name. Profile and activation capture need the trainer's own device to be
// profile.Wrap'ed: Load builds trainers with NewTrainer, which wraps that device (Profiled) and
// nothing else in the process, and a caller of ServeRun builds its trainer with NewTrainer too.
// On one GPU a profiled step times each op between CUDA events, so it runs at full speed and
// its split is device time. On several devices each device has its own recorder of compute ops
// and collectives, all timed on the host (a Sync after each op); a step's profile is the mean
// over the devices of each op class, collective kind and idle time, and its trace has one
// process (compute and collective tracks) per device.
//
// # Measurements
//
// Measure times one op (engine/bench.MeasureOp) on the engine goroutine, between steps: on
// the loaded model's device, or on a backend it opens for the device asked ("auto" without a
// model) and keeps for the next measurement until another device is asked or the session
// stops.
//
// # Rewards from the client
//
// GRPO's reward function "client" is the engine's rewardHub (rewards.go): a step hands it the
// rollouts, the hub sends them on the controlling client's Rollouts stream and waits for
// SubmitRewards, the step's timeout or the stream's end, whichever is first. A client that
// never answers, answers garbage or disconnects gives the step an error, never a hang.
//
// # Layouts
//
// SetLayout moves the run to another parallel layout at a step boundary (train.SetLayout):
// parameters and optimizer state are redistributed in memory; the response and a log event
// carry how long it took. A refused target leaves the run in its layout. Status reports the
// layout and devices.
//
// The package is the engine's side of the protocol, not the engine (engine/train) and not a
// front end: it knows nothing about terminals or notebooks, it executes no user code, and no
// front end links it (internal/boundary's test says so); cmd/halo-shell and the front ends'
// tests, which run a real server in process, do.
package server
