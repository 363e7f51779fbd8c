// Package session is the client of a live training session: it names sessions and their
// files, dials one, starts one when none answers, lists and stops them, and offers each RPC of
// halo.v1.SessionService (session/proto/halo/v1) as a method of Client. The front ends (repl,
// tui, kernel, cell, and `halo-shell tui`/`kernel`) use it.
//
// It links no engine. A session's engine runs in another process, the session server
// (session/server, `halo-shell session start`), and is reached only over RPC: what a client
// needs to know of the engine travels in the protocol's messages (re-exported here: StepMetrics,
// StatusResponse, Event, ...) or lives in a small leaf package that both sides use
// (internal/layoutspec for layout words, internal/profilekeys for the parts of a step profile).
// internal/boundary's test fails when a client comes to link an engine package.
//
// # Dialling
//
// Dial takes a session name ("default", "exp1"), a unix socket path (absolute, or
// "unix:///path") or "tcp://HOST:PORT", which needs the session's bearer token (Options.Token,
// else the token file of Options.TokenSession in RuntimeDir), and speaks TLS when a CA file is
// given (Options.CAFile or HALO_SESSION_CA) for a session started with --tls-cert. DialOrStart
// attaches to a named session and starts the default one when none answers; another name
// that nothing answers on is an error naming the running sessions (ErrNotRunning, NotRunning).
// Start serialises starts of one name with a lock file and waits for the config to load.
//
// # Control and observation
//
// Exactly one client controls a session at a time; any number observe. Control calls (Load,
// Step, Run, Pause, Resume, Eval, Generate, Save, SetHyper, SetLayout, Profile) from a client
// that is not the controller fail with code failed_precondition naming the controller
// (IsNotController, NotControllerOf). The first control call of a client claims control when
// nobody holds it; TakeOver takes it from another client and Release gives it up. Read-only
// calls (Status, Hyper, Inspect without capture, Events) never need control. A client is
// identified by the id in its Options (a random one by default), sent as the Halo-Client-Id
// header.
//
// Control follows the controller's liveness: a Client that controls renews a lease every
// LeaseRenewEvery, and the session releases control from a client with no call or stream in
// progress that has not renewed within its lease (HALO_CONTROL_LEASE, 6 s), so control passes
// on within seconds when its holder is killed. A live holder keeps control until it releases
// it or another client takes over; the refusal names the holder and every way to take over
// (`:takeover` and `repl --take-over` in the REPL, `%takeover` in a notebook, halo.TakeOver()
// in a cell, `t` in the TUI). Status lists the clients that are alive.
//
// # Events
//
// Events and Subscribe stream per-step metrics, logs, state changes and profiles. The session
// keeps a bounded buffer per observer; when one falls behind, the oldest events are dropped and
// a DroppedEvent says how many, so a slow observer never blocks the engine. EventsWithHistory
// and SubscribeWithHistory first send the latest steps' metrics of the loaded model (the
// session keeps 4096), so that a dashboard attaching to a running session starts with its
// charts filled.
//
// # Rewards from the client
//
// A GRPO run whose config names reward function "client" asks its controlling client for
// rewards: ScoreRollouts opens the Rollouts stream and answers every RolloutBatch (a step's
// prompts, completions and reference answers) with a ScoreFunc, under the batch's timeout.
// A ScoreFunc that fails, panics, returns the wrong number of rewards or an infinite one
// sends the error instead, and the step is retried or skipped as the run's config says; a
// client that never answers or disconnects costs the step its timeout at most, and the
// session stays usable.
//
// # Processes and files
//
// Start runs `halo-shell session start --foreground` (this executable when it is halo-shell,
// else halo-shell from PATH, or StartOptions.Command) detached in its own process session, and
// waits for the socket to answer. Stop sends SIGTERM, on which a session stops at the next step
// boundary (saving a checkpoint first when it was started with --save-on-stop), removes its
// socket and exits. List finds live sessions and removes stale sockets. Each session NAME owns
// NAME.sock, NAME.pid, NAME.log, and with TCP NAME.token (0600) and NAME.tcp, in RuntimeDir
// ($XDG_RUNTIME_DIR/halo-shell, else the user cache directory; HALO_SESSION_DIR overrides
// both).
package session
