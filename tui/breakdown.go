package tui

import (
	"fmt"
	"image/color"
	"math"
	"slices"
	"sort"
	"strings"

	"charm.land/lipgloss/v2"

	"github.com/halo-shell/halo-shell/internal/profilekeys"
)

// Groups of the breakdown bar, each drawn with its own glyph so that the bar reads without
// colour too.
const (
	groupCompute = iota
	groupComm
	groupIdle
)

var groupGlyph = [...]string{groupCompute: "█", groupComm: "▓", groupIdle: "░"}

// commNames are the display names of the collective kinds.
var commNames = map[string]string{
	profilekeys.CommAllToAllDispatch: "a2a dispatch",
	profilekeys.CommAllToAllCombine:  "a2a combine",
	profilekeys.CommAllGather:        "all-gather",
	profilekeys.CommReduceScatter:    "reduce-scatter",
	profilekeys.CommAllReduce:        "all-reduce",
	profilekeys.CommBroadcast:        "broadcast",
	profilekeys.CommP2P:              "p2p",
}

// segment is one part of a step's time.
type segment struct {
	name  string
	group int
	secs  float64
	color color.Color
}

// segments lists the non-empty parts of p in display order: compute by op class, then each
// collective kind, then host/idle time; kinds profilekeys does not list come after the
// known ones of their group, by name.
func (b *breakdown) segments(p *profileView) []segment {
	var out []segment
	add := func(group int, names []string, m map[string]float64, palette []color.Color, display func(string) string) {
		keys := slices.Clone(names)
		var extra []string
		for k := range m {
			if !slices.Contains(names, k) {
				extra = append(extra, k)
			}
		}
		sort.Strings(extra)
		for i, k := range append(keys, extra...) {
			if v := m[k]; v > 0 && !math.IsNaN(v) && !math.IsInf(v, 0) {
				out = append(out, segment{name: clean(display(k)), group: group, secs: v, color: palette[i%len(palette)]})
			}
		}
	}
	add(groupCompute, profilekeys.Classes, p.compute, b.Styles.Compute, func(k string) string { return strings.ReplaceAll(k, "_", " ") })
	add(groupComm, profilekeys.CommKinds, p.comm, b.Styles.Comm, func(k string) string {
		if n, ok := commNames[k]; ok {
			return n
		}
		return strings.ReplaceAll(k, "_", " ")
	})
	if p.hostS > 0 {
		out = append(out, segment{name: "idle/host", group: groupIdle, secs: p.hostS, color: b.Styles.Idle})
	}
	return out
}

// cells splits width cells among parts in proportion to their values (largest remainder), so
// that the cells add up to width exactly when any value is positive.
func cells(values []float64, width int) []int {
	out := make([]int, len(values))
	total := 0.0
	for _, v := range values {
		total += max(v, 0)
	}
	if total <= 0 || width <= 0 {
		return out
	}
	type rem struct {
		i int
		r float64
	}
	rems := make([]rem, len(values))
	used := 0
	for i, v := range values {
		exact := max(v, 0) / total * float64(width)
		out[i] = int(exact)
		used += out[i]
		rems[i] = rem{i, exact - float64(out[i])}
	}
	sort.SliceStable(rems, func(a, b int) bool { return rems[a].r > rems[b].r })
	for k := 0; used < width; k++ {
		out[rems[k%len(rems)].i]++
		used++
	}
	return out
}

// breakdown is the step-time bar: compute by op class, each collective kind and idle time,
// with a legend.
type breakdown struct {
	Common
	d *runData
}

func (b *breakdown) View() string {
	st := b.Styles
	p := b.d.profile
	if p == nil {
		return fitLines(st.Title.Render("step time")+" "+st.Muted.Render("no profile yet: press "+b.Keys.Profile.Help().Key+" to "+b.Keys.Profile.Help().Desc), b.Width, b.Height)
	}
	segs := b.segments(p)
	var comp, comm, idle float64
	for _, s := range segs {
		switch s.group {
		case groupCompute:
			comp += s.secs
		case groupComm:
			comm += s.secs
		default:
			idle += s.secs
		}
	}
	sum := comp + comm + idle
	pct := func(x float64) string {
		if sum <= 0 {
			return "0%"
		}
		return fmt.Sprintf("%.0f%%", 100*x/sum)
	}
	title := st.Title.Render("step time") + " " + st.Value.Render(fmtSeconds(p.stepS)) + st.Muted.Render(" "+p.label+": ") +
		st.Label.Render("compute ") + st.Value.Render(pct(comp)) + st.Label.Render("  comm ") + st.Value.Render(pct(comm)) +
		st.Label.Render("  idle ") + st.Value.Render(pct(idle))
	if p.stepS > 0 && math.Abs(sum-p.stepS) > 0.05*p.stepS {
		title += st.Error.Render(fmt.Sprintf("  parts sum to %.0f%% of the step", 100*sum/p.stepS))
	}
	lines := []string{title}
	if b.Height >= 2 {
		vals := make([]float64, len(segs))
		for i, s := range segs {
			vals[i] = s.secs
		}
		var bar strings.Builder
		for i, n := range cells(vals, b.Width) {
			if n > 0 {
				bar.WriteString(lipgloss.NewStyle().Foreground(segs[i].color).Render(strings.Repeat(groupGlyph[segs[i].group], n)))
			}
		}
		lines = append(lines, bar.String())
	}
	if b.Height >= 3 {
		var items []string
		for _, s := range segs {
			if sum > 0 && s.secs/sum < 0.005 {
				continue // it would read 0%; the bar has no cell for it either
			}
			items = append(items, lipgloss.NewStyle().Foreground(s.color).Render(groupGlyph[s.group])+" "+st.Label.Render(s.name)+" "+st.Value.Render(pct(s.secs)))
		}
		lines = append(lines, flow(items, "  ", b.Width, b.Height-2))
	}
	return fitLines(strings.Join(lines, "\n"), b.Width, b.Height)
}
