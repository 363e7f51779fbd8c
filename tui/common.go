package tui

import (
	"fmt"
	"log/slog"
	"math"
	"strings"

	"charm.land/lipgloss/v2"
	"github.com/charmbracelet/x/ansi"

	"github.com/halo-shell/halo-shell/tui/keymap"
	"github.com/halo-shell/halo-shell/tui/styles"
)

// Common is what every component shares: its size, the styles, the keymap and a logger.
type Common struct {
	Width, Height int
	Styles        *styles.Styles
	Keys          *keymap.KeyMap
	Logger        *slog.Logger
}

// SetSize sets the component's size (cells).
func (c *Common) SetSize(width, height int) { c.Width, c.Height = width, height }

// Component is a part of the screen. The root model sizes it, then asks for its view, which is
// at most Height lines of at most Width cells (it may be shorter).
type Component interface {
	SetSize(width, height int)
	View() string
}

// clean makes text from the session safe to draw: escape sequences and control characters
// (which could move the cursor or retitle the terminal) are removed, tabs become spaces.
func clean(s string) string {
	s = ansi.Strip(s)
	return strings.Map(func(r rune) rune {
		switch {
		case r == '\t':
			return ' '
		case r < 0x20, r >= 0x7f && r < 0xa0:
			return -1
		}
		return r
	}, s)
}

// fitLines cuts s to at most h lines of at most w cells each.
func fitLines(s string, w, h int) string {
	if h <= 0 || w <= 0 {
		return ""
	}
	lines := strings.Split(s, "\n")
	if len(lines) > h {
		lines = lines[:h]
	}
	for i, l := range lines {
		if ansi.StringWidth(l) > w {
			l = ansi.Truncate(l, w, "…")
		}
		lines[i] = strings.TrimRight(l, " ")
	}
	return strings.Join(lines, "\n")
}

// lineCount is the number of lines of a rendered block ("" has none).
func lineCount(s string) int {
	if s == "" {
		return 0
	}
	return strings.Count(s, "\n") + 1
}

// flow lays items out left to right, separated by sep, wrapping to new lines at width w, and
// keeps at most h lines.
func flow(items []string, sep string, w, h int) string {
	var lines []string
	cur, curW := "", 0
	sepW := lipgloss.Width(sep)
	for _, it := range items {
		iw := lipgloss.Width(it)
		switch {
		case curW == 0:
			cur, curW = it, iw
		case curW+sepW+iw <= w:
			cur += sep + it
			curW += sepW + iw
		default:
			lines = append(lines, cur)
			cur, curW = it, iw
		}
	}
	if curW > 0 {
		lines = append(lines, cur)
	}
	return fitLines(strings.Join(lines, "\n"), w, h)
}

// fmtSI writes x with an SI suffix and three significant digits (12.3k, 1.20M).
func fmtSI(x float64) string {
	if math.IsNaN(x) || math.IsInf(x, 0) {
		return fmt.Sprint(x)
	}
	a := math.Abs(x)
	for _, u := range []struct {
		s string
		v float64
	}{{"T", 1e12}, {"G", 1e9}, {"M", 1e6}, {"k", 1e3}} {
		if a >= u.v {
			return trimFloat(x/u.v) + u.s
		}
	}
	return trimFloat(x)
}

func trimFloat(x float64) string {
	a := math.Abs(x)
	switch {
	case a >= 100:
		return fmt.Sprintf("%.0f", x)
	case a >= 10:
		return fmt.Sprintf("%.1f", x)
	default:
		return fmt.Sprintf("%.2f", x)
	}
}

// fmtSeconds writes a duration given in seconds in a unit that suits it.
func fmtSeconds(s float64) string {
	switch a := math.Abs(s); {
	case a >= 1:
		return fmt.Sprintf("%.2f s", s)
	case a >= 1e-3:
		return fmt.Sprintf("%.1f ms", s*1e3)
	default:
		return fmt.Sprintf("%.0f µs", s*1e6)
	}
}

// fmtBytes writes a byte count in binary units.
func fmtBytes(n float64) string {
	const k = 1024.0
	switch {
	case n >= k*k*k:
		return fmt.Sprintf("%.1f GiB", n/(k*k*k))
	case n >= k*k:
		return fmt.Sprintf("%.1f MiB", n/(k*k))
	case n >= k:
		return fmt.Sprintf("%.1f KiB", n/k)
	default:
		return fmt.Sprintf("%.0f B", n)
	}
}

// fmtLoss writes a loss with four decimals, or what it is when not finite.
func fmtLoss(x float64) string {
	if math.IsNaN(x) || math.IsInf(x, 0) {
		return fmt.Sprint(x)
	}
	return fmt.Sprintf("%.4f", x)
}
