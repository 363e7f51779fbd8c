package train

import (
	"math"

	"github.com/halo-shell/halo-shell/engine/data"
	"github.com/halo-shell/halo-shell/engine/models"
)

// The preference methods: DPO, SMPO and KTO. Each is a sequence loss over examples (a pair,
// or a KTO example with its mismatched KL completion) that reads the policy's log-prob sums
// of the example's two sequences and, for DPO and KTO, the frozen reference's. Its gradient
// reaches the tokens through models.ForwardBackwardWeighted: a token of sequence s gets the
// gradient scale -dL/dS_s / total, S_s being the sum of the sequence's completion log-probs
// and total the step's examples. The formulas are in docs/methods.md and on each loss below.

// Method names of the preference methods.
const (
	MethodDPO  = "dpo"
	MethodSMPO = "smpo"
	MethodKTO  = "kto"
)

// example is one pair or KTO example of a micro-batch: the policy's and the reference's
// log-prob sums of its two sequences, their completion lengths, and (KTO) its label.
type example struct {
	policy, ref [2]float64
	n           [2]int
	label       bool
}

// exampleGrad is dL/dpolicy of an example's two sequences.
type exampleGrad [2]float64

// seqLoss is a method's loss over the examples of one micro-batch: the summed loss, each
// example's gradient with respect to its policy log-prob sums, and the metric sums.
type seqLoss func(ex []example, at StepAt) (lossSum float64, grads []exampleGrad, ms Metrics)

// prefObjective runs a seqLoss on micro-batches of segmented documents.
type prefObjective struct {
	loss        seqLoss
	train, eval prefSet
	ref         *reference // nil for reference-free methods
}

func (o *prefObjective) Units(b data.Batch) int {
	n := 0
	for _, s := range b.Segs {
		if s == 0 {
			n++
		}
	}
	return n
}

// examples groups the sequences of b by their document: sums and counts are per sequence,
// refs the reference sums per sequence (nil for reference-free methods). seqOf[d] says which
// example and segment sequence d is.
func examplesOf(b data.Batch, side prefSet, sums []float64, counts []int, refs []float64) (ex []example, seqOf [][2]int, err error) {
	if len(b.Sources) != b.Docs() {
		return nil, nil, errNoSegments
	}
	at := map[int32]int{}
	seqOf = make([][2]int, b.Docs())
	for d := range b.Sources {
		src, seg := b.Sources[d], b.Segs[d]
		i, ok := at[src]
		if !ok {
			i = len(ex)
			at[src] = i
			ex = append(ex, example{label: side.docs[src].label})
		}
		ex[i].policy[seg] = sums[d]
		ex[i].n[seg] = counts[d]
		if refs != nil {
			ex[i].ref[seg] = refs[d]
		}
		seqOf[d] = [2]int{i, int(seg)}
	}
	return ex, seqOf, nil
}

func (o *prefObjective) ForwardBackward(m *models.Model, b data.Batch, total int, at StepAt) (float64, Metrics, error) {
	run, err := o.prepareRow(b, total, at)
	if err != nil {
		return 0, nil, err
	}
	return run(m, toModelBatch(b))
}

// prepareRow implements rowObjective: the reference sums of b (looked up, or computed by the
// reference model on the trainer's goroutine), then the policy's forward and backward.
func (o *prefObjective) prepareRow(b data.Batch, total int, at StepAt) (rowRun, error) {
	var refs []float64
	if o.ref != nil {
		var err error
		if refs, err = o.ref.refSums(b, o.train); err != nil {
			return nil, err
		}
	}
	return func(m *models.Model, mb models.Batch) (float64, Metrics, error) {
		var lossSum float64
		var ms Metrics
		err := m.ForwardBackwardWeighted(mb, func(lp []float32) ([]float32, error) {
			sums, counts := seqLogps(b, lp)
			ex, seqOf, err := examplesOf(b, o.train, sums, counts, refs)
			if err != nil {
				return nil, err
			}
			var grads []exampleGrad
			lossSum, grads, ms = o.loss(ex, at)
			scale := make([]float32, len(lp))
			for d, se := range seqOf {
				g := float32(-grads[se[0]][se[1]] / float64(total))
				for i := b.DocStarts[d]; i < b.DocStarts[d+1]; i++ {
					if b.Targets[i] != data.IgnoreIndex {
						scale[i] = g
					}
				}
			}
			return scale, nil
		})
		if err != nil {
			return 0, nil, err
		}
		return lossSum, ms, nil
	}, nil
}

func (o *prefObjective) Eval(m *models.Model, b data.Batch, at StepAt) (float64, int, Metrics, error) {
	var refs []float64
	if o.ref != nil {
		var err error
		if refs, err = o.ref.refSums(b, o.eval); err != nil {
			return 0, 0, nil, err
		}
	}
	lp, err := m.TokenLogprobs(toModelBatch(b))
	if err != nil {
		return 0, 0, nil, err
	}
	sums, counts := seqLogps(b, lp)
	ex, _, err := examplesOf(b, o.eval, sums, counts, refs)
	if err != nil {
		return 0, 0, nil, err
	}
	l, _, ms := o.loss(ex, at)
	return l, len(ex), ms, nil
}

// logSigmoid is log(1/(1+exp(-x))) without overflow.
func logSigmoid(x float64) float64 {
	if x >= 0 {
		return -math.Log1p(math.Exp(-x))
	}
	return x - math.Log1p(math.Exp(x))
}

func sigmoid(x float64) float64 {
	if x >= 0 {
		return 1 / (1 + math.Exp(-x))
	}
	e := math.Exp(x)
	return e / (1 + e)
}

func boolF(b bool) float64 {
	if b {
		return 1
	}
	return 0
}

// dpoLoss is DPO as TRL computes it. With S the completion log-prob sums (policy pi, reference
// ref; c chosen, r rejected), logits h = (pi_c - ref_c) - (pi_r - ref_r) and:
//
//	sigmoid: L = -(1-eps) log sigmoid(beta h) - eps log sigmoid(-beta h)   (eps = label_smoothing)
//	ipo:     L = (h - 1/(2 beta))^2, every S divided by its completion length first
//
// Rewards are beta (pi - ref) of each completion (per-token means under ipo).
func dpoLoss(beta, eps float64, ipo bool) seqLoss {
	return func(ex []example, _ StepAt) (float64, []exampleGrad, Metrics) {
		ms := Metrics{}
		grads := make([]exampleGrad, len(ex))
		sum := 0.0
		for i, e := range ex {
			pc, pr, rc, rr := e.policy[0], e.policy[1], e.ref[0], e.ref[1]
			dc, dr := 1.0, 1.0 // dS'/dS, for ipo's length normalisation
			if ipo {
				dc, dr = 1/float64(max(1, e.n[0])), 1/float64(max(1, e.n[1]))
				pc, pr, rc, rr = pc*dc, pr*dr, rc*dc, rr*dr
			}
			h := (pc - rc) - (pr - rr)
			var l, dh float64
			if ipo {
				d := h - 1/(2*beta)
				l, dh = d*d, 2*d
			} else {
				z := beta * h
				l = -(1-eps)*logSigmoid(z) - eps*logSigmoid(-z)
				dh = beta * (-(1-eps)*sigmoid(-z) + eps*sigmoid(z))
			}
			sum += l
			grads[i] = exampleGrad{dh * dc, -dh * dr}
			cr, rj := beta*(pc-rc), beta*(pr-rr)
			ms.Add("rewards/chosen", cr, 1)
			ms.Add("rewards/rejected", rj, 1)
			ms.Add("rewards/accuracies", boolF(cr > rj), 1)
			ms.Add("rewards/margins", cr-rj, 1)
			ms.Add("logps/chosen", e.policy[0], 1)
			ms.Add("logps/rejected", e.policy[1], 1)
		}
		return sum, grads, ms
	}
}

// smpoLoss is SMPO, reference-free. With a_c and a_r the mean log-prob per completion
// token of the chosen and rejected completions, the margin gamma_t = target_margin *
// min(1, step / (margin_ramp_ratio * total steps)) (target_margin from the first step when
// margin_ramp_ratio is 0), and lambda = anchor_weight:
//
//	L = max(0, gamma_t - beta (a_c - a_r))^2 + lambda * (-a_c)
//
// a squared hinge on the reward gap plus the chosen completion's mean cross-entropy as an
// anchor. Rewards are beta a.
func smpoLoss(beta, target, ramp, anchor float64) seqLoss {
	return func(ex []example, at StepAt) (float64, []exampleGrad, Metrics) {
		gamma := target
		if ramp > 0 && at.Total > 0 {
			gamma = target * min(1, float64(at.Step)/(ramp*float64(at.Total)))
		}
		ms := Metrics{}
		grads := make([]exampleGrad, len(ex))
		sum := 0.0
		for i, e := range ex {
			nc, nr := float64(max(1, e.n[0])), float64(max(1, e.n[1]))
			ac, ar := e.policy[0]/nc, e.policy[1]/nr
			gap := beta * (ac - ar)
			h := max(0, gamma-gap)
			sum += h*h - anchor*ac
			// dL/da_c = -2 beta h - lambda, dL/da_r = 2 beta h; da/dS = 1/n.
			grads[i] = exampleGrad{(-2*beta*h - anchor) / nc, 2 * beta * h / nr}
			ms.Add("rewards/chosen", beta*ac, 1)
			ms.Add("rewards/rejected", beta*ar, 1)
			ms.Add("rewards/accuracies", boolF(ac > ar), 1)
			ms.Add("rewards/margins", gap, 1)
			ms.Add("logps/chosen", e.policy[0], 1)
			ms.Add("logps/rejected", e.policy[1], 1)
			ms.Add("nll_loss", -ac, 1)
			ms.Add("hinge_loss", h*h, 1)
		}
		if len(ex) > 0 {
			ms.Add("margin", gamma*float64(len(ex)), float64(len(ex)))
		}
		return sum, grads, ms
	}
}

// ktoLoss is KTO as TRL computes it (loss_type kto). With r = pi - ref of an example's
// completion (log-prob sums) and the KL estimate z = max(0, mean over the micro-batch of
// pi_KL - ref_KL), the mismatched completions' log-ratio, held constant:
//
//	desirable:   L = w_d (1 - sigmoid(beta (r - z)))
//	undesirable: L = w_u (1 - sigmoid(beta (z - r)))
//
// and the loss is the mean over examples. Rewards are beta r.
func ktoLoss(beta, wd, wu float64) seqLoss {
	return func(ex []example, _ StepAt) (float64, []exampleGrad, Metrics) {
		ms := Metrics{}
		grads := make([]exampleGrad, len(ex))
		if len(ex) == 0 {
			return 0, grads, ms
		}
		kl := 0.0
		for _, e := range ex {
			kl += e.policy[1] - e.ref[1]
		}
		kl = max(0, kl/float64(len(ex)))
		ms.Add("kl", kl, 1)
		sum := 0.0
		for i, e := range ex {
			r := e.policy[0] - e.ref[0]
			if e.label {
				s := sigmoid(beta * (r - kl))
				sum += wd * (1 - s)
				grads[i] = exampleGrad{-wd * beta * s * (1 - s), 0}
				ms.Add("rewards/chosen", beta*r, 1)
				ms.Add("logps/chosen", e.policy[0], 1)
			} else {
				s := sigmoid(beta * (kl - r))
				sum += wu * (1 - s)
				grads[i] = exampleGrad{wu * beta * s * (1 - s), 0}
				ms.Add("rewards/rejected", beta*r, 1)
				ms.Add("logps/rejected", e.policy[0], 1)
			}
		}
		return sum, grads, ms
	}
}

func init() {
	pairKeys := []string{"beta", "loss_type", "label_smoothing", "precompute_ref_log_probs", "ref_model_name_or_path"}
	RegisterMethod(&MethodSpec{
		Parallel: true, WholeSequences: true,
		Name: MethodDPO, Summary: "direct preference optimisation on {prompt, chosen, rejected} pairs against a frozen reference",
		Keys: pairKeys,
		Defaults: func(c *Config) {
			defaultFloat(&c.Objective.Beta, 0.1)
			if c.Objective.LossType == "" {
				c.Objective.LossType = "sigmoid"
			}
		},
		Validate: func(c *Config, bad func(key, format string, args ...any)) {
			o := c.Objective
			validateBeta(o.Beta, bad)
			noGenerationEval(c, bad)
			if e := oneOf("loss_type", o.LossType, []string{"sigmoid", "ipo"}); e != nil {
				bad(e.Key, "%s", e.Msg)
			}
			if !(o.LabelSmoothing >= 0 && o.LabelSmoothing < 0.5) {
				bad("label_smoothing", "%v must be in [0, 0.5)", o.LabelSmoothing)
			}
			if o.LabelSmoothing > 0 && o.LossType != "sigmoid" {
				bad("label_smoothing", "label smoothing applies to loss_type sigmoid only")
			}
			validateRef(c, bad)
		},
		Setup: func(t *Trainer) (Objective, error) {
			o := t.Cfg.Objective
			return t.setupRefObjective(data.Paired, dpoLoss(*o.Beta, o.LabelSmoothing, o.LossType == "ipo"))
		},
	})
	RegisterMethod(&MethodSpec{
		Parallel: true, WholeSequences: true,
		Name:    MethodSMPO,
		Summary: "reference-free preference optimisation: squared hinge on the mean log-prob gap plus a cross-entropy anchor",
		Keys:    []string{"beta", "target_margin", "margin_ramp_ratio", "anchor_weight"},
		Defaults: func(c *Config) {
			defaultFloat(&c.Objective.Beta, 1.2)
			defaultFloat(&c.Objective.TargetMargin, 0.35)
			defaultFloat(&c.Objective.MarginRampRatio, 1)
			defaultFloat(&c.Objective.AnchorWeight, 1)
		},
		Validate: func(c *Config, bad func(key, format string, args ...any)) {
			o := c.Objective
			validateBeta(o.Beta, bad)
			noGenerationEval(c, bad)
			if v := *o.TargetMargin; !(v >= 0) || math.IsInf(v, 0) {
				bad("target_margin", "%v must be a finite number >= 0", v)
			}
			if v := *o.MarginRampRatio; !(v >= 0 && v <= 1) {
				bad("margin_ramp_ratio", "%v must be in [0, 1] (0: the full margin from the first step)", v)
			}
			if v := *o.AnchorWeight; !(v >= 0) || math.IsInf(v, 0) {
				bad("anchor_weight", "%v must be a finite number >= 0 (0 turns the anchor off)", v)
			}
		},
		Setup: func(t *Trainer) (Objective, error) {
			o := t.Cfg.Objective
			tr, ev, err := t.setupPref(data.Paired)
			if err != nil {
				return nil, err
			}
			return &prefObjective{loss: smpoLoss(*o.Beta, *o.TargetMargin, *o.MarginRampRatio, *o.AnchorWeight), train: tr, eval: ev}, nil
		},
	})
	RegisterMethod(&MethodSpec{
		Parallel: true, WholeSequences: true,
		Name:    MethodKTO,
		Summary: "Kahneman-Tversky optimisation on unpaired {prompt, completion, label} rows against a frozen reference",
		Keys:    []string{"beta", "loss_type", "desirable_weight", "undesirable_weight", "precompute_ref_log_probs", "ref_model_name_or_path"},
		Defaults: func(c *Config) {
			defaultFloat(&c.Objective.Beta, 0.1)
			defaultFloat(&c.Objective.DesirableWeight, 1)
			defaultFloat(&c.Objective.UndesirableWeight, 1)
			if c.Objective.LossType == "" {
				c.Objective.LossType = "kto"
			}
		},
		Validate: func(c *Config, bad func(key, format string, args ...any)) {
			o := c.Objective
			validateBeta(o.Beta, bad)
			noGenerationEval(c, bad)
			if e := oneOf("loss_type", o.LossType, []string{"kto"}); e != nil {
				bad(e.Key, "%s", e.Msg)
			}
			for _, w := range []struct {
				key string
				v   float64
			}{{"desirable_weight", *o.DesirableWeight}, {"undesirable_weight", *o.UndesirableWeight}} {
				if !(w.v > 0) || math.IsInf(w.v, 0) {
					bad(w.key, "%v must be a finite number > 0", w.v)
				}
			}
			validateRef(c, bad)
		},
		Setup: func(t *Trainer) (Objective, error) {
			o := t.Cfg.Objective
			return t.setupRefObjective(data.Unpaired, ktoLoss(*o.Beta, *o.DesirableWeight, *o.UndesirableWeight))
		},
	})
}

// noGenerationEval refuses generation_eval for methods whose held-out data are pairs or
// examples, not chats with a reference answer.
func noGenerationEval(c *Config, bad func(key, format string, args ...any)) {
	if c.GenerationEval.MaxSamples > 0 {
		bad("generation_eval.max_samples", "method %s has no held-out chats to generate for (its held-out data are preference rows): remove generation_eval, or set it to 0", c.Method)
	}
}

func validateBeta(b *float64, bad func(key, format string, args ...any)) {
	if !(*b > 0) || math.IsInf(*b, 0) {
		bad("beta", "%v must be a finite number > 0", *b)
	}
}

func validateRef(c *Config, bad func(key, format string, args ...any)) {
	if c.Objective.RefModelNameOrPath != "" && c.PEFT.UsePEFT {
		bad("ref_model_name_or_path", "under LoRA (use_peft) the reference is the base with the adapters off: remove ref_model_name_or_path")
	}
}

// setupRefObjective reads the data of a method with a frozen reference and prepares its
// reference log-probs.
func (t *Trainer) setupRefObjective(kind data.PrefKind, loss seqLoss) (Objective, error) {
	tr, ev, err := t.setupPref(kind)
	if err != nil {
		return nil, err
	}
	ref, err := t.newReference(&tr, &ev)
	if err != nil {
		return nil, err
	}
	t.closers = append(t.closers, ref.closeFn)
	return &prefObjective{loss: loss, train: tr, eval: ev, ref: ref}, nil
}
