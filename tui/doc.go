// Package tui is the halo-shell dashboard: a bubbletea program attached to a live engine
// session that shows the run (header with session, state, step and this client's role; loss and
// learning-rate charts; tokens/s, step time, gradient norm; MFU and FLOP/s from the newest
// profile; a step-time breakdown bar by op class, by collective kind and idle, with a legend;
// the session's log) and drives it with single keys: p pause/resume (run when idle), s step,
// f profile 3 steps, t take control, ? help, q detach.
//
// Memory per device (allocated, peak, capacity) comes from each step's metrics; MFU from the step's model
// FLOPs over the device's peak (or from the newest profile).
//
// The program follows the Elm architecture. Model is the root; it owns the run's data (runData)
// and a handful of components (header, charts, stats, breakdown, logs) that share one
// Common (size, styles, keymap, logger) and render from that data. Session events reach the
// program one message at a time from a channel (waitEvent); control calls run as commands in
// their own goroutines and come back as messages. Everything the model needs from a session
// is the Controller interface, which *session.Client satisfies, so the model is tested with
// scripted events and without a live session. A burst of events is drawn at most every 50 ms;
// keys, resizes and replies are drawn at once.
//
// Golden screens (plain text) live in testdata/TestGoldenScreens; after a deliberate change of
// the layout, regenerate them with `go test ./tui -run TestGoldenScreens -update` and review
// the diff.
//
// The package is not the session (package session) and it never stops one: detaching (q)
// ends only the TUI, giving up control if it held it. It links no engine: the breakdown bar
// takes the names and order of op classes and collective kinds from internal/profilekeys.
package tui
