// Package repl is the terminal front-end of the cell interpreter: `halo-shell repl`.
//
// On a terminal it reads Go cells and colon commands with a line editor (golang.org/x/term in
// raw mode while reading: arrows, history, Ctrl-A/E/K/U/W, Tab completion of commands and API
// names), keeps the history across runs in a file, reads more lines while a cell is
// incomplete (open brackets, a trailing operator), evaluates each cell with package cell and
// prints what it wrote, displayed and returned. Ctrl-C at the prompt clears the line; during an
// evaluation it interrupts the cell (never the session). Ctrl-D (or :quit) detaches: the
// session keeps running. When standard input is not a terminal, lines are read as a script and results
// printed, so `echo ':step 2' | halo-shell repl` works.
//
// The package is not the interpreter (package cell) and not the session (package session),
// and it links no engine: the session's engine runs in the session process (session/server).
package repl
