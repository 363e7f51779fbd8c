package halo

import (
	"context"
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"
	"time"

	"github.com/halo-shell/halo-shell/cell/internal/hostenv"
	"github.com/halo-shell/halo-shell/session"
)

// MaxInspectValues bounds the values Inspect copies to the host (64 Mi floats, 256 MiB).
const MaxInspectValues = 64 << 20

func env(op string) *hostenv.Env {
	e := hostenv.Current()
	if e == nil {
		fail(op, errors.New("no interpreter is active"))
	}
	return e
}

func client(op string) (*session.Client, context.Context, *hostenv.Env) {
	e := env(op)
	c, err := e.Client()
	if err != nil {
		fail(op, err)
	}
	return c, e.Context(), e
}

// Session returns the client of the attached session, attaching on first use. Its methods
// take a context; use context.Background() or the result of Context.
func Session() *session.Client {
	c, _, _ := client("halo.Session")
	return c
}

// Context returns the context of the running cell; it is cancelled when the cell is
// interrupted.
func Context() context.Context { return env("halo.Context").Context() }

// Attach attaches to another session (a name, a unix socket path or tcp://HOST:PORT) and
// returns its status. The previous session keeps running.
func Attach(target string) SessionStatus {
	e := env("halo.Attach")
	c, err := e.Attach(e.Context(), target)
	if err != nil {
		fail("halo.Attach", err)
	}
	st, err := c.Status(e.Context())
	if err != nil {
		fail("halo.Attach", err)
	}
	return statusOf(st)
}

// Status describes the attached session.
func Status() SessionStatus {
	c, ctx, _ := client("halo.Status")
	st, err := c.Status(ctx)
	if err != nil {
		fail("halo.Status", err)
	}
	return statusOf(st)
}

// TakeOver makes this client the controller of the attached session, even when another
// client controls it, and returns the status. The previous controller is told (its next
// control call is refused) and may take control back the same way.
func TakeOver() SessionStatus {
	c, ctx, _ := client("halo.TakeOver")
	if _, err := c.TakeOver(ctx); err != nil {
		fail("halo.TakeOver", err)
	}
	return Status()
}

// Release gives up control of the attached session, so that another client can claim it
// without taking over, and returns the status. It is a no-op when this client does not
// control the session.
func Release() SessionStatus {
	c, ctx, _ := client("halo.Release")
	if err := c.Release(ctx); err != nil {
		fail("halo.Release", err)
	}
	return Status()
}

// Load builds a model, optimizer and data from a YAML config (a path on the session's
// machine; method sft) in the session, replacing what was loaded, and returns the status.
func Load(config string) SessionStatus { return LoadMethod(config, "") }

// LoadMethod is Load with a training method: "sft" (the default when empty), "pretrain",
// "grpo" or another method of the session's halo-shell (`halo-shell launch --help` lists them;
// the session refuses one it does not know, naming those it does).
// Load and LoadMethod refuse to replace a model with trained steps that were not saved; save
// them first, or use LoadForce.
func LoadMethod(config, method string) SessionStatus { return load("halo.Load", config, method, false) }

// LoadForce is LoadMethod that replaces the loaded model even when it has trained steps that
// were not saved (they are lost).
func LoadForce(config, method string) SessionStatus {
	return load("halo.LoadForce", config, method, true)
}

func load(op, config, method string, force bool) SessionStatus {
	if method != "" {
		if err := CheckMethodName(method); err != nil {
			fail(op, err)
		}
	}
	c, ctx, _ := client(op)
	r, err := c.LoadWith(ctx, &session.LoadRequest{ConfigPath: config, Method: method, Force: force})
	if err != nil {
		fail(op, err)
	}
	if r.Status == nil {
		return Status()
	}
	return statusOf(r.Status)
}

// Step runs n optimizer steps and returns their metrics.
func Step(n int) []StepMetrics {
	if n < 1 {
		fail("halo.Step", fmt.Errorf("n = %d: want at least 1 step", n))
	}
	c, ctx, e := client("halo.Step")
	ms, err := c.Step(ctx, n)
	e.Record(c, ms...)
	if err != nil {
		fail("halo.Step", err)
	}
	return metricsList(ms)
}

// Run starts training in the background until paused or the planned total, and returns the
// status at once.
func Run() SessionStatus { return RunSteps(0) }

// RunSteps starts training in the background for n more steps (0: until the planned total).
func RunSteps(n int) SessionStatus {
	if n < 0 {
		fail("halo.RunSteps", fmt.Errorf("n = %d: want 0 (until the planned total) or more steps", n))
	}
	c, ctx, _ := client("halo.Run")
	st, err := c.Run(ctx, n)
	if err != nil {
		fail("halo.Run", err)
	}
	return statusOf(st)
}

// Pause stops a background run at the next step boundary and returns the status.
func Pause() SessionStatus {
	c, ctx, _ := client("halo.Pause")
	st, err := c.Pause(ctx)
	if err != nil {
		fail("halo.Pause", err)
	}
	return statusOf(st)
}

// Resume continues a paused run.
func Resume() SessionStatus {
	c, ctx, _ := client("halo.Resume")
	st, err := c.Resume(ctx)
	if err != nil {
		fail("halo.Resume", err)
	}
	return statusOf(st)
}

// Eval returns the held-out loss.
func Eval() float64 {
	c, ctx, _ := client("halo.Eval")
	l, err := c.Eval(ctx)
	if err != nil {
		fail("halo.Eval", err)
	}
	return l
}

// Generate continues prompt greedily (up to 64 new tokens) and returns the text.
func Generate(prompt string) string {
	return GenerateN(prompt, 64)
}

// GenerateN continues prompt greedily with up to maxNewTokens new tokens.
func GenerateN(prompt string, maxNewTokens int) string {
	if maxNewTokens < 1 {
		fail("halo.GenerateN", fmt.Errorf("maxNewTokens = %d: want at least 1", maxNewTokens))
	}
	c, ctx, _ := client("halo.Generate")
	s, err := c.Generate(ctx, &session.GenerateRequest{Prompt: prompt, MaxNewTokens: int32(maxNewTokens)}, nil)
	if err != nil {
		fail("halo.Generate", err)
	}
	return s
}

// Generation is a timed greedy continuation (GenerateTimed).
type Generation struct {
	Text    string
	Tokens  int     // new tokens generated
	Seconds float64 // wall time of the call, prompt processing included
}

// TokensPerS is the new tokens per second of the call (0 without tokens).
func (g Generation) TokensPerS() float64 {
	if g.Seconds <= 0 {
		return 0
	}
	return float64(g.Tokens) / g.Seconds
}

func (g Generation) String() string {
	return fmt.Sprintf("%d tokens in %s (%.4g tok/s): %q", g.Tokens, FormatSeconds(g.Seconds), g.TokensPerS(), g.Text)
}

// GenerateTimed is GenerateN that also counts the new tokens and times the call: a rollout's
// decoding cost, one sequence at a time.
func GenerateTimed(prompt string, maxNewTokens int) Generation {
	if maxNewTokens < 1 {
		fail("halo.GenerateTimed", fmt.Errorf("maxNewTokens = %d: want at least 1", maxNewTokens))
	}
	c, ctx, _ := client("halo.GenerateTimed")
	start := time.Now()
	s, n, err := c.GenerateCount(ctx, &session.GenerateRequest{Prompt: prompt, MaxNewTokens: int32(maxNewTokens)}, nil)
	if err != nil {
		fail("halo.GenerateTimed", err)
	}
	return Generation{Text: s, Tokens: n, Seconds: time.Since(start).Seconds()}
}

// GenerateBase is GenerateN with the run's LoRA adapters off for this call: the base model's
// greedy continuation, to compare with what GenerateN gives with the adapters (use_peft).
func GenerateBase(prompt string, maxNewTokens int) string {
	if maxNewTokens < 1 {
		fail("halo.GenerateBase", fmt.Errorf("maxNewTokens = %d: want at least 1", maxNewTokens))
	}
	c, ctx, _ := client("halo.GenerateBase")
	s, err := c.Generate(ctx, &session.GenerateRequest{Prompt: prompt, MaxNewTokens: int32(maxNewTokens), WithoutAdapter: true}, nil)
	if err != nil {
		fail("halo.GenerateBase", err)
	}
	return s
}

// Adapters returns the norms of every LoRA adapter of a run with use_peft, one row per
// adapted module: ||A||, ||B|| and ||scale * B @ A||, the size of the update each adds to its
// base weight (zero at the start, since B starts at zero).
func Adapters() AdapterNorms {
	c, ctx, _ := client("halo.Adapters")
	r, err := c.Inspect(ctx, &session.InspectRequest{Kind: "adapter"})
	if err != nil {
		fail("halo.Adapters", err)
	}
	out := AdapterNorms{Step: r.Step}
	for _, a := range r.Adapters {
		out.Modules = append(out.Modules, AdapterNorm{Module: a.Module, Layer: int(a.Layer), A: a.ANorm, B: a.BNorm, Delta: a.DeltaNorm})
	}
	return out
}

// Save writes a checkpoint into dir on the session's machine and returns the directory.
func Save(dir string) string {
	if strings.TrimSpace(dir) == "" {
		fail("halo.Save", errors.New("empty directory: give the directory to write the checkpoint into"))
	}
	c, ctx, _ := client("halo.Save")
	r, err := c.Save(ctx, dir)
	if err != nil {
		fail("halo.Save", err)
	}
	return r.Dir
}

// Layout shows the run's parallel layout when spec is empty, and otherwise moves the run to
// the layout spec names at the next step boundary: words dp=N fsdp tp=N cp=N ep=N etp=N and
// optionally devices=LIST (cpu:4, cuda:0-3); "dp=1" goes back to one device. Parameters and
// optimizer state move in memory. A layout that breaks a rule is refused with the rule and a
// layout that works, and the run continues as it was. Example: halo.Layout("tp=2 fsdp").
func Layout(spec string) LayoutInfo {
	c, ctx, _ := client("halo.Layout")
	if strings.TrimSpace(spec) == "" {
		st, err := c.Status(ctx)
		if err != nil {
			fail("halo.Layout", err)
		}
		if st.Layout == "" {
			fail("halo.Layout", errors.New("no model is loaded: load a config first (:load CONFIG.yaml)"))
		}
		return LayoutInfo{Layout: st.Layout, Devices: st.Devices, Step: st.Step}
	}
	r, err := c.SetLayout(ctx, spec)
	if err != nil {
		fail("halo.Layout", err)
	}
	return LayoutInfo{Layout: r.Layout, Devices: r.Devices, Previous: r.Previous, Seconds: r.DurationS, Step: r.Step}
}

// Hyper returns the hyperparameters the next step will use.
func Hyper() Hyperparams {
	c, ctx, _ := client("halo.Hyper")
	h, err := c.Hyper(ctx)
	if err != nil {
		fail("halo.Hyper", err)
	}
	return hyperOf(h)
}

// Set changes one hyperparameter from the next step on and returns the result. Keys:
// lr (learning_rate), lr_scheduler_type (scheduler), weight_decay, adam_beta1, adam_beta2,
// adam_epsilon, max_grad_norm, gradient_accumulation_steps (grad_accum). Value is a number
// or, for the scheduler, a string.
func Set(key string, value interface{}) Hyperparams {
	var s string
	switch v := value.(type) {
	case string:
		s = v
	case float64:
		s = strconv.FormatFloat(v, 'g', -1, 64)
	case float32:
		s = strconv.FormatFloat(float64(v), 'g', -1, 32)
	case int, int8, int16, int32, int64, uint, uint8, uint16, uint32, uint64:
		s = fmt.Sprint(v)
	default:
		fail("halo.Set", fmt.Errorf("%s: value %v of type %T: want a number or a string", key, value, value))
	}
	return SetAll(map[string]string{key: s})
}

// SetAll changes several hyperparameters at once (all or none) from the next step on.
func SetAll(kv map[string]string) Hyperparams {
	req, err := HyperRequest(kv)
	if err != nil {
		fail("halo.Set", err)
	}
	c, ctx, _ := client("halo.Set")
	h, err := c.SetHyper(ctx, req)
	if err != nil {
		fail("halo.Set", err)
	}
	return hyperOf(h)
}

// hyperKeys maps accepted names to canonical ones.
var hyperKeys = map[string]string{
	"lr": "learning_rate", "learning_rate": "learning_rate",
	"lr_scheduler_type": "lr_scheduler_type", "scheduler": "lr_scheduler_type", "schedule": "lr_scheduler_type",
	"weight_decay": "weight_decay", "wd": "weight_decay",
	"adam_beta1": "adam_beta1", "beta1": "adam_beta1",
	"adam_beta2": "adam_beta2", "beta2": "adam_beta2",
	"adam_epsilon": "adam_epsilon", "eps": "adam_epsilon",
	"max_grad_norm": "max_grad_norm", "clip": "max_grad_norm",
	"gradient_accumulation_steps": "gradient_accumulation_steps", "grad_accum": "gradient_accumulation_steps",
}

// HyperKeys lists the canonical hyperparameter names Set accepts.
func HyperKeys() []string {
	return []string{"learning_rate", "lr_scheduler_type", "weight_decay", "adam_beta1", "adam_beta2", "adam_epsilon", "max_grad_norm", "gradient_accumulation_steps"}
}

// HyperRequest turns key=value strings into a SetHyperRequest, naming the key and what to
// type when a key or value is wrong.
func HyperRequest(kv map[string]string) (*session.SetHyperRequest, error) {
	if len(kv) == 0 {
		return nil, errors.New("nothing to set: give key=value pairs, e.g. lr=1e-5 max_grad_norm=0.5")
	}
	req := &session.SetHyperRequest{}
	for k, v := range kv {
		canon, ok := hyperKeys[strings.ToLower(k)]
		if !ok {
			return nil, fmt.Errorf("unknown hyperparameter %q: want one of %s (or lr, clip, wd, eps, beta1, beta2, grad_accum)", k, strings.Join(HyperKeys(), ", "))
		}
		if canon == "lr_scheduler_type" {
			if v == "" {
				return nil, fmt.Errorf("%s: empty value: give a schedule name such as constant, linear or cosine", k)
			}
			req.LrSchedulerType = &v
			continue
		}
		if canon == "gradient_accumulation_steps" {
			n, err := strconv.Atoi(v)
			if err != nil || n < 1 {
				return nil, fmt.Errorf("%s=%q: want a whole number of steps, at least 1", k, v)
			}
			n32 := int32(min(n, math.MaxInt32))
			req.GradientAccumulationSteps = &n32
			continue
		}
		f, err := strconv.ParseFloat(v, 64)
		if err != nil || math.IsNaN(f) || math.IsInf(f, 0) {
			return nil, fmt.Errorf("%s=%q: want a finite number, e.g. %s=1e-5", k, v, k)
		}
		switch canon {
		case "learning_rate":
			req.LearningRate = &f
		case "weight_decay":
			req.WeightDecay = &f
		case "adam_beta1":
			req.AdamBeta1 = &f
		case "adam_beta2":
			req.AdamBeta2 = &f
		case "adam_epsilon":
			req.AdamEpsilon = &f
		case "max_grad_norm":
			req.MaxGradNorm = &f
		}
	}
	return req, nil
}

// Metrics returns the metrics of the steps seen since attaching (Step calls and background
// runs), in step order.
func Metrics() []StepMetrics {
	return metricsList(env("halo.Metrics").History())
}

// ExpertLoad returns the per-layer expert load of the latest step seen (nil before any step
// and for dense models): tokens per expert summed over the step's micro-batches and ranks,
// with max, min, coefficient of variation and dead experts.
func ExpertLoad() []LayerLoad {
	ms := Metrics()
	if len(ms) == 0 {
		return nil
	}
	return ms[len(ms)-1].ExpertLoad
}

// Losses returns the training loss of each step in Metrics.
func Losses() []float64 {
	ms := Metrics()
	out := make([]float64, len(ms))
	for i, m := range ms {
		out[i] = m.Loss
	}
	return out
}

// Profile runs the next k steps with profiling and returns where their time went.
func Profile(k int) ProfileReport { return takeProfile("halo.Profile", k, false) }

// ProfileTrace is Profile that also keeps every op of the steps: the report's Trace is their
// Chrome/Perfetto trace, and OpTotals adds them up by op.
func ProfileTrace(k int) ProfileReport { return takeProfile("halo.ProfileTrace", k, true) }

func takeProfile(name string, k int, trace bool) ProfileReport {
	if k < 1 {
		fail(name, fmt.Errorf("k = %d: want at least 1 step", k))
	}
	c, ctx, e := client(name)
	r, err := c.Profile(ctx, k, trace)
	if err != nil {
		fail(name, err)
	}
	for _, s := range r.Steps {
		e.Record(c, s.Metrics)
	}
	return profileOf(r)
}

// Stats returns statistics of every parameter and gradient.
func Stats() []TensorStats {
	c, ctx, _ := client("halo.Stats")
	r, err := c.Inspect(ctx, &session.InspectRequest{})
	if err != nil {
		fail("halo.Stats", err)
	}
	out := make([]TensorStats, len(r.Stats))
	for i, s := range r.Stats {
		out[i] = statsOf(s)
	}
	return out
}

// Inspect returns a host copy of the named parameter.
func Inspect(name string) Tensor { return inspect("halo.Inspect", name, "param") }

// InspectGrad returns a host copy of the gradient of the named parameter.
func InspectGrad(name string) Tensor { return inspect("halo.InspectGrad", name, "grad") }

func inspect(op, name, kind string) Tensor {
	if name == "" {
		fail(op, errors.New("empty tensor name: list the names with halo.Stats()"))
	}
	c, ctx, _ := client(op)
	r, err := c.Inspect(ctx, &session.InspectRequest{Name: name, Kind: kind})
	if err != nil {
		fail(op, err)
	}
	if len(r.Stats) == 0 {
		fail(op, fmt.Errorf("no %s named %q: list the names with halo.Stats()", kind, name))
	}
	st := statsOf(r.Stats[0])
	n := int64(1)
	for _, d := range st.Shape {
		n *= int64(d)
	}
	if n > MaxInspectValues {
		fail(op, fmt.Errorf("%s %q has %d values, more than the %d Inspect copies; use halo.Session().Inspect with an offset and count", kind, name, n, MaxInspectValues))
	}
	r, err = c.Inspect(ctx, &session.InspectRequest{Name: name, Kind: kind, Count: n})
	if err != nil {
		fail(op, err)
	}
	if int64(len(r.Values)) != n {
		fail(op, fmt.Errorf("%s %q: the session sent %d values for shape %v", kind, name, len(r.Values), st.Shape))
	}
	return Tensor{TensorStats: st, Step: r.Step, Data: r.Values}
}

// Display shows v in the cell's output: values with a Bundle method (plots, tables, profiles)
// in their rich forms, anything else as text.
func Display(v interface{}) {
	env("halo.Display").Display(BundleOf(v))
}

// BundleOf returns the MIME bundle of v: v.Bundle() for a Displayer (with text/plain added
// when missing), else its text form.
func BundleOf(v interface{}) Bundle {
	if d, ok := v.(Displayer); ok {
		b := d.Bundle()
		if b == nil {
			b = Bundle{}
		}
		if _, ok := b["text/plain"]; !ok {
			b["text/plain"] = []byte(Text(v))
		}
		return b
	}
	return Bundle{"text/plain": []byte(Text(v))}
}

// Text is the text form of a value as the REPL prints it: String() when the value has one,
// slices one element per line when their elements do, %+v otherwise.
func Text(v interface{}) string {
	switch x := v.(type) {
	case nil:
		return "nil"
	case string:
		return strconv.Quote(x)
	case fmt.Stringer:
		return x.String()
	case error:
		return x.Error()
	case []StepMetrics:
		return joinLines(len(x), func(i int) string { return x[i].String() })
	case []TensorStats:
		return joinLines(len(x), func(i int) string { return x[i].String() })
	}
	return fmt.Sprintf("%+v", v)
}

func joinLines(n int, f func(int) string) string {
	if n == 0 {
		return "[]"
	}
	lines := make([]string, n)
	for i := range lines {
		lines[i] = f(i)
	}
	return strings.Join(lines, "\n")
}

// GoPanic reports a panic recovered in a goroutine that a cell started (cells run their go
// statements through it, so that such a panic does not end the process). It does nothing for
// nil.
func GoPanic(v interface{}) {
	if v == nil {
		return
	}
	e := hostenv.Current()
	if e == nil {
		return
	}
	fmt.Fprintf(e.Stdout(), "panic in a goroutine started by a cell: %v\n", v)
}

// CheckMethodName refuses a word that cannot name a training method (lower-case letters,
// digits and underscores, starting with a letter); which methods exist the session decides.
func CheckMethodName(m string) error {
	ok := m != "" && m[0] >= 'a' && m[0] <= 'z'
	for _, r := range m {
		ok = ok && (r >= 'a' && r <= 'z' || r >= '0' && r <= '9' || r == '_')
	}
	if !ok {
		return fmt.Errorf("method %q: a method is a lower-case name such as sft, pretrain or grpo", m)
	}
	return nil
}
