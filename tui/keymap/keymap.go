// Package keymap holds the key bindings of the halo-shell TUI as one struct of named
// bindings, which also feeds the help line.
//
// It says which keys do what; it does not act on them (package tui does).
package keymap

import "charm.land/bubbles/v2/key"

// KeyMap is every binding of the dashboard.
type KeyMap struct {
	// PauseResume pauses a run, resumes a paused one, or starts a run when the session is idle.
	PauseResume key.Binding
	// Step runs one optimizer step.
	Step key.Binding
	// Profile profiles the next three steps and shows their time breakdown.
	Profile key.Binding
	// TakeOver makes this client the controller even when another client is.
	TakeOver key.Binding
	// Help toggles the full help.
	Help key.Binding
	// Detach quits the TUI; the session keeps running.
	Detach key.Binding
}

// Default returns the standard bindings.
func Default() KeyMap {
	return KeyMap{
		PauseResume: key.NewBinding(key.WithKeys("p", "space"), key.WithHelp("p", "pause/resume")),
		Step:        key.NewBinding(key.WithKeys("s"), key.WithHelp("s", "step")),
		Profile:     key.NewBinding(key.WithKeys("f"), key.WithHelp("f", "profile 3 steps")),
		TakeOver:    key.NewBinding(key.WithKeys("t"), key.WithHelp("t", "take control")),
		Help:        key.NewBinding(key.WithKeys("?"), key.WithHelp("?", "help")),
		Detach:      key.NewBinding(key.WithKeys("q", "ctrl+c"), key.WithHelp("q", "detach")),
	}
}

// ShortHelp is the one-line help (help.KeyMap).
func (k KeyMap) ShortHelp() []key.Binding {
	return []key.Binding{k.PauseResume, k.Step, k.Profile, k.TakeOver, k.Help, k.Detach}
}

// FullHelp is the expanded help, in columns (help.KeyMap).
func (k KeyMap) FullHelp() [][]key.Binding {
	return [][]key.Binding{{k.PauseResume, k.Step, k.Profile}, {k.TakeOver, k.Help, k.Detach}}
}
