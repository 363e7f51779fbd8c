// Package tui is the halo-shell dashboard: a bubbletea program attached to a live engine
// session that shows the run (loss and learning-rate charts, tokens/s, MFU, memory per device,
// a step-time breakdown by op class and collective kind, the session's log) and drives it with
// single keys (pause/resume, step, profile, take control, detach).
//
// The program follows the Elm architecture. Model is the root; it owns the run's data (runData)
// and a handful of components (header, charts, stats, breakdown, logs, footer) that share one
// Common (size, styles, keymap, logger) and render from that data. Session events reach the
// program one message at a time from a channel (waitEvent); control calls run as commands in
// their own goroutines and come back as messages. Everything the model needs from a session
// is the Controller interface, which *session.Client satisfies, so the model is tested with
// scripted events and without a live session.
//
// The package is not the session (package session) and it never stops one: detaching (q)
// ends only the TUI, giving up control if it held it.
package tui
