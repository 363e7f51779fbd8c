// Package kernel is halo-shell's Jupyter kernel: it serves the Jupyter messaging protocol 5.3 over
// ZeroMQ (pure Go, github.com/go-zeromq/zmq4) and runs notebook cells with an Interpreter.
//
// A Kernel binds the five sockets named by a connection file (shell, control and stdin ROUTERs,
// the iopub PUB and the heartbeat REP), verifies the HMAC-SHA256 signature of every request
// (messages with a bad signature, and malformed ones, are dropped with a log line), and
// dispatches requests through a handler table built from a list of message types. Every request
// is bracketed by busy and idle status messages on iopub. A handler that fails produces an error
// reply; the kernel never exits on one.
//
// Before any signature can be checked, each socket's peers pass through kernel/internal/zmtpguard:
// a peer whose frame headers declare more than Config.Limits allows (a frame, a message, a count
// of frames), whose ZMTP handshake is malformed, or that does not finish its handshake in time is
// disconnected and logged before zmq4 allocates anything for it; the socket goes on serving the
// others. The heartbeat outlives pings it cannot take.
//
// Cells run one at a time on the shell goroutine; interrupt_request on the control channel
// cancels the context of the running cell (never the engine session it drives), and
// shutdown_request stops the kernel. What a cell means is up to the Interpreter: NewHalo gives
// the Go interpreter of package cell with `%` magics mirroring the REPL's colon commands,
// attached to an engine session; tests use small interpreters of their own.
//
// Install writes the kernelspec ("halo") that makes Jupyter start `halo-shell kernel
// --connection-file F`.
//
// The package is not the engine session (package session, the client; session/server, the
// server) and not the cell language (package cell); the wire format lives in
// kernel/internal/wire; kernel/nbrun is a client of this kernel that executes notebooks headless
// (halo-shell notebook run). It links no engine: the session's engine runs in the session process.
package kernel
