package halo

import (
	"encoding/json"
	"fmt"
	"html"
	"math"
	"sort"
	"strconv"
	"strings"

	"github.com/halo-shell/halo-shell/session"
)

// Error is the panic value of a failed API call.
type Error struct {
	Op  string // the API function, e.g. "halo.Step"
	Err error
}

func (e *Error) Error() string { return e.Op + ": " + e.Err.Error() }

// Unwrap returns the underlying error.
func (e *Error) Unwrap() error { return e.Err }

func fail(op string, err error) {
	panic(&Error{Op: op, Err: err})
}

// Bundle is a MIME bundle: representations of one value keyed by MIME type ("text/plain",
// "image/png", "image/svg+xml", "text/html"). It always holds text/plain.
type Bundle map[string][]byte

// Displayer is a value with rich representations.
type Displayer interface {
	Bundle() Bundle
}

// StepMetrics are the metrics of one optimizer step.
type StepMetrics struct {
	Step       int64
	Loss       float64
	GradNorm   float64
	LR         float64
	Tokens     int64
	TokensPerS float64
	StepTime   float64 // seconds
	EvalLoss   float64 // NaN when the step did not evaluate
	AuxLoss    float64 // MoE load-balancing loss (unweighted); NaN for dense models
	// ExpertLoad is the routing load of each MoE layer over the whole step (nil for dense
	// models).
	ExpertLoad []LayerLoad
	// ModelFLOPs is the step's model FLOPs by the formula the session counts with (6 per
	// parameter a token uses and per token, plus causal attention), TFLOPS those per second
	// of step time.
	ModelFLOPs, TFLOPS float64
	// Memory is each device's memory during the step (one entry per rank on a parallel
	// layout): Peak is the step's own high-water mark.
	Memory []DeviceMemory
	// Method holds the training method's own metrics under TRL's names (GRPO: "reward",
	// "rewards/NAME/mean", "kl", "completions/mean_length", ...); nil for pretrain and sft.
	Method map[string]float64
}

// DeviceMemory is one device's memory in a step, in bytes.
type DeviceMemory struct {
	Device                    string // e.g. cpu, cuda:0, "cpu rank 1" on a layout
	Allocated, Reserved, Peak int64  // live after the step; held by the allocator; high-water mark of the step
	Total                     int64  // capacity, 0 when unknown
}

func (m StepMetrics) String() string {
	s := fmt.Sprintf("step %d  loss %.4f  grad_norm %.3f  lr %.3g  tok/s %.0f  %.3fs", m.Step, m.Loss, m.GradNorm, m.LR, m.TokensPerS, m.StepTime)
	if !math.IsNaN(m.EvalLoss) {
		s += fmt.Sprintf("  eval_loss %.4f", m.EvalLoss)
	}
	if !math.IsNaN(m.AuxLoss) {
		s += fmt.Sprintf("  aux %.4f", m.AuxLoss)
	}
	if w, ok := WorstLayer(m.ExpertLoad); ok {
		s += fmt.Sprintf("  experts: worst cv %.2f (layer %d)  dead %d", w.CV, w.Layer, DeadExperts(m.ExpertLoad))
	}
	if v, ok := m.Method["reward"]; ok {
		s += fmt.Sprintf("  reward %.3f", v)
	}
	if v, ok := m.Method["kl"]; ok {
		s += fmt.Sprintf("  kl %.4f", v)
	}
	return s
}

// LayerLoad is the routing load of one mixture-of-experts layer over one optimizer step.
type LayerLoad struct {
	Layer  int     // decoder layer index
	Tokens []int64 // tokens routed to each expert (once per expert among a token's top-k)
	Max    int64   // largest entry of Tokens
	Min    int64   // smallest entry of Tokens
	CV     float64 // coefficient of variation of Tokens (population std / mean)
	Dead   int     // experts that received no token
}

func (l LayerLoad) String() string {
	return fmt.Sprintf("layer %d  cv %.3f  max %d  min %d  dead %d  tokens %v", l.Layer, l.CV, l.Max, l.Min, l.Dead, l.Tokens)
}

// WorstLayer returns the layer with the largest coefficient of variation (the first on ties)
// and false when there is none (dense models).
func WorstLayer(ls []LayerLoad) (LayerLoad, bool) {
	if len(ls) == 0 {
		return LayerLoad{}, false
	}
	w := ls[0]
	for _, l := range ls[1:] {
		if l.CV > w.CV {
			w = l
		}
	}
	return w, true
}

// DeadExperts is the number of (layer, expert) pairs that received no token.
func DeadExperts(ls []LayerLoad) int {
	n := 0
	for _, l := range ls {
		n += l.Dead
	}
	return n
}

func metricsOf(m *session.StepMetrics) StepMetrics {
	out := StepMetrics{Step: m.Step, Loss: m.Loss, GradNorm: m.GradNorm, LR: m.Lr, Tokens: m.Tokens,
		TokensPerS: m.TokensPerS, StepTime: m.StepTimeS, EvalLoss: math.NaN(), AuxLoss: math.NaN(),
		ModelFLOPs: m.ModelFlops, TFLOPS: m.Tflops}
	for _, d := range m.Memory {
		out.Memory = append(out.Memory, DeviceMemory{Device: d.Device, Allocated: d.AllocatedBytes, Reserved: d.ReservedBytes,
			Peak: d.PeakBytes, Total: d.TotalBytes})
	}
	if m.EvalLoss != nil {
		out.EvalLoss = *m.EvalLoss
	}
	if m.AuxLoss != nil {
		out.AuxLoss = *m.AuxLoss
	}
	if len(m.Method) > 0 {
		out.Method = make(map[string]float64, len(m.Method))
		for k, v := range m.Method {
			out.Method[k] = v
		}
	}
	for _, l := range m.ExpertLoad {
		out.ExpertLoad = append(out.ExpertLoad, LayerLoad{Layer: int(l.Layer), Tokens: append([]int64(nil), l.Tokens...),
			Max: l.Max, Min: l.Min, CV: l.Cv, Dead: int(l.Dead)})
	}
	return out
}

func metricsList(ms []*session.StepMetrics) []StepMetrics {
	out := make([]StepMetrics, 0, len(ms))
	for _, m := range ms {
		if m != nil {
			out = append(out, metricsOf(m))
		}
	}
	return out
}

// Hyperparams are the hyperparameters the next step uses.
type Hyperparams struct {
	LearningRate  float64
	Scheduler     string
	WeightDecay   float64
	Beta1, Beta2  float64
	Epsilon       float64
	MaxGradNorm   float64
	GradientAccum int
}

func (h Hyperparams) String() string {
	return fmt.Sprintf("lr=%g lr_scheduler_type=%s weight_decay=%g adam_beta1=%g adam_beta2=%g adam_epsilon=%g max_grad_norm=%g gradient_accumulation_steps=%d",
		h.LearningRate, h.Scheduler, h.WeightDecay, h.Beta1, h.Beta2, h.Epsilon, h.MaxGradNorm, h.GradientAccum)
}

func hyperOf(h *session.Hyper) Hyperparams {
	if h == nil {
		return Hyperparams{}
	}
	return Hyperparams{LearningRate: h.LearningRate, Scheduler: h.LrSchedulerType, WeightDecay: h.WeightDecay,
		Beta1: h.AdamBeta1, Beta2: h.AdamBeta2, Epsilon: h.AdamEpsilon, MaxGradNorm: h.MaxGradNorm,
		GradientAccum: int(h.GradientAccumulationSteps)}
}

// SessionStatus describes the attached session.
type SessionStatus struct {
	Name       string
	State      string // empty, idle, running, paused, stopping
	Step       int64
	TotalSteps int64
	Config     string
	Controller string // client id of the controller; empty when none
	Clients    int
	Pid        int64
	Device     string
	LastError  string
	Hyper      Hyperparams
	Last       *StepMetrics // metrics of the last step, nil before the first
	Layout     string       // parallel layout of the next step, e.g. "dp=2 fsdp tp=2 cp=1 ep=1 etp=1"
	Devices    string       // its devices, e.g. "cpu:4"
}

func stateName(s session.State) string {
	n := strings.ToLower(strings.TrimPrefix(s.String(), "STATE_"))
	if n == "unspecified" {
		return "unknown"
	}
	return n
}

func statusOf(st *session.StatusResponse) SessionStatus {
	out := SessionStatus{Name: st.Name, State: stateName(st.State), Step: st.Step, TotalSteps: st.TotalSteps,
		Config: st.ConfigSummary, Controller: st.Controller, Clients: len(st.Clients), Pid: st.Pid,
		Device: st.Device, LastError: st.LastError, Hyper: hyperOf(st.Hyper), Layout: st.Layout, Devices: st.Devices}
	if st.LastMetrics != nil {
		m := metricsOf(st.LastMetrics)
		out.Last = &m
	}
	return out
}

func (s SessionStatus) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "session %s (pid %d, %s): %s, step %d/%d, %d client(s)", s.Name, s.Pid, s.Device, s.State, s.Step, s.TotalSteps, s.Clients)
	if s.Config != "" {
		fmt.Fprintf(&b, "\n  %s", strings.ReplaceAll(strings.TrimSpace(s.Config), "\n", "\n  "))
	}
	if s.Last != nil {
		fmt.Fprintf(&b, "\n  last: %s", s.Last)
	}
	if s.State != "empty" {
		fmt.Fprintf(&b, "\n  hyper: %s", s.Hyper)
		if s.Layout != "" {
			fmt.Fprintf(&b, "\n  layout: %s on %s", s.Layout, s.Devices)
		}
	}
	if s.LastError != "" {
		fmt.Fprintf(&b, "\n  last error: %s", s.LastError)
	}
	return b.String()
}

// LayoutInfo is a run's parallel layout: what halo.Layout shows or changed to.
type LayoutInfo struct {
	Layout   string  // the layout in force, e.g. "dp=2 fsdp tp=2 cp=1 ep=1 etp=1"
	Devices  string  // its devices, e.g. "cpu:4"
	Previous string  // the layout before a change; empty when only shown
	Seconds  float64 // how long the change took (parameters and optimizer state moved in memory)
	Step     int64   // the step boundary of the change, or the steps done when shown
}

func (l LayoutInfo) String() string {
	if l.Previous == "" {
		return fmt.Sprintf("layout %s on %s (step %d)", l.Layout, l.Devices, l.Step)
	}
	return fmt.Sprintf("layout %s on %s from step %d (was %s; moved in %.3f s)", l.Layout, l.Devices, l.Step+1, l.Previous, l.Seconds)
}

// TensorStats are statistics of one parameter, gradient or activation.
type TensorStats struct {
	Name   string
	Kind   string // param, grad or activation
	Shape  []int
	Layer  int // -1 when not in a layer
	Mean   float64
	Std    float64
	RMS    float64
	MaxAbs float64
	NaN    int64
	Inf    int64
}

func statsOf(s *session.TensorStats) TensorStats {
	shape := make([]int, len(s.Shape))
	for i, d := range s.Shape {
		shape[i] = int(d)
	}
	return TensorStats{Name: s.Name, Kind: s.Kind, Shape: shape, Layer: int(s.Layer), Mean: s.Mean, Std: s.Std,
		RMS: s.Rms, MaxAbs: s.MaxAbs, NaN: s.Nan, Inf: s.Inf}
}

func (s TensorStats) String() string {
	return fmt.Sprintf("%s %s %v mean %.4g std %.4g rms %.4g max|x| %.4g nan %d inf %d", s.Kind, s.Name, s.Shape, s.Mean, s.Std, s.RMS, s.MaxAbs, s.NaN, s.Inf)
}

// Tensor is a host copy of one tensor's values (float32, row-major) with its statistics.
type Tensor struct {
	TensorStats
	Step int64 // the step after which it was read
	Data []float32
}

// At returns the element at the given indices (one per dimension).
func (t Tensor) At(idx ...int) float32 {
	if len(idx) != len(t.Shape) {
		fail("Tensor.At", fmt.Errorf("tensor %q has %d dimensions, got %d indices", t.Name, len(t.Shape), len(idx)))
	}
	off := 0
	for i, x := range idx {
		if x < 0 || x >= t.Shape[i] {
			fail("Tensor.At", fmt.Errorf("tensor %q: index %d of dimension %d is out of range [0,%d)", t.Name, x, i, t.Shape[i]))
		}
		off = off*t.Shape[i] + x
	}
	return t.Data[off]
}

func (t Tensor) String() string {
	const show = 8
	var b strings.Builder
	fmt.Fprintf(&b, "%s (step %d)\n  [", t.TensorStats, t.Step)
	for i, v := range t.Data {
		if i == show {
			fmt.Fprintf(&b, " ... (%d values)", len(t.Data))
			break
		}
		if i > 0 {
			b.WriteByte(' ')
		}
		b.WriteString(strconv.FormatFloat(float64(v), 'g', 5, 32))
	}
	b.WriteByte(']')
	return b.String()
}

// StepProfile is where the time of one profiled step went, in seconds. Compute (by op class),
// Comm (by collective kind) and Host add up to StepTime.
type StepProfile struct {
	Step     int64
	StepTime float64
	Compute  map[string]float64
	Comm     map[string]float64
	Host     float64
	Ops      int64
	// Syncs counts the host's waits for the device in the step (summed over devices, like Ops).
	Syncs int64
	FLOPs float64
	Bytes float64
	// CommBytes is the bytes of each device's operands in the step's collectives, by kind
	// (what one device contributes; a mean over devices; empty on one device).
	CommBytes map[string]float64
	// Metrics are the step's own metrics (tokens, model FLOPs, ...).
	Metrics StepMetrics
}

// ProfileReport is the result of profiling some steps.
type ProfileReport struct {
	Steps []StepProfile
	Trace []byte // Chrome/Perfetto trace JSON when asked for
}

// Table is the breakdown as a table: one row per category (compute/op class, comm/kind, host)
// with mean seconds per step and share of the step time, plus a total row.
func (p ProfileReport) Table() Table {
	t := Table{Title: fmt.Sprintf("profile of %d step(s)", len(p.Steps)), Header: []string{"category", "mean s/step", "share"}}
	if len(p.Steps) == 0 {
		return t
	}
	n := float64(len(p.Steps))
	sum := map[string]float64{}
	var step, host float64
	for _, s := range p.Steps {
		step += s.StepTime
		host += s.Host
		for k, v := range s.Compute {
			sum["compute/"+k] += v
		}
		for k, v := range s.Comm {
			sum["comm/"+k] += v
		}
	}
	keys := make([]string, 0, len(sum))
	for k := range sum {
		keys = append(keys, k)
	}
	sort.Slice(keys, func(i, j int) bool {
		if sum[keys[i]] != sum[keys[j]] {
			return sum[keys[i]] > sum[keys[j]]
		}
		return keys[i] < keys[j]
	})
	share := func(v float64) string {
		if step <= 0 {
			return "-"
		}
		return fmt.Sprintf("%.1f%%", 100*v/step)
	}
	var parts float64
	for _, k := range keys {
		parts += sum[k]
		t.Rows = append(t.Rows, []string{k, fmt.Sprintf("%.6f", sum[k]/n), share(sum[k])})
	}
	parts += host
	t.Rows = append(t.Rows, []string{"host/idle", fmt.Sprintf("%.6f", host/n), share(host)})
	t.Rows = append(t.Rows, []string{"sum of parts", fmt.Sprintf("%.6f", parts/n), share(parts)})
	t.Rows = append(t.Rows, []string{"step time", fmt.Sprintf("%.6f", step/n), share(step)})
	// What the host did to feed the device: ops (kernel launches and transfers) and waits.
	var ops, syncs float64
	for _, s := range p.Steps {
		ops += float64(s.Ops)
		syncs += float64(s.Syncs)
	}
	if ops > 0 {
		t.Rows = append(t.Rows, []string{"ops per step", fmt.Sprintf("%.0f", ops/n), "-"},
			[]string{"host syncs per step", fmt.Sprintf("%.0f", syncs/n), "-"})
	}
	return t
}

func (p ProfileReport) String() string { return p.Table().String() }

// Bundle renders the breakdown table as text and HTML.
func (p ProfileReport) Bundle() Bundle { return p.Table().Bundle() }

func profileOf(r *session.ProfileResponse) ProfileReport {
	out := ProfileReport{Trace: r.TraceJson}
	for _, s := range r.Steps {
		sp := StepProfile{Step: s.Step, StepTime: s.StepS, Compute: s.ComputeS, Comm: s.CommS,
			Host: s.HostS, Ops: s.Ops, Syncs: s.Syncs, FLOPs: s.Flops, Bytes: s.Bytes, CommBytes: s.CommBytes}
		if s.Metrics != nil {
			sp.Metrics = metricsOf(s.Metrics)
		}
		out.Steps = append(out.Steps, sp)
	}
	return out
}

// OpTotal is one op's share of a traced profile (ProfileTrace): its calls, device or host
// seconds, and the FLOPs and bytes the cost table counts for them, summed over the steps.
type OpTotal struct {
	Name, Class  string
	Calls        int
	Seconds      float64
	FLOPs, Bytes float64
}

// OpTotals adds up the ops of a traced profile by op name, largest FLOPs first (then by
// seconds). It fails when the report has no trace (Profile, not ProfileTrace) or the trace is
// not one the session writes.
func (p ProfileReport) OpTotals() ([]OpTotal, error) {
	if len(p.Trace) == 0 {
		return nil, fmt.Errorf("halo: OpTotals: the report has no trace: take it with halo.ProfileTrace")
	}
	var tr struct {
		TraceEvents []struct {
			Name string         `json:"name"`
			Cat  string         `json:"cat"`
			Ph   string         `json:"ph"`
			Dur  float64        `json:"dur"` // microseconds
			Args map[string]any `json:"args"`
		} `json:"traceEvents"`
	}
	if err := json.Unmarshal(p.Trace, &tr); err != nil {
		return nil, fmt.Errorf("halo: OpTotals: the trace is not a Chrome trace: %w", err)
	}
	num := func(a map[string]any, k string) float64 {
		v, _ := a[k].(float64)
		return v
	}
	var totals []OpTotal
	index := map[string]int{}
	for _, ev := range tr.TraceEvents {
		if ev.Ph != "X" || ev.Cat == "step" {
			continue // metadata, and the steps' own events
		}
		k, ok := index[ev.Name]
		if !ok {
			k = len(totals)
			index[ev.Name] = k
			totals = append(totals, OpTotal{Name: ev.Name, Class: ev.Cat})
		}
		t := &totals[k]
		t.Calls++
		t.Seconds += ev.Dur / 1e6
		t.FLOPs += num(ev.Args, "flops")
		t.Bytes += num(ev.Args, "bytes")
	}
	sort.SliceStable(totals, func(a, b int) bool {
		if totals[a].FLOPs != totals[b].FLOPs {
			return totals[a].FLOPs > totals[b].FLOPs
		}
		return totals[a].Seconds > totals[b].Seconds
	})
	return totals, nil
}

// Table is a small table that displays as aligned text and as HTML.
type Table struct {
	Title  string
	Header []string
	Rows   [][]string
}

func (t Table) String() string {
	widths := make([]int, len(t.Header))
	grow := func(row []string) {
		for i, c := range row {
			if i >= len(widths) {
				widths = append(widths, 0)
			}
			widths[i] = max(widths[i], len([]rune(c)))
		}
	}
	grow(t.Header)
	for _, r := range t.Rows {
		grow(r)
	}
	var b strings.Builder
	if t.Title != "" {
		b.WriteString(t.Title + "\n")
	}
	line := func(row []string) {
		for i, c := range row {
			if i > 0 {
				b.WriteString("  ")
			}
			pad := widths[i] - len([]rune(c))
			if i > 0 { // numbers align right
				b.WriteString(strings.Repeat(" ", pad) + c)
			} else {
				b.WriteString(c + strings.Repeat(" ", pad))
			}
		}
		b.WriteByte('\n')
	}
	if len(t.Header) > 0 {
		line(t.Header)
		total := 0
		for _, w := range widths {
			total += w
		}
		b.WriteString(strings.Repeat("-", total+2*(len(widths)-1)) + "\n")
	}
	for _, r := range t.Rows {
		line(r)
	}
	return strings.TrimRight(b.String(), "\n")
}

// HTML renders the table as an HTML <table>.
func (t Table) HTML() string {
	var b strings.Builder
	b.WriteString("<table>")
	if t.Title != "" {
		b.WriteString("<caption>" + html.EscapeString(t.Title) + "</caption>")
	}
	if len(t.Header) > 0 {
		b.WriteString("<thead><tr>")
		for _, h := range t.Header {
			b.WriteString("<th>" + html.EscapeString(h) + "</th>")
		}
		b.WriteString("</tr></thead>")
	}
	b.WriteString("<tbody>")
	for _, r := range t.Rows {
		b.WriteString("<tr>")
		for _, c := range r {
			b.WriteString("<td>" + html.EscapeString(c) + "</td>")
		}
		b.WriteString("</tr>")
	}
	b.WriteString("</tbody></table>")
	return b.String()
}

// Bundle renders the table as text/plain and text/html.
func (t Table) Bundle() Bundle {
	return Bundle{"text/plain": []byte(t.String()), "text/html": []byte(t.HTML())}
}

// Image is a rendered plot.
type Image struct {
	Title string
	PNG   []byte
	SVG   []byte
}

func (im Image) String() string {
	return fmt.Sprintf("<image %q: %d bytes png, %d bytes svg>", im.Title, len(im.PNG), len(im.SVG))
}

// Bundle renders the image as image/png and image/svg+xml with a text/plain description.
func (im Image) Bundle() Bundle {
	b := Bundle{"text/plain": []byte(im.String())}
	if len(im.PNG) > 0 {
		b["image/png"] = im.PNG
	}
	if len(im.SVG) > 0 {
		b["image/svg+xml"] = im.SVG
	}
	return b
}

// AdapterNorm is one LoRA-adapted module: the Frobenius norms of its A [r,in] and B [out,r]
// and of the update it adds to the base weight, scale * B @ A.
type AdapterNorm struct {
	Module      string // e.g. model.layers.0.self_attn.q_proj
	Layer       int
	A, B, Delta float64
}

// AdapterNorms are a run's adapters at a step (halo.Adapters).
type AdapterNorms struct {
	Step    int64
	Modules []AdapterNorm
}

// Table lists one module per row.
func (a AdapterNorms) Table() Table {
	t := Table{Title: fmt.Sprintf("LoRA adapters at step %d", a.Step), Header: []string{"module", "|A|", "|B|", "|scale B A|"}}
	for _, m := range a.Modules {
		t.Rows = append(t.Rows, []string{m.Module, fmt.Sprintf("%.4g", m.A), fmt.Sprintf("%.4g", m.B), fmt.Sprintf("%.4g", m.Delta)})
	}
	return t
}

func (a AdapterNorms) String() string { return a.Table().String() }

// Bundle renders the table as text and HTML.
func (a AdapterNorms) Bundle() Bundle { return a.Table().Bundle() }
