package tui

import (
	"fmt"
	"math"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/charmbracelet/x/ansi"

	"github.com/halo-shell/halo-shell/session"
	halov1 "github.com/halo-shell/halo-shell/session/proto/halo/v1"
	"github.com/halo-shell/halo-shell/tui/keymap"
	"github.com/halo-shell/halo-shell/tui/styles"
)

func metricsEv(s int64) *session.Event {
	return &session.Event{Kind: &halov1.Event_Metrics{Metrics: metricsAt(s)}}
}

func TestApplyMetricsChartsEachStepOnceInOrder(t *testing.T) {
	for _, tc := range []struct {
		name  string
		steps []int64
		want  []int64
		last  int64
	}{
		{"in order", []int64{1, 2, 3}, []int64{1, 2, 3}, 3},
		{"a repeat from a Step reply", []int64{1, 2, 2, 3}, []int64{1, 2, 3}, 3},
		{"an older step, charted in place", []int64{4, 5, 3}, []int64{3, 4, 5}, 5},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d := &runData{}
			for _, s := range tc.steps {
				d.applyMetrics(metricsAt(s))
			}
			if !slices.Equal(d.steps, tc.want) || len(d.loss) != len(tc.want) || len(d.lr) != len(tc.want) {
				t.Fatalf("history steps %v (loss %d, lr %d points), want %v", d.steps, len(d.loss), len(d.lr), tc.want)
			}
			if d.last.Step != tc.last || d.step != tc.last {
				t.Fatalf("last step %d, header step %d, want %d", d.last.Step, d.step, tc.last)
			}
		})
	}
}

func TestHistoryAndLogsAreBounded(t *testing.T) {
	d := &runData{}
	for s := int64(1); s <= maxHistory+10; s++ {
		d.applyMetrics(metricsAt(s))
	}
	if len(d.steps) != maxHistory || d.steps[0] != 11 || d.steps[maxHistory-1] != maxHistory+10 {
		t.Fatalf("history of %d points from step %d to %d, want the last %d", len(d.steps), d.steps[0], d.steps[len(d.steps)-1], maxHistory)
	}
	for i := range maxLogs + 5 {
		d.addLog(time.Unix(0, 0), "info", fmt.Sprintf("line %d", i))
	}
	if len(d.logs) != maxLogs || d.logs[0].text != "line 5" {
		t.Fatalf("%d log lines starting %q, want the last %d", len(d.logs), d.logs[0].text, maxLogs)
	}
}

func TestStatusStartsTheChartOnlyWhenEmpty(t *testing.T) {
	st := statusAfterScript()
	st.LastMetrics = metricsAt(20)
	d := &runData{}
	d.applyStatus(st, time.Now())
	if !slices.Equal(d.steps, []int64{20}) {
		t.Fatalf("a status on an empty chart: history %v, want [20]", d.steps)
	}
	d = &runData{}
	d.applyMetrics(metricsAt(21))
	d.applyMetrics(metricsAt(22))
	st.LastMetrics = metricsAt(21)
	d.applyStatus(st, time.Now())
	if !slices.Equal(d.steps, []int64{21, 22}) || d.last.Step != 22 {
		t.Fatalf("an older status: history %v, last %d; want [21 22], 22", d.steps, d.last.Step)
	}
}

func TestStateEventsSetTheControllerOnlyWhenTheyCarryIt(t *testing.T) {
	d := &runData{controller: "a"}
	for _, tc := range []struct {
		reason, controller, want string
	}{
		{"running", "", "a"},                     // engine changes carry no controller
		{"control taken by b (repl)", "b", "b"},  // a take-over does
		{"paused", "", "b"},                      // and it sticks
		{"control released by b (repl)", "", ""}, // a release clears it
		{"attached", "c", "c"},                   // the first event of a stream says who
	} {
		d.applyEvent(&session.Event{Kind: &halov1.Event_State{State: &halov1.StateEvent{State: session.StateRunning, Controller: tc.controller, Reason: tc.reason}}})
		if d.controller != tc.want {
			t.Fatalf("after %q the controller is %q, want %q", tc.reason, d.controller, tc.want)
		}
	}
}

func TestDroppedEventsAreCountedAndLogged(t *testing.T) {
	d := &runData{}
	d.applyEvent(&session.Event{Kind: &halov1.Event_Dropped{Dropped: &halov1.DroppedEvent{Count: 7}}})
	d.applyEvent(&session.Event{Kind: &halov1.Event_Dropped{Dropped: &halov1.DroppedEvent{Count: 3}}})
	if d.dropped != 10 || len(d.logs) != 2 || !strings.Contains(d.logs[0].text, "7 events dropped") || d.logs[0].level != "warn" {
		t.Fatalf("dropped %d, logs %+v", d.dropped, d.logs)
	}
}

func TestCellsAddUpToTheWidthInProportion(t *testing.T) {
	for _, tc := range []struct {
		vals  []float64
		width int
		want  []int
	}{
		{[]float64{1, 1}, 10, []int{5, 5}},
		{[]float64{3, 1}, 8, []int{6, 2}},
		{[]float64{1, 1, 1}, 10, []int{4, 3, 3}},
		{[]float64{0.999, 0.001}, 10, []int{10, 0}},
		{[]float64{0, 0}, 10, []int{0, 0}},
		{[]float64{-1, 2}, 4, []int{0, 4}},
		{[]float64{1}, 0, []int{0}},
	} {
		got := cells(tc.vals, tc.width)
		if !slices.Equal(got, tc.want) {
			t.Errorf("cells(%v, %d) = %v, want %v", tc.vals, tc.width, got, tc.want)
		}
	}
}

func TestMeanProfileAveragesEveryPart(t *testing.T) {
	a, b := stepProfile(5), stepProfile(6)
	b.StepS, b.HostS = 0.080, 0.031 // compute 45 ms + all-gather 4 ms + host 31 ms
	b.CommS = map[string]float64{"all_gather": 0.004}
	v := meanProfile([]*session.StepProfile{a, b})
	near := func(x, y float64) bool { return math.Abs(x-y) < 1e-12 }
	if v.label != "steps 5-6 (mean)" || !near(v.stepS, 0.070) || !near(v.hostS, 0.0185) || !near(v.comm["all_gather"], 0.002) ||
		!near(v.comm["all_to_all_dispatch"], 0.002) || !near(v.compute["matmul"], 0.015) ||
		!near(v.compute["expert_gemm"], 0.008) || !near(v.ops, 900) || !near(v.syncs, 14) {
		t.Fatalf("mean %+v", v)
	}
	if !near(v.spanSum(), v.stepS) {
		t.Fatalf("the mean's parts sum to %v, its step to %v", v.spanSum(), v.stepS)
	}
	if meanProfile(nil) != nil {
		t.Fatal("the mean of no steps is not nil")
	}
}

func TestBreakdownFlagsPartsThatDoNotAddUp(t *testing.T) {
	st, km := styles.Default(true), keymap.Default()
	p := stepProfile(3)
	p.HostS = 0 // the parts now cover 90% of the step
	d := &runData{profile: profileFromStep(p)}
	b := breakdown{Common: Common{Width: 100, Height: 4, Styles: &st, Keys: &km}, d: d}
	if s := ansi.Strip(b.View()); !strings.Contains(s, "parts sum to 90% of the step") {
		t.Fatalf("no warning for parts that cover 90%% of the step:\n%s", s)
	}
	d.profile = profileFromStep(stepProfile(3))
	if s := ansi.Strip(b.View()); strings.Contains(s, "parts sum to") {
		t.Fatalf("a warning for parts that add up:\n%s", s)
	}
}

func TestChartSkipsValuesItCannotPlace(t *testing.T) {
	st, km := styles.Default(true), keymap.Default()
	ys := []float64{2, math.NaN(), 1.5, math.Inf(1), 1}
	c := chart{Common: Common{Width: 40, Height: 6, Styles: &st, Keys: &km}, title: func() string { return "loss NaN" },
		series: func() []float64 { return ys }, yfmt: func(v float64) string { return fmt.Sprintf("%6.2f", v) }, color: st.LossSeries}
	s := ansi.Strip(c.View())
	if lines := strings.Split(s, "\n"); len(lines) != 6 || !strings.Contains(s, "2.00") || !strings.Contains(s, "1.00") {
		t.Fatalf("chart of %v:\n%s", ys, s)
	}
	ys = []float64{math.NaN()}
	if s := ansi.Strip(c.View()); !strings.Contains(s, "waiting for the first step") {
		t.Fatalf("chart of only NaN:\n%s", s)
	}
}

func TestFormats(t *testing.T) {
	for _, tc := range []struct{ got, want string }{
		{fmtSI(2150), "2.15k"}, {fmtSI(12_300), "12.3k"}, {fmtSI(45_500), "45.5k"}, {fmtSI(1.2e9), "1.20G"}, {fmtSI(7), "7.00"},
		{fmtSI(math.NaN()), "NaN"}, {fmtSeconds(0.0595), "59.5 ms"}, {fmtSeconds(2.5), "2.50 s"}, {fmtSeconds(42e-6), "42 µs"},
		{fmtLoss(2.34567), "2.3457"}, {fmtLoss(math.Inf(1)), "+Inf"},
	} {
		if tc.got != tc.want {
			t.Errorf("got %q, want %q", tc.got, tc.want)
		}
	}
}

func TestPeakFLOPSOf(t *testing.T) {
	for dev, want := range map[string]float64{"cuda:0 (NVIDIA H200)": 989e12, "NVIDIA H100 80GB HBM3": 989e12, "cuda:1 (NVIDIA A100-SXM4-80GB)": 312e12, "cpu": 0, "": 0} {
		if got := PeakFLOPSOf(dev); got != want {
			t.Errorf("PeakFLOPSOf(%q) = %g, want %g", dev, got, want)
		}
	}
}

func TestMFUUsesTheProfileAndThePeak(t *testing.T) {
	d := &runData{device: "cuda:0 (NVIDIA H200)"}
	m := &Model{d: d}
	s := stats{d: d, peakFLOPS: m.peakFLOPS}
	if got := s.mfu(); got != "– (f to profile)" {
		t.Fatalf("MFU before a profile: %q", got)
	}
	d.profile = &profileView{stepS: 0.5, flops: 989e12 * 0.5 * 0.4}
	if got := s.mfu(); got != "40.0%" {
		t.Fatalf("MFU of a step at 40%% of an H200's peak: %q", got)
	}
	m.opts.PeakFLOPS = 989e12 * 2
	if got := s.mfu(); got != "20.0%" {
		t.Fatalf("MFU against a configured peak twice as high: %q", got)
	}
}

func TestChartsDrawExtremeSeries(t *testing.T) {
	st, km := styles.Default(true), keymap.Default()
	for _, ys := range [][]float64{
		{1e308, -1e308}, {math.MaxFloat64, 0.5}, {1e300, 1e-300}, {5e-324, 0}, {3e-3, 3e-3, 3e-3}, {1e20, 1e20 + 1e5}, {-7},
	} {
		c := chart{Common: Common{Width: 40, Height: 8, Styles: &st, Keys: &km}, title: func() string { return "t" },
			series: func() []float64 { return ys }, yfmt: func(v float64) string { return fmt.Sprintf("%8.2e", v) }, color: st.LossSeries}
		s := ansi.Strip(c.View())
		lines := strings.Split(s, "\n")
		if len(lines) != 8 || !strings.ContainsAny(s, "┼┤") {
			t.Errorf("chart of %v is not an 8-line chart:\n%s", ys, s)
		}
		for _, l := range lines {
			if ansi.StringWidth(l) > 40 {
				t.Errorf("chart of %v has a line wider than 40 cells: %q", ys, l)
			}
		}
	}
}

func TestAStatusOlderThanAnEventKeepsTheEventsState(t *testing.T) {
	d := &runData{}
	asked := time.Now()
	d.applyEvent(&session.Event{Kind: &halov1.Event_State{State: &halov1.StateEvent{State: session.StatePaused, Step: 21}}})
	st := statusAfterScript() // running at step 20, asked before the pause arrived
	d.applyStatus(st, asked)
	if d.state != session.StatePaused || d.step != 21 {
		t.Fatalf("an older status overrode the newer event: %v at step %d", d.state, d.step)
	}
	if d.total != 1000 || d.controller != "repl-client" || d.clientNames["repl-client"] != "repl" {
		t.Fatalf("the status's other fields were not taken: total %d, controller %q, names %v", d.total, d.controller, d.clientNames)
	}
	d.applyStatus(st, time.Now())
	if d.state != session.StateRunning || d.step != 20 {
		t.Fatalf("a newer status was not taken: %v at step %d", d.state, d.step)
	}
}

func TestAnEventWithoutATimeIsStampedOnArrival(t *testing.T) {
	d := &runData{}
	before := time.Now()
	d.applyEvent(&session.Event{Kind: &halov1.Event_Log{Log: &halov1.LogEvent{Level: "info", Message: "attached"}}})
	if at := d.logs[0].at; at.Before(before) || at.After(time.Now()) {
		t.Fatalf("an event without a time is logged at %v, want its arrival", at)
	}
}

func TestANewRunClearsTheCharts(t *testing.T) {
	for _, tc := range []struct {
		name  string
		state *halov1.StateEvent
		clear bool
	}{
		{"a model loaded", &halov1.StateEvent{State: session.StateIdle, Step: 0, Reason: "loaded"}, true},
		{"a new session under the same name", &halov1.StateEvent{State: session.StateIdle, Step: 2, Reason: "attached"}, true},
		{"a pause", &halov1.StateEvent{State: session.StatePaused, Step: 5, Reason: "paused"}, false},
		{"reattached to the same run", &halov1.StateEvent{State: session.StatePaused, Step: 5, Reason: "attached"}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d := &runData{}
			for s := int64(1); s <= 5; s++ {
				d.applyMetrics(metricsAt(s))
			}
			d.applyEvent(&session.Event{Kind: &halov1.Event_Profile{Profile: stepProfile(5)}})
			d.applyEvent(&session.Event{Kind: &halov1.Event_State{State: tc.state}})
			if cleared := len(d.steps) == 0 && d.last == nil && d.profile == nil; cleared != tc.clear {
				t.Fatalf("charts cleared %v, want %v (history %v)", cleared, tc.clear, d.steps)
			}
			d.applyMetrics(metricsAt(tc.state.Step + 1))
			if d.steps[len(d.steps)-1] != tc.state.Step+1 {
				t.Fatalf("the next step %d is not charted: %v", tc.state.Step+1, d.steps)
			}
		})
	}
}

// TestExpertSummary checks the compact expert-load figure: the worst layer by coefficient of
// variation, the dead experts over every layer, the warning when one is dead, and nothing for
// a dense model.
func TestExpertSummary(t *testing.T) {
	for _, tc := range []struct {
		name     string
		in       []*session.ExpertLoad
		want     string
		warn, ok bool
	}{
		{"dense", nil, "", false, false},
		{"even", []*session.ExpertLoad{{Layer: 0, Cv: 0.1}, {Layer: 1, Cv: 0.05}}, "worst cv 0.10 (layer 0), 0 dead", false, true},
		{"dead experts", []*session.ExpertLoad{{Layer: 0, Cv: 0.2, Dead: 1}, {Layer: 2, Cv: 1.5, Dead: 2}, {Layer: 3, Cv: 1.5}}, "worst cv 1.50 (layer 2), 3 dead", true, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			v, warn, ok := expertSummary(tc.in)
			if v != tc.want || warn != tc.warn || ok != tc.ok {
				t.Fatalf("expertSummary = %q, %v, %v; want %q, %v, %v", v, warn, ok, tc.want, tc.warn, tc.ok)
			}
		})
	}
	d := &runData{}
	s := &stats{d: d, peakFLOPS: func() float64 { return 0 }}
	st := styles.Default(true)
	s.Common.Styles = &st
	s.SetSize(200, 3)
	d.applyMetrics(&session.StepMetrics{Step: 1, Loss: 2})
	if v := ansi.Strip(s.View()); strings.Contains(v, "experts") || strings.Contains(v, "aux loss") {
		t.Fatalf("dense step shows MoE figures: %q", v)
	}
	d.applyMetrics(metricsAt(2))
	if v := ansi.Strip(s.View()); !strings.Contains(v, "experts worst cv 1.05 (layer 1), 1 dead") || !strings.Contains(v, "aux loss") {
		t.Fatalf("MoE step lacks its expert load: %q", v)
	}
}

// Steps that arrive out of order (the history sent on attach, after a status reply's last
// metrics) are charted in step order, each once.
func TestOlderStepsAreChartedInOrder(t *testing.T) {
	d := &runData{}
	for _, s := range []int64{10, 3, 5, 3, 11, 10, 4} {
		d.applyMetrics(&session.StepMetrics{Step: s, Loss: float64(s), Lr: float64(s) / 100})
	}
	if want := []int64{3, 4, 5, 10, 11}; !slices.Equal(d.steps, want) || !slices.Equal(d.loss, []float64{3, 4, 5, 10, 11}) || d.last.Step != 11 {
		t.Fatalf("steps %v loss %v last %d, want %v in order and the last step 11", d.steps, d.loss, d.last.Step, want)
	}
	d = &runData{}
	for s := int64(1); s <= maxHistory+1; s++ {
		d.applyMetrics(&session.StepMetrics{Step: s + 10})
	}
	d.applyMetrics(&session.StepMetrics{Step: 5})
	if len(d.steps) != maxHistory || d.steps[0] != 12 {
		t.Fatalf("a full chart took an older step: %d points from step %d", len(d.steps), d.steps[0])
	}
}
