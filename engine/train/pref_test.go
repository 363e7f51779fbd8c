package train

import (
	"context"
	"encoding/json"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/halo-shell/halo-shell/engine/data"
)

func near(a, b, tol float64) bool { return math.Abs(a-b) <= tol*(1+math.Abs(b)) }

// TestPreferenceLossesHandValues checks each loss and its gradient with respect to the
// policy's log-prob sums against values worked out by hand from the formulas (the numbers in
// the comments).
func TestPreferenceLossesHandValues(t *testing.T) {
	// DPO: pi = (-3, -5), ref = (-4, -4): h = (1) - (-1) = 2; beta 0.1: z = 0.2.
	ex := []example{{policy: [2]float64{-3, -5}, ref: [2]float64{-4, -4}, n: [2]int{2, 4}}}
	type want struct {
		loss, dc, dr float64
	}
	for _, tc := range []struct {
		name string
		loss seqLoss
		ex   []example
		at   StepAt
		want want
	}{
		// -log sigmoid(0.2) = log(1 + e^-0.2); dL/dpi_c = -beta sigmoid(-0.2).
		{"dpo sigmoid", dpoLoss(0.1, 0, false), ex, StepAt{}, want{0.5981388693815918, -0.04501660026875222, 0.04501660026875222}},
		// eps 0.1: 0.9 * -log sigmoid(0.2) + 0.1 * -log sigmoid(-0.2).
		{"dpo label smoothing", dpoLoss(0.1, 0.1, false), ex, StepAt{}, want{0.6181388693815918, -0.03501660026875222, 0.03501660026875222}},
		// IPO on means: pi = (-1.5, -1.25), ref = (-2, -1): h = 0.5 + 0.25 = 0.75; 1/(2 beta) = 5:
		// L = 4.25^2 = 18.0625; dL/dh = -8.5, over the lengths 2 and 4.
		{"dpo ipo", dpoLoss(0.1, 0, true), ex, StepAt{}, want{18.0625, -4.25, 2.125}},
		// SMPO, step 5 of 10, ramp over the run: gamma = 0.175. a = (-3, -2): gap = -1.2, hinge
		// 1.375: L = 1.890625 + 3 (anchor); dL/da_c = -2*1.2*1.375 - 1 = -4.3 over 2 tokens,
		// dL/da_r = 3.3 over 3 tokens.
		{"smpo hinge active", smpoLoss(1.2, 0.35, 1, 1), []example{{policy: [2]float64{-6, -6}, n: [2]int{2, 3}}}, StepAt{5, 10}, want{4.890625, -2.15, 1.1}},
		// a = (-2, -3): gap 1.2 > gamma, no hinge; only the anchor: L = 2, dL/dS_c = -1/2.
		{"smpo hinge inactive", smpoLoss(1.2, 0.35, 1, 1), []example{{policy: [2]float64{-4, -9}, n: [2]int{2, 3}}}, StepAt{5, 10}, want{2, -0.5, 0}},
	} {
		l, g, _ := tc.loss(tc.ex, tc.at)
		if !near(l, tc.want.loss, 1e-12) || !near(g[0][0], tc.want.dc, 1e-12) || !near(g[0][1], tc.want.dr, 1e-12) {
			t.Errorf("%s: loss %v grads %v, want %v", tc.name, l, g[0], tc.want)
		}
	}
	// KTO, beta 0.1, w_d 1, w_u 1.5: KL completions' log-ratios 0.5 and 1: z = 0.75.
	// Desirable r = 1: 1 - sigmoid(0.025); undesirable r = -1: 1.5 (1 - sigmoid(0.175)).
	kex := []example{
		{policy: [2]float64{-3, -10}, ref: [2]float64{-4, -10.5}, label: true},
		{policy: [2]float64{-6, -8}, ref: [2]float64{-5, -9}},
	}
	l, g, ms := ktoLoss(0.1, 1, 1.5)(kex, StepAt{})
	if !near(l, 1.1782922946448713, 1e-12) || !near(g[0][0], -0.024996094156865017, 1e-12) || !near(g[1][0], 0.037214349746433666, 1e-12) || g[0][1] != 0 || g[1][1] != 0 {
		t.Errorf("kto: loss %v grads %v", l, g)
	}
	v := ms.Values()
	if !near(v["kl"], 0.75, 1e-12) || !near(v["rewards/chosen"], 0.1, 1e-12) || !near(v["rewards/rejected"], -0.1, 1e-12) || !near(v["rewards/margins"], 0.2, 1e-12) {
		t.Errorf("kto metrics %v", v)
	}
	// DPO metrics of the first case: rewards 0.1 and -0.1, the pair ranked right.
	_, _, dm := dpoLoss(0.1, 0, false)(ex, StepAt{})
	dv := dm.Values()
	if !near(dv["rewards/chosen"], 0.1, 1e-12) || !near(dv["rewards/rejected"], -0.1, 1e-12) || dv["rewards/accuracies"] != 1 || !near(dv["rewards/margins"], 0.2, 1e-12) {
		t.Errorf("dpo metrics %v", dv)
	}
}

// prefRows writes paired rows about additions: the right sum chosen, a wrong one rejected.
func prefRows(t *testing.T, dir string, n int, extra ...string) string {
	t.Helper()
	var b strings.Builder
	for i := range n {
		a, c := (i*7)%23, (i*11)%19
		row, _ := json.Marshal(map[string]string{"prompt": fmt.Sprintf("%d+%d=", a, c), "chosen": fmt.Sprint(a + c), "rejected": fmt.Sprint(a + c + 1 + i%5)})
		b.Write(row)
		b.WriteByte('\n')
	}
	for _, e := range extra {
		b.WriteString(e + "\n")
	}
	p := filepath.Join(dir, "pref.jsonl")
	if err := os.WriteFile(p, []byte(b.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

// ktoRows writes unpaired rows: right sums desirable, wrong ones not.
func ktoRows(t *testing.T, dir string, n int) string {
	t.Helper()
	var b strings.Builder
	for i := range n {
		a, c := (i*7)%23, (i*11)%19
		ans, label := a+c, i%2 == 0
		if !label {
			ans += 1 + i%5
		}
		row, _ := json.Marshal(map[string]any{"prompt": fmt.Sprintf("%d+%d=", a, c), "completion": fmt.Sprint(ans), "label": label})
		b.Write(row)
		b.WriteByte('\n')
	}
	p := filepath.Join(dir, "kto.jsonl")
	if err := os.WriteFile(p, []byte(b.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

// prefConfig is tinyConfig for a preference method.
func prefConfig(t *testing.T, method, dataPath string, extra ...string) *Config {
	t.Helper()
	cfg := tinyConfig(t, dataPath)
	cfg.Method = method
	cfg.Objective = ObjectiveConfig{}
	for _, o := range extra {
		if err := cfg.Set(o); err != nil {
			t.Fatal(err)
		}
	}
	cfg.Defaults()
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	return cfg
}

// objectiveLoss is the objective's mean loss over batch b of the training data, without
// gradients.
func objectiveLoss(t *testing.T, tr *Trainer, b data.Batch, at StepAt) float64 {
	t.Helper()
	o := tr.obj.(*prefObjective)
	var refs []float64
	if o.ref != nil {
		var err error
		if refs, err = o.ref.refSums(b, o.train); err != nil {
			t.Fatal(err)
		}
	}
	lp, err := tr.model.TokenLogprobs(toModelBatch(b))
	if err != nil {
		t.Fatal(err)
	}
	sums, counts := seqLogps(b, lp)
	ex, _, err := examplesOf(b, o.train, sums, counts, refs)
	if err != nil {
		t.Fatal(err)
	}
	l, _, _ := o.loss(ex, at)
	return l / float64(len(ex))
}

// TestPreferenceGradientsMatchFiniteDifferences checks each method's gradient on a tiny
// model on the CPU: the derivative of the loss along a direction d, (L(w + h d) - L(w - h d))
// / 2h, equals <grad, d>, for d the gradient itself and for a random direction. The policy is
// moved off the reference first so that DPO's and KTO's log-ratios are not all zero.
func TestPreferenceGradientsMatchFiniteDifferences(t *testing.T) {
	dir := t.TempDir()
	pairs := prefRows(t, dir, 6)
	kto := ktoRows(t, dir, 6)
	for _, tc := range []struct {
		method, data string
		extra        []string
	}{
		{MethodDPO, pairs, []string{"beta=0.5"}},
		{MethodDPO, pairs, []string{"loss_type=ipo", "beta=0.5"}},
		{MethodDPO, pairs, []string{"label_smoothing=0.2", "precompute_ref_log_probs=false"}},
		{MethodSMPO, pairs, []string{"target_margin=3"}},
		{MethodKTO, kto, []string{"beta=0.5", "undesirable_weight=1.5"}},
	} {
		t.Run(tc.method+" "+strings.Join(tc.extra, " "), func(t *testing.T) {
			cfg := prefConfig(t, tc.method, tc.data, append([]string{"per_device_train_batch_size=6", "packing=false", "learning_rate=3e-2"}, tc.extra...)...)
			tr := newTrainer(t, cfg)
			steps(t, tr, 2) // off the reference
			b := data.Assemble(tr.prefDocs, []int{0, 1, 2, 3, 4, 5})
			m := tr.model
			at := StepAt{Step: 3, Total: 20}
			if err := m.ZeroGrads(); err != nil {
				t.Fatal(err)
			}
			units := tr.obj.Units(b)
			lossSum, _, err := tr.obj.ForwardBackward(m, b, units, at)
			if err != nil {
				t.Fatal(err)
			}
			if l := objectiveLoss(t, tr, b, at); !near(lossSum/float64(units), l, 1e-5) {
				t.Fatalf("ForwardBackward's loss %v differs from the forward's %v", lossSum/float64(units), l)
			}
			params, grads := map[string][]float32{}, map[string][]float32{}
			for _, s := range m.Specs {
				p, _ := m.ParamFloat32(s.Name)
				g, _ := m.GradFloat32(s.Name)
				params[s.Name], grads[s.Name] = p, g
			}
			rng := rand.New(rand.NewPCG(5, 6))
			random := map[string][]float32{}
			for n, g := range grads {
				r := make([]float32, len(g))
				for i := range r {
					r[i] = float32(rng.NormFloat64())
				}
				random[n] = r
			}
			for _, dirn := range []struct {
				name string
				d    map[string][]float32
			}{{"gradient", grads}, {"random", random}} {
				norm, dot := 0.0, 0.0
				for n, d := range dirn.d {
					for i, v := range d {
						norm += float64(v) * float64(v)
						dot += float64(v) * float64(grads[n][i])
					}
				}
				norm = math.Sqrt(norm)
				h := 3e-3
				move := func(sign float64) {
					for n, p := range params {
						q := make([]float32, len(p))
						for i := range p {
							q[i] = p[i] + float32(sign*h*float64(dirn.d[n][i])/norm)
						}
						if err := m.SetParam(n, q); err != nil {
							t.Fatal(err)
						}
					}
				}
				move(1)
				lp := objectiveLoss(t, tr, b, at)
				move(-1)
				lm := objectiveLoss(t, tr, b, at)
				move(0)
				fd, an := (lp-lm)/(2*h), dot/norm
				if math.Abs(fd-an) > 0.03*math.Abs(an)+2e-4 {
					t.Errorf("along the %s direction: finite difference %.6g, gradient %.6g", dirn.name, fd, an)
				}
			}
		})
	}
}

// TestPreferenceBadRowsReported checks that rows with a missing field, an empty completion or
// a prompt longer than max_length are left out, and the run's summary says how many and why,
// with their lines.
func TestPreferenceBadRowsReported(t *testing.T) {
	dir := t.TempDir()
	long := strings.Repeat("9+", 40) + "1="
	p := prefRows(t, dir, 8,
		`{"prompt": "1+1=", "chosen": "2"}`,
		`{"prompt": "1+2=", "chosen": "", "rejected": "4"}`,
		fmt.Sprintf(`{"prompt": %q, "chosen": "1", "rejected": "2"}`, long),
	)
	tr := newTrainer(t, prefConfig(t, MethodDPO, p))
	s := tr.Summary()
	for _, w := range []string{"dropped 3 of 11 rows", `1 missing "rejected" (` + p + `:9)`, "1 empty completion (" + p + ":10)", "1 prompt longer than max_length (" + p + ":11)"} {
		if !strings.Contains(s, w) {
			t.Errorf("summary lacks %q:\n%s", w, s)
		}
	}
	if tr.Stats.Documents != 8 {
		t.Errorf("%d pairs kept, want 8", tr.Stats.Documents)
	}
}

// TestPreferenceRunRaisesAccuracy runs DPO, SMPO and KTO end to end through Run on a tiny
// model from scratch over synthetic arithmetic preferences and checks that the training
// preference accuracy of the last steps is above that of the first ones, in metrics.jsonl.
func TestPreferenceRunRaisesAccuracy(t *testing.T) {
	for _, method := range []string{MethodDPO, MethodSMPO, MethodKTO} {
		t.Run(method, func(t *testing.T) {
			y := fmt.Sprintf(`init:
  arch: qwen3
  preset: tiny
  overrides: {hidden_size: 32, intermediate_size: 64, num_attention_heads: 2, num_key_value_heads: 1, head_dim: 16, num_hidden_layers: 2}
tokenizer_name_or_path: %s
dataset: {synthetic: {kind: arithmetic, max_operand: 9, train: 64, eval: 16}}
max_length: 32
per_device_train_batch_size: 8
learning_rate: 1e-2
max_steps: 40
seed: 3
device: cpu
save_steps: 0
output_dir: %s
`, quickTok, filepath.Join(t.TempDir(), "out"))
			cfg, err := ParseConfig([]byte(y), "pref.yaml", method, nil)
			if err != nil {
				t.Fatal(err)
			}
			tr := newTrainer(t, cfg)
			if _, err := Run(context.Background(), tr, RunOptions{}); err != nil {
				t.Fatal(err)
			}
			raw, err := os.ReadFile(filepath.Join(cfg.Run.OutputDir, MetricsFile))
			if err != nil {
				t.Fatal(err)
			}
			var rows []StepMetrics
			for _, l := range strings.Split(strings.TrimSpace(string(raw)), "\n") {
				var m StepMetrics
				if err := json.Unmarshal([]byte(l), &m); err != nil {
					t.Fatal(err)
				}
				rows = append(rows, m)
			}
			key := "rewards/accuracies"
			if method == MethodKTO {
				key = "rewards/margins"
			}
			mean := func(rs []StepMetrics) float64 {
				s := 0.0
				for _, r := range rs {
					v, ok := r.Method[key]
					if !ok {
						t.Fatalf("step %d has no %s: %v", r.Step, key, r.Method)
					}
					s += v
				}
				return s / float64(len(rs))
			}
			first, last := mean(rows[:5]), mean(rows[len(rows)-5:])
			t.Logf("%s %s: first 5 steps %.3f, last 5 %.3f; final %v", method, key, first, last, rows[len(rows)-1].Method)
			if !(last > first) {
				t.Errorf("%s did not rise: first steps %.3f, last steps %.3f", key, first, last)
			}
			if _, ok := rows[len(rows)-1].Method["eval_"+key]; !ok {
				t.Errorf("the last step has no eval_%s: %v", key, rows[len(rows)-1].Method)
			}
		})
	}
}

// TestReferencePrecomputedOrNotGiveTheSameRun checks that reference log-probs computed once
// before training and those computed every micro-batch (a frozen copy of the starting model,
// or under LoRA the base with the adapters off) give the same losses step for step.
func TestReferencePrecomputedOrNotGiveTheSameRun(t *testing.T) {
	p := prefRows(t, t.TempDir(), 12)
	for _, tc := range []struct {
		name  string
		extra []string
	}{
		{"full model", nil},
		{"lora", []string{"use_peft=true", "lora_r=4", "lora_alpha=8", "lora_dropout=0", "learning_rate=3e-2"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var runs [2][]float64
			for i, pre := range []string{"true", "false"} {
				cfg := prefConfig(t, MethodDPO, p, append([]string{"precompute_ref_log_probs=" + pre, "max_steps=4", "beta=0.5"}, tc.extra...)...)
				runs[i] = steps(t, newTrainer(t, cfg), 4)
			}
			for s := range runs[0] {
				if !near(runs[0][s], runs[1][s], 1e-5) {
					t.Fatalf("step %d: loss %v with precomputed reference log-probs, %v without", s+1, runs[0][s], runs[1][s])
				}
			}
			if runs[0][3] == runs[0][0] {
				t.Fatalf("the loss never moved (%v): the test shows nothing", runs[0])
			}
		})
	}
}
