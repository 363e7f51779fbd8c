// Package styles holds the look of the halo-shell TUI: one Styles struct of named lipgloss
// styles and colours, so that components never build styles of their own.
//
// It is not the layout (package tui decides sizes) and it holds no state.
package styles

import (
	"image/color"

	"charm.land/bubbles/v2/help"
	"charm.land/lipgloss/v2"
)

// Styles are the named styles of every part of the dashboard.
type Styles struct {
	// Header is the top line; App names the program in it.
	Header, App lipgloss.Style
	// State styles the session state word by state.
	StateRunning, StatePaused, StateIdle, StateOther lipgloss.Style
	// Role styles "controller" and "observer".
	Controller, Observer lipgloss.Style

	// Title is a panel's title; Value a figure; Label the word before a figure; Muted is
	// text of lesser weight (units, hints).
	Title, Value, Label, Muted lipgloss.Style

	// LossSeries and LRSeries colour the two charts.
	LossSeries, LRSeries color.Color

	// Compute colours the op classes of the breakdown bar, in order (cycled when there are
	// more classes than colours); Comm colours the collective kinds; Idle is host time.
	Compute []color.Color
	Comm    []color.Color
	Idle    color.Color

	// LogInfo, LogWarn, LogError style log lines by level; LogTime the time stamp.
	LogInfo, LogWarn, LogError, LogTime lipgloss.Style

	// Notice is the status line after an action; Error the status line after a failure.
	Notice, Error lipgloss.Style

	// Help styles the key help.
	Help help.Styles
}

// Default returns the dashboard's styles for a dark or light terminal background.
func Default(isDark bool) Styles {
	ld := lipgloss.LightDark(isDark)
	fg := ld(lipgloss.Color("#1F1F1F"), lipgloss.Color("#E6E6E6"))
	muted := ld(lipgloss.Color("#6C6C6C"), lipgloss.Color("#8A8A8A"))
	accent := lipgloss.Color("#7D56F4")
	return Styles{
		Header:       lipgloss.NewStyle().Foreground(fg),
		App:          lipgloss.NewStyle().Bold(true).Foreground(accent),
		StateRunning: lipgloss.NewStyle().Bold(true).Foreground(lipgloss.Color("#3FB950")),
		StatePaused:  lipgloss.NewStyle().Bold(true).Foreground(lipgloss.Color("#D29922")),
		StateIdle:    lipgloss.NewStyle().Bold(true).Foreground(lipgloss.Color("#58A6FF")),
		StateOther:   lipgloss.NewStyle().Bold(true).Foreground(muted),
		Controller:   lipgloss.NewStyle().Foreground(lipgloss.Color("#3FB950")),
		Observer:     lipgloss.NewStyle().Foreground(muted),
		Title:        lipgloss.NewStyle().Bold(true).Foreground(accent),
		Value:        lipgloss.NewStyle().Bold(true).Foreground(fg),
		Label:        lipgloss.NewStyle().Foreground(muted),
		Muted:        lipgloss.NewStyle().Foreground(muted),
		LossSeries:   lipgloss.Color("#F778BA"),
		LRSeries:     lipgloss.Color("#58A6FF"),
		Compute: []color.Color{
			lipgloss.Color("#3FB950"), lipgloss.Color("#2EA043"), lipgloss.Color("#56D364"),
			lipgloss.Color("#7EE787"), lipgloss.Color("#238636"), lipgloss.Color("#A5D6A7"),
			lipgloss.Color("#196C2E"), lipgloss.Color("#8DDB8C"), lipgloss.Color("#4C9A52"),
		},
		Comm: []color.Color{
			lipgloss.Color("#F0883E"), lipgloss.Color("#DB6D28"), lipgloss.Color("#58A6FF"),
			lipgloss.Color("#1F6FEB"), lipgloss.Color("#BC8CFF"), lipgloss.Color("#D2A8FF"),
			lipgloss.Color("#FF7B72"),
		},
		Idle:     muted,
		LogInfo:  lipgloss.NewStyle().Foreground(fg),
		LogWarn:  lipgloss.NewStyle().Foreground(lipgloss.Color("#D29922")),
		LogError: lipgloss.NewStyle().Foreground(lipgloss.Color("#F85149")),
		LogTime:  lipgloss.NewStyle().Foreground(muted),
		Notice:   lipgloss.NewStyle().Foreground(lipgloss.Color("#58A6FF")),
		Error:    lipgloss.NewStyle().Bold(true).Foreground(lipgloss.Color("#F85149")),
		Help:     help.DefaultStyles(isDark),
	}
}
