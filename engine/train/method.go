package train

import (
	"encoding/json"
	"fmt"
	"maps"
	"slices"
	"sort"
	"strings"

	"github.com/halo-shell/halo-shell/engine/data"
	"github.com/halo-shell/halo-shell/engine/models"
)

// A training method is an Objective (what a step minimises, micro-batch by micro-batch) plus
// how it reads its data, registered by name in a MethodSpec. The step loop (Trainer.Step,
// deviceSteps) is the same for every method: it reads gradient_accumulation_steps
// micro-batches, asks the objective how many units each holds (target tokens for pretrain
// and sft, pairs or examples for the preference methods), lets the objective accumulate the
// gradient of each micro-batch's share of the step's mean loss, then clips and updates.
// `halo-shell launch METHOD CONFIG.yaml` and a session's load pick the method by name.

// Objective is a training method's loss. It is called on the trainer's goroutine, between
// the step's ZeroGrads and the optimizer update.
type Objective interface {
	// Units is what micro-batch b contributes to the denominator of the step's mean loss:
	// its target tokens for token-level losses, its examples (pairs) for sequence-level
	// ones. A step whose micro-batches have no units is refused.
	Units(b data.Batch) int
	// ForwardBackward runs micro-batch b on m and accumulates (+=) into m's gradients the
	// gradient of lossSum/total, where lossSum is the micro-batch's summed loss and total
	// the step's units. It returns lossSum (float64, not divided) and the method's metric
	// sums for the micro-batch. at says which step this is (for schedules inside the loss).
	ForwardBackward(m *models.Model, b data.Batch, total int, at StepAt) (lossSum float64, ms Metrics, err error)
	// Eval returns the summed loss, the units and the metric sums of a held-out micro-batch,
	// without gradients.
	Eval(m *models.Model, b data.Batch, at StepAt) (lossSum float64, units int, ms Metrics, err error)
}

// rowObjective is an Objective whose loss is not the token cross-entropy that a parallel plan
// computes by itself (the sequence losses of the preference methods and reward models, GRPO's
// surrogate), so that it runs on a plan too. A step prepares each micro-batch on the trainer's
// goroutine, in order (prepareRow: the host-side work, such as a reference model's log-probs),
// and runs the returned rowRun on the model that holds the micro-batch: the single model, or a
// data rank's on a plan.
type rowObjective interface {
	Objective
	prepareRow(b data.Batch, total int, at StepAt) (rowRun, error)
}

// rowRun runs one prepared micro-batch on m (mb is the micro-batch as models reads it),
// accumulating the gradient of its share of the step's loss, and returns its loss sum and
// metric sums. It may run on several goroutines at once (the tensor ranks of one data rank,
// each with its own model), so it keeps its state in its own variables.
type rowRun func(m *models.Model, mb models.Batch) (lossSum float64, ms Metrics, err error)

// StepAt places a step in the run: Step is the step being computed (1 for the first) and
// Total the planned number of steps.
type StepAt struct {
	Step, Total int
}

// Progress is the fraction of the planned steps done when this step starts, in [0, 1].
func (s StepAt) Progress() float64 {
	if s.Total <= 0 {
		return 1
	}
	return min(1, max(0, float64(s.Step-1)/float64(s.Total)))
}

// Mean is a running mean: a sum and the number of things summed.
type Mean struct {
	Sum, N float64
}

// Value is Sum/N (0 when nothing was added).
func (m Mean) Value() float64 {
	if m.N == 0 {
		return 0
	}
	return m.Sum / m.N
}

// Metrics are a method's measurements of a step under their TRL names (rewards/chosen,
// rewards/accuracies, kl, ...), each a mean over the units it was measured on, so that
// micro-batches combine by adding.
type Metrics map[string]Mean

// Add records value v measured on n units under name.
func (ms Metrics) Add(name string, v, n float64) {
	m := ms[name]
	m.Sum += v
	m.N += n
	ms[name] = m
}

// Merge adds every mean of o into ms.
func (ms Metrics) Merge(o Metrics) {
	for k, v := range o {
		ms.Add(k, v.Sum, v.N)
	}
}

// Values are the means, by name; nil when there are none.
func (ms Metrics) Values() map[string]float64 {
	if len(ms) == 0 {
		return nil
	}
	out := make(map[string]float64, len(ms))
	for k, v := range ms {
		if v.N > 0 {
			out[k] = v.Value()
		}
	}
	// Where chosen and rejected were measured on different examples (KTO), the margin is
	// the difference of their means, as TRL logs it.
	c, okc := out["rewards/chosen"]
	r, okr := out["rewards/rejected"]
	if _, ok := out["rewards/margins"]; !ok && okc && okr {
		out["rewards/margins"] = c - r
	}
	return out
}

// MethodSpec registers a training method.
type MethodSpec struct {
	// Name is the method's name on the command line and in the config's method key.
	Name string
	// Summary is one line for help texts.
	Summary string
	// Parallel says whether the method runs on a parallel layout (several devices or
	// nodes); a method without it is refused there before any weight loads.
	Parallel bool
	// WholeSequences says that the loss reads whole sequences (a sum of completion log-probs,
	// or a classifier's score at a sequence's last token): context parallelism, which splits
	// sequences over ranks, is refused (rule cp-sequence-loss).
	WholeSequences bool
	// Keys are the config keys of Config.Objective this method reads; setting another one
	// is refused, naming the methods that read it.
	Keys []string
	// Defaults fills the method's own defaults into c (after the common defaults); may be nil.
	Defaults func(c *Config)
	// Validate checks the method's keys; bad records a refused key. May be nil.
	Validate func(c *Config, bad func(key, format string, args ...any))
	// Setup reads and tokenizes the method's data into the trainer (t.loader, t.Stats,
	// t.evalBatches, ...), with the model and tokenizer loaded, and returns the objective.
	Setup func(t *Trainer) (Objective, error)
}

var methodRegistry = map[string]*MethodSpec{}

// RegisterMethod adds a method; a second method of the same name panics (a programming error).
func RegisterMethod(s *MethodSpec) {
	if s.Name == "" || s.Setup == nil {
		panic("train: RegisterMethod needs a name and a Setup")
	}
	if _, dup := methodRegistry[s.Name]; dup {
		panic("train: method " + s.Name + " registered twice")
	}
	methodRegistry[s.Name] = s
}

// Methods lists the registered method names, sorted.
func Methods() []string {
	return slices.Sorted(maps.Keys(methodRegistry))
}

// LookupMethod returns the method of that name.
func LookupMethod(name string) (*MethodSpec, error) {
	if s, ok := methodRegistry[name]; ok {
		return s, nil
	}
	msg := fmt.Sprintf("unknown method %q (use one of %s)", name, strings.Join(Methods(), ", "))
	if s := closest(name, Methods()); s != "" {
		msg += fmt.Sprintf("; did you mean %q?", s)
	}
	return nil, fmt.Errorf("train: %s", msg)
}

// MethodSummaries is one line per registered method, for help texts.
func MethodSummaries() string {
	var b strings.Builder
	for _, n := range Methods() {
		fmt.Fprintf(&b, "  %-9s %s\n", n, methodRegistry[n].Summary)
	}
	return b.String()
}

// objectiveKeyOwners maps each key of Config.Objective to the methods that read it.
func objectiveKeyOwners() map[string][]string {
	owners := map[string][]string{}
	for _, n := range Methods() {
		for _, k := range methodRegistry[n].Keys {
			owners[k] = append(owners[k], n)
		}
	}
	return owners
}

func init() {
	for _, name := range []string{MethodPretrain, MethodSFT} {
		summary := "language modelling: every token is a target"
		if name == MethodSFT {
			summary = "supervised fine-tuning: only assistant / completion tokens are targets"
		}
		RegisterMethod(&MethodSpec{
			Name: name, Summary: summary, Parallel: true,
			Setup: func(t *Trainer) (Objective, error) {
				if err := t.setupData(); err != nil {
					return nil, err
				}
				return lmObjective{}, nil
			},
		})
	}
}

// lmObjective is the token-level cross-entropy of pretrain and sft: the step's loss is the
// mean over all its target tokens.
type lmObjective struct{}

func (lmObjective) Units(b data.Batch) int { return b.NumTargets() }

func (lmObjective) ForwardBackward(m *models.Model, b data.Batch, total int, _ StepAt) (float64, Metrics, error) {
	s, _, err := m.ForwardBackward(toModelBatch(b), float32(1/float64(total)))
	return s, nil, err
}

func (lmObjective) Eval(m *models.Model, b data.Batch, _ StepAt) (float64, int, Metrics, error) {
	s, n, err := m.Forward(toModelBatch(b))
	return s, n, nil, err
}

// MarshalJSON writes the metrics with the method's ones (Method) as top-level keys beside
// the common ones, as TRL logs them: {"step": 3, "loss": 0.69, "rewards/chosen": 0.01, ...}.
func (m StepMetrics) MarshalJSON() ([]byte, error) {
	type plain StepMetrics
	b, err := json.Marshal(plain(m))
	if err != nil || len(m.Method) == 0 {
		return b, err
	}
	keys := slices.Collect(maps.Keys(m.Method))
	sort.Strings(keys)
	var sb strings.Builder
	sb.Write(b[:len(b)-1])
	for _, k := range keys {
		kb, _ := json.Marshal(k)
		vb, err := json.Marshal(m.Method[k])
		if err != nil {
			return nil, fmt.Errorf("train: metric %s: %w", k, err)
		}
		sb.WriteByte(',')
		sb.Write(kb)
		sb.WriteByte(':')
		sb.Write(vb)
	}
	sb.WriteByte('}')
	return []byte(sb.String()), nil
}

// UnmarshalJSON reads what MarshalJSON writes: keys that are not fields of StepMetrics and
// hold numbers go to Method.
func (m *StepMetrics) UnmarshalJSON(b []byte) error {
	type plain StepMetrics
	var p plain
	if err := json.Unmarshal(b, &p); err != nil {
		return err
	}
	var all map[string]json.RawMessage
	if err := json.Unmarshal(b, &all); err != nil {
		return err
	}
	known := map[string]bool{}
	for _, f := range stepMetricsFields() {
		known[f] = true
	}
	for k, raw := range all {
		var v float64
		if known[k] || json.Unmarshal(raw, &v) != nil {
			continue
		}
		if p.Method == nil {
			p.Method = map[string]float64{}
		}
		p.Method[k] = v
	}
	*m = StepMetrics(p)
	return nil
}

// stepMetricsFields are the JSON names of StepMetrics' own fields.
func stepMetricsFields() []string {
	type plain StepMetrics
	full := plain{EvalLoss: new(float64), AuxLoss: new(float64), TimeByOpS: map[string]float64{"x": 0}, ExpertLoad: []models.ExpertLoad{{}}}
	fb, _ := json.Marshal(full)
	var all map[string]json.RawMessage
	_ = json.Unmarshal(fb, &all)
	return slices.Collect(maps.Keys(all))
}
