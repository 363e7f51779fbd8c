package train

import (
	"context"
	"encoding/json"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/halo-shell/halo-shell/engine/backend/cpu"
	"github.com/halo-shell/halo-shell/engine/data"
	"github.com/halo-shell/halo-shell/engine/hf/config"
	"github.com/halo-shell/halo-shell/engine/models"
)

// TestRewardLossHandValues: r_c = 1, r_r = -0.5: d = 1.5, -log sigmoid(1.5) = log(1 + e^-1.5)
// = 0.2014132779827524, dL/dr_c = -sigmoid(-1.5) = -0.18242552380635635; with a centring
// coefficient 0.1, (r_c + r_r)^2 = 0.25 adds 0.025 and 2 * 0.1 * 0.5 = 0.1 to both gradients.
func TestRewardLossHandValues(t *testing.T) {
	l, g, ms := rewardLoss([]float64{1}, []float64{-0.5}, 0)
	if !near(l, 0.2014132779827524, 1e-12) || !near(g[0][0], -0.18242552380635635, 1e-12) || !near(g[0][1], 0.18242552380635635, 1e-12) {
		t.Errorf("loss %v grads %v", l, g)
	}
	if v := ms.Values(); v["rewards/accuracies"] != 1 || v["rewards/margins"] != 1.5 {
		t.Errorf("metrics %v", v)
	}
	l, g, _ = rewardLoss([]float64{1}, []float64{-0.5}, 0.1)
	if !near(l, 0.2264132779827524, 1e-12) || !near(g[0][0], -0.08242552380635635, 1e-12) || !near(g[0][1], 0.28242552380635635, 1e-12) {
		t.Errorf("centred: loss %v grads %v", l, g)
	}
}

// TestRewardModelTrainsSavesAndLoads trains a reward model from scratch on arithmetic pairs,
// checks that its preference accuracy rises, that its output is transformers' sequence
// classification layout (score.weight, no lm_head, the classifier class, pad_token_id), that
// loading it back gives the scores the trainer's model gives, and that its gradient matches
// finite differences.
func TestRewardModelTrainsSavesAndLoads(t *testing.T) {
	out := filepath.Join(t.TempDir(), "rm")
	y := fmt.Sprintf(`init:
  arch: qwen3
  preset: tiny
  overrides: {hidden_size: 32, intermediate_size: 64, num_attention_heads: 2, num_key_value_heads: 1, head_dim: 16, num_hidden_layers: 2, tie_word_embeddings: true}
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
`, quickTok, out)
	cfg, err := ParseConfig([]byte(y), "rm.yaml", MethodReward, nil)
	if err != nil {
		t.Fatal(err)
	}
	tr := newTrainer(t, cfg)
	if _, err := Run(context.Background(), tr, RunOptions{}); err != nil {
		t.Fatal(err)
	}
	raw, err := os.ReadFile(filepath.Join(out, MetricsFile))
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
	mean := func(rs []StepMetrics) float64 {
		s := 0.0
		for _, r := range rs {
			s += r.Method["rewards/accuracies"]
		}
		return s / float64(len(rs))
	}
	first, last := mean(rows[:5]), mean(rows[len(rows)-5:])
	t.Logf("reward accuracies: first 5 steps %.3f, last 5 %.3f; final %v", first, last, rows[len(rows)-1].Method)
	if !(last > first) {
		t.Errorf("accuracy did not rise: %.3f -> %.3f", first, last)
	}

	c, err := config.Load(out)
	if err != nil {
		t.Fatal(err)
	}
	if len(c.Architectures) != 1 || c.Architectures[0] != "Qwen3ForSequenceClassification" || c.PadTokenID == nil {
		t.Fatalf("saved config: architectures %v, pad_token_id %v", c.Architectures, c.PadTokenID)
	}
	if _, ok := c.Extra("id2label"); !ok {
		t.Fatal("saved config has no id2label")
	}
	b := cpu.New(cpu.Options{})
	defer b.Close()
	m, err := models.Load(out, b, models.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	if !m.IsClassifier() || len(m.Unused) > 0 || len(m.Initialized) > 0 {
		t.Fatalf("loaded: classifier %v, unused %v, initialized %v", m.IsClassifier(), m.Unused, m.Initialized)
	}
	names := map[string]bool{}
	for _, s := range m.Specs {
		names[s.Name] = true
	}
	if !names["score.weight"] || names["lm_head.weight"] {
		t.Fatalf("saved tensors %v: want score.weight and no lm_head.weight", names)
	}
	doc := data.Assemble(tr.prefDocs, []int{0, 1})
	want, err := tr.model.Scores(toModelBatch(doc))
	if err != nil {
		t.Fatal(err)
	}
	got, err := m.Scores(toModelBatch(doc))
	if err != nil {
		t.Fatal(err)
	}
	for i := range want {
		if math.Abs(float64(got[i]-want[i])) > 1e-6 {
			t.Fatalf("loaded scores %v, trainer's %v", got, want)
		}
	}

	// The objective's gradient along itself against the finite difference of its loss.
	if err := m.ZeroGrads(); err != nil {
		t.Fatal(err)
	}
	obj := rewardObjective{center: 0.05}
	units := obj.Units(doc)
	if _, _, err := obj.ForwardBackward(m, doc, units, StepAt{}); err != nil {
		t.Fatal(err)
	}
	loss := func() float64 {
		l, n, _, err := obj.Eval(m, doc, StepAt{})
		if err != nil {
			t.Fatal(err)
		}
		return l / float64(n)
	}
	params, grads := map[string][]float32{}, map[string][]float32{}
	norm := 0.0
	for _, s := range m.Specs {
		params[s.Name], _ = m.ParamFloat32(s.Name)
		grads[s.Name], _ = m.GradFloat32(s.Name)
		for _, v := range grads[s.Name] {
			norm += float64(v) * float64(v)
		}
	}
	norm = math.Sqrt(norm)
	h := 3e-3
	move := func(sign float64) {
		for n, p := range params {
			q := make([]float32, len(p))
			for i := range p {
				q[i] = p[i] + float32(sign*h*float64(grads[n][i])/norm)
			}
			if err := m.SetParam(n, q); err != nil {
				t.Fatal(err)
			}
		}
	}
	move(1)
	lp := loss()
	move(-1)
	lm := loss()
	if fd := (lp - lm) / (2 * h); math.Abs(fd-norm) > 0.03*norm+1e-4 {
		t.Errorf("finite difference %g, gradient norm %g", fd, norm)
	}
}

// TestRewardModelFromCausalLM checks that a causal LM checkpoint becomes a reward model: the
// LM head is left unused and the score head drawn at random.
func TestRewardModelFromCausalLM(t *testing.T) {
	dir := t.TempDir()
	lm := filepath.Join(dir, "lm")
	cfg := tinyConfig(t, writeJSONL(t, dir, "d.jsonl", pcRecords(8)), "max_steps=3")
	tr := newTrainer(t, cfg)
	if err := tr.SaveModel(lm); err != nil {
		t.Fatal(err)
	}
	b := cpu.New(cpu.Options{})
	defer b.Close()
	m, err := models.Load(lm, b, models.Options{NumLabels: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	if len(m.Initialized) != 1 || m.Initialized[0] != "score.weight" {
		t.Errorf("initialized %v, want [score.weight]", m.Initialized)
	}
	s, _ := m.ParamFloat32("score.weight")
	nz := 0
	for _, v := range s {
		if v != 0 {
			nz++
		}
	}
	if nz == 0 {
		t.Error("the new score head is all zeros")
	}
}
