// Package boundary holds no code: its test keeps the module's dependency direction, cmd ->
// front ends (tui, repl, kernel, cell) -> session (client) ... session/server -> engine, by
// running `go list -deps` on the packages and failing when one links what it must not.
//
// The front ends and the session client link no engine package: what they need from the
// engine travels in session/proto or lives in a leaf under internal/ that both sides use
// (internal/layoutspec, internal/profilekeys). Nothing in engine/ links session/ or a front
// end. cmd/halo-shell links both sides, and so do the front ends' tests, which start a real
// session server in process.
package boundary
