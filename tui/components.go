package tui

import (
	"fmt"
	"image/color"
	"math"
	"slices"
	"strings"
	"time"

	"charm.land/lipgloss/v2"
	"github.com/guptarohit/asciigraph"

	"github.com/halo-shell/halo-shell/session"
)

// header is the top line: program, session, state, step, device and this client's role.
type header struct {
	Common
	d *runData
}

func (h *header) View() string {
	s, d := h.Styles, h.d
	word, st := stateWord(d.state), s.StateOther
	switch {
	case !d.connected:
		word = "disconnected"
	case d.state == stateRunning:
		st = s.StateRunning
	case d.state == statePaused:
		st = s.StatePaused
	case d.state == stateIdle:
		st = s.StateIdle
	}
	step := fmt.Sprintf("step %d", d.step)
	if d.total > 0 {
		step += fmt.Sprintf("/%d", d.total)
	}
	role, short := s.Observer.Render("observer, no controller"), s.Observer.Render("observer")
	switch {
	case d.isController():
		role = s.Controller.Render("controller (you)")
		short = role
	case d.controller != "":
		role = s.Observer.Render("observer, controller " + d.controllerName())
	}
	app := s.App.Render("halo-shell")
	name, shortName := "", ""
	if d.name != "" {
		name, shortName = s.Label.Render("session ")+s.Value.Render(d.name), s.Value.Render(d.name)
	}
	dev := ""
	if d.device != "" {
		dev = s.Label.Render(d.device)
	}
	state, stepV := st.Render(word), s.Value.Render(step)
	// The widest variant that fits; later ones drop the least useful parts first.
	variants := [][]string{
		{app, name, state, stepV, dev, role},
		{name, state, stepV, dev, role},
		{shortName, state, stepV, dev, role},
		{shortName, state, stepV, role},
		{shortName, state, stepV, short},
		{state, stepV, short},
	}
	sep := s.Muted.Render(" │ ")
	var line string
	for _, v := range variants {
		var parts []string
		for _, p := range v {
			if p != "" {
				parts = append(parts, p)
			}
		}
		line = strings.Join(parts, sep)
		if lipgloss.Width(line) <= h.Width {
			break
		}
	}
	return fitLines(line, h.Width, 1)
}

// chart is a line chart of one series with a title line.
type chart struct {
	Common
	title  func() string    // the title line (already styled)
	series func() []float64 // the values to plot, oldest first
	// yaxis formats the y labels for the plotted range; when nil, yfmt formats every label.
	yaxis axisFormat
	yfmt  func(float64) string
	color color.Color
}

// axisFormat returns the label format of a y axis from lo to hi with labels labels, evenly
// spaced; flat says the series is constant (its range was widened only to draw it).
type axisFormat func(lo, hi float64, labels int, flat bool) func(float64) string

// labelStep is the value between two adjacent labels of an axis (0 for a flat series).
func labelStep(lo, hi float64, labels int, flat bool) float64 {
	if flat || labels < 2 {
		return 0
	}
	return (hi - lo) / float64(labels-1)
}

// fixedAxis labels with at least minDecimals decimals and as many more as adjacent labels need
// to differ (at most 8).
func fixedAxis(width, minDecimals int) axisFormat {
	return func(lo, hi float64, labels int, flat bool) func(float64) string {
		dec := minDecimals
		step := labelStep(lo, hi, labels, flat)
		if step > 0 {
			dec = min(max(dec, int(math.Ceil(-math.Log10(step)))), 8)
		}
		return func(v float64) string { return fmt.Sprintf("%*.*f", width, dec, snapZero(v, step)) }
	}
}

// snapZero returns 0 for a label value that is zero but for rounding in the axis arithmetic
// (lo + i·step), so that it does not read -4.34e-19 or -0.000.
func snapZero(v, step float64) float64 {
	if math.Abs(v) < step*1e-6 || v == 0 {
		return 0
	}
	return v
}

// sciAxis labels in scientific notation with at least minDigits significant digits and as
// many more as adjacent labels need to differ (at most 8): a learning rate that moves from
// 3.00e-3 to 2.97e-3 gets labels 3.000e-03, 2.995e-03, ... rather than equal ones.
func sciAxis(minDigits int) axisFormat {
	return func(lo, hi float64, labels int, flat bool) func(float64) string {
		digits := minDigits
		mag := max(math.Abs(lo), math.Abs(hi))
		step := labelStep(lo, hi, labels, flat)
		if step > 0 && mag > 0 {
			digits = min(max(digits, int(math.Ceil(math.Log10(mag/step)))+1), 8)
		}
		return func(v float64) string { return fmt.Sprintf("%.*e", digits-1, snapZero(v, step)) }
	}
}

func (c *chart) View() string {
	if c.Height <= 0 || c.Width <= 0 {
		return ""
	}
	lines := []string{c.title()}
	if rows := c.Height - 1; rows > 0 {
		ys := finite(c.series())
		if len(ys) == 0 {
			lines = append(lines, c.Styles.Muted.Render("waiting for the first step"))
		} else {
			lines = append(lines, c.plot(ys, rows)...)
		}
	}
	for len(lines) < c.Height {
		lines = append(lines, "")
	}
	return fitLines(strings.Join(lines, "\n"), c.Width, c.Height)
}

// plot draws ys in rows lines of at most c.Width cells.
func (c *chart) plot(ys []float64, rows int) []string {
	if rows < 2 {
		return nil // too short for a chart; the title still gives the value
	}
	flat := slices.Min(ys) == slices.Max(ys)
	ys, lo, hi := plotRange(ys)
	yfmt := c.yfmt
	if c.yaxis != nil {
		// asciigraph draws rows labels, evenly spaced from hi down to lo.
		yfmt = c.yaxis(lo, hi, rows, flat)
	}
	// asciigraph draws height+1 rows; the y labels take some of the width, so fit in passes.
	w := c.Width - 10
	var out []string
	for range 3 {
		if w < 2 {
			w = 2
		}
		g := asciigraph.Plot(ys, asciigraph.Height(rows-1), asciigraph.Width(w), asciigraph.LowerBound(lo),
			asciigraph.UpperBound(hi), asciigraph.YAxisValueFormatter(yfmt))
		out = strings.Split(g, "\n")
		over := 0
		for _, l := range out {
			over = max(over, lipgloss.Width(l)-c.Width)
		}
		if over <= 0 {
			break
		}
		w -= over
	}
	st := lipgloss.NewStyle().Foreground(c.color)
	for i, l := range out {
		out[i] = st.Render(l)
	}
	if len(out) > rows {
		out = out[:rows]
	}
	return out
}

// plotLimit bounds the magnitude of plotted values: beyond it a chart says nothing useful, and
// asciigraph's row arithmetic overflows.
const plotLimit = 1e12

// plotRange prepares ys for asciigraph: values are clamped to ±plotLimit, and a range too
// narrow for its magnitude (a flat series) is widened, so that the scale stays finite and
// value/range fits an int.
func plotRange(ys []float64) (out []float64, lo, hi float64) {
	out = make([]float64, len(ys))
	lo, hi = math.Inf(1), math.Inf(-1)
	for i, y := range ys {
		y = min(max(y, -plotLimit), plotLimit)
		out[i] = y
		lo, hi = min(lo, y), max(hi, y)
	}
	if len(out) == 1 {
		out = append(out, out[0])
	}
	mag := max(math.Abs(lo), math.Abs(hi))
	if pad := max(mag*1e-6, 1e-9); hi-lo < 2*pad {
		mid := lo + (hi-lo)/2
		lo, hi = mid-pad, mid+pad
	}
	return out, lo, hi
}

// stats are the run's figures: loss, throughput, MFU, step time, gradient norm, lr, tokens.
type stats struct {
	Common
	d         *runData
	peakFLOPS func() float64 // the device's peak FLOP/s, 0 when unknown
}

func (s *stats) View() string {
	st, d := s.Styles, s.d
	item := func(label, value string) string { return st.Label.Render(label+" ") + st.Value.Render(value) }
	var items []string
	if m := d.last; m != nil {
		items = append(items,
			item("loss", fmtLoss(m.Loss)),
			item("tok/s", fmtSI(m.TokensPerS)),
			item("MFU", s.mfu()),
			item("step", fmtSeconds(m.StepTimeS)),
			item("grad norm", trimFloat(m.GradNorm)))
		if v, warn, ok := expertSummary(m.GetExpertLoad()); ok {
			// Before the less telling figures, so that narrow screens keep it.
			vs := st.Value
			if warn {
				vs = st.LogWarn
			}
			items = append(items, st.Label.Render("experts ")+vs.Render(v))
		}
		items = append(items,
			item("lr", fmt.Sprintf("%.2e", m.Lr)),
			item("tokens", fmtSI(float64(m.Tokens))))
		if m.EvalLoss != nil {
			items = append(items, item("eval loss", fmtLoss(*m.EvalLoss)))
		}
		if m.AuxLoss != nil {
			items = append(items, item("aux loss", fmtLoss(*m.AuxLoss)))
		}
		for _, dm := range m.GetMemory() {
			v := fmtBytes(float64(dm.GetAllocatedBytes())) + " (peak " + fmtBytes(float64(dm.GetPeakBytes()))
			if t := dm.GetTotalBytes(); t > 0 {
				v += " of " + fmtBytes(float64(t))
			}
			items = append(items, item("mem "+dm.GetDevice(), v+")"))
		}
	} else {
		items = append(items, st.Muted.Render("no step metrics yet"))
	}
	if p := d.profile; p != nil && p.stepS > 0 && p.flops > 0 {
		items = append(items, item("FLOP/s", fmtSI(p.flops/p.stepS)))
	}
	if p := d.profile; p != nil && p.ops > 0 {
		// The host's part: ops it queued and the times it waited for the device.
		items = append(items, item("ops/syncs", fmt.Sprintf("%.0f/%.0f", p.ops, p.syncs)))
	}
	return flow(items, st.Muted.Render("  "), s.Width, s.Height)
}

// expertSummary is the compact expert-load figure of a MoE step: the worst layer's
// coefficient of variation (the first on ties) and the dead experts over all layers. warn is
// set when some expert got no token; ok is false for dense models.
func expertSummary(ls []*session.ExpertLoad) (v string, warn, ok bool) {
	if len(ls) == 0 {
		return "", false, false
	}
	w, dead := ls[0], int64(0)
	for _, l := range ls {
		if l.GetCv() > w.GetCv() || math.IsNaN(w.GetCv()) {
			w = l
		}
		dead += int64(l.GetDead())
	}
	return fmt.Sprintf("worst cv %.2f (layer %d), %d dead", w.GetCv(), w.GetLayer(), dead), dead > 0, true
}

// mfu is model FLOPs utilisation: the last step's model FLOPs per second (6·N·tokens plus
// attention, as the session counts them) over the device's peak, or the newest profile's when
// the step carries no FLOP count.
func (s *stats) mfu() string {
	p := s.d.profile
	peak := s.peakFLOPS()
	if m := s.d.last; m != nil && m.GetTflops() > 0 {
		if peak <= 0 {
			return "– (peak unknown)"
		}
		return fmt.Sprintf("%.1f%%", 100*m.GetTflops()*1e12/peak)
	}
	switch {
	case p == nil || p.stepS <= 0 || p.flops <= 0:
		return "– (f to profile)"
	case peak <= 0:
		return "– (peak unknown)"
	}
	return fmt.Sprintf("%.1f%%", 100*p.flops/p.stepS/peak)
}

// logs is the tail of the session's log.
type logs struct {
	Common
	d   *runData
	loc *time.Location
}

func (l *logs) View() string {
	if l.Height <= 0 {
		return ""
	}
	st := l.Styles
	lines := []string{st.Title.Render("log")}
	n := l.Height - 1
	from := max(len(l.d.logs)-n, 0)
	for _, e := range l.d.logs[from:] {
		ls := st.LogInfo
		switch e.level {
		case "warn", "warning":
			ls = st.LogWarn
		case "error":
			ls = st.LogError
		}
		lines = append(lines, st.LogTime.Render(e.at.In(l.loc).Format("15:04:05"))+" "+ls.Render(e.text))
	}
	return fitLines(strings.Join(lines, "\n"), l.Width, l.Height)
}
