package train

import (
	"context"
	"fmt"
	"math"
	"path/filepath"
	"testing"

	"github.com/halo-shell/halo-shell/engine/data"
)

// tinyMoEConfig is a from-scratch tiny qwen3_moe whose aux loss weighs enough to matter.
func tinyMoEConfig(t *testing.T, dataPath string, extra ...string) *Config {
	t.Helper()
	y := fmt.Sprintf(`init:
  arch: qwen3_moe
  preset: tiny
  overrides: {hidden_size: 32, moe_intermediate_size: 16, num_experts: 4, num_experts_per_tok: 2, num_attention_heads: 2, num_key_value_heads: 1, head_dim: 16, num_hidden_layers: 2, output_router_logits: true, router_aux_loss_coef: 0.5}
tokenizer_name_or_path: %s
dataset: {path: %s}
max_length: 32
packing: false
per_device_train_batch_size: 1
learning_rate: 3e-3
max_steps: 20
warmup_steps: 0
seed: 7
device: cpu
output_dir: %s
`, quickTok, dataPath, filepath.Join(t.TempDir(), "out"))
	cfg, err := ParseConfig([]byte(y), "moe.yaml", MethodSFT, extra)
	if err != nil {
		t.Fatal(err)
	}
	return cfg
}

// TestMoEAuxLossCountsOncePerStep checks that the load-balancing loss enters the optimizer
// step as the mean over micro-batches: two identical micro-batches must give the same update
// as one, which fails if each micro-batch adds the full router_aux_loss_coef.
func TestMoEAuxLossCountsOncePerStep(t *testing.T) {
	dir := t.TempDir()
	rec := data.Record{Kind: data.FormatPromptCompletion, Prompt: "12+30=", Completion: "42 and more"}
	one := newTrainer(t, tinyMoEConfig(t, writeJSONL(t, dir, "one.jsonl", []data.Record{rec}), "--gradient_accumulation_steps=1"))
	two := newTrainer(t, tinyMoEConfig(t, writeJSONL(t, dir, "two.jsonl", []data.Record{rec, rec}), "--gradient_accumulation_steps=2"))
	if !one.Model.IsMoE() {
		t.Fatal("the tiny qwen3_moe model has no MoE layer")
	}
	m1, err := one.Step(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	m2, err := two.Step(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if m1.AuxLoss == nil || m2.AuxLoss == nil || *m1.AuxLoss <= 0 {
		t.Fatalf("aux loss not reported: %v %v", m1.AuxLoss, m2.AuxLoss)
	}
	if math.Abs(*m1.AuxLoss-*m2.AuxLoss) > 1e-6 || math.Abs(m1.Loss-m2.Loss) > 1e-6 {
		t.Fatalf("aux %v vs %v, loss %v vs %v", *m1.AuxLoss, *m2.AuxLoss, m1.Loss, m2.Loss)
	}
	if math.Abs(m1.GradNorm-m2.GradNorm) > 1e-5*(1+m1.GradNorm) {
		t.Fatalf("grad norm %v (one micro-batch) vs %v (two identical ones)", m1.GradNorm, m2.GradNorm)
	}
	if len(m1.ExpertLoad) != 2 {
		t.Fatalf("expert load for %d layers, want 2", len(m1.ExpertLoad))
	}
	for _, l := range m1.ExpertLoad {
		sum := 0
		for _, n := range l.Tokens {
			sum += n
		}
		if len(l.Tokens) != 4 || sum != 2*m1.Tokens {
			t.Errorf("layer %d: %v tokens over %d experts, want %d (top-2 of %d tokens)", l.Layer, sum, len(l.Tokens), 2*m1.Tokens, m1.Tokens)
		}
	}
}

// TestExpertLayoutsTrackSingleDeviceLosses trains a tiny qwen3_moe (aux loss on) for 5 steps
// through the trainer under expert-parallel layouts: the losses must follow the single-device
// run, which also checks that the aux-loss gradient is weighted the same way on a plan.
func TestExpertLayoutsTrackSingleDeviceLosses(t *testing.T) {
	path := writeJSONL(t, t.TempDir(), "d.jsonl", pcRecords(40))
	want := steps(t, newTrainer(t, tinyMoEConfig(t, path, "--gradient_accumulation_steps=4")), 5)
	if want[4] >= want[0] {
		t.Fatalf("single-device losses do not fall: %v", want)
	}
	for _, tc := range []struct {
		name  string
		extra []string
	}{
		{"ep=2 on cpu:2", []string{"--devices=cpu:2", "--expert_parallel_size=2"}},
		{"ep=4 on cpu:4", []string{"--devices=cpu:4", "--expert_parallel_size=4"}},
		{"ep=2 fsdp on cpu:4", []string{"--devices=cpu:4", "--expert_parallel_size=2", "--fsdp=true"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tr := newTrainer(t, tinyMoEConfig(t, path, append(tc.extra, "--gradient_accumulation_steps=4")...))
			if !tr.Layout().Parallel {
				t.Fatalf("layout %+v is not a plan", tr.Layout())
			}
			got := steps(t, tr, 5)
			for i := range want {
				if math.Abs(got[i]-want[i]) > 1e-4*math.Abs(want[i]) {
					t.Fatalf("step %d: loss %v, single device %v (all %v vs %v)", i+1, got[i], want[i], got, want)
				}
			}
		})
	}
}
