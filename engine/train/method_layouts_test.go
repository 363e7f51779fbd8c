package train

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/halo-shell/halo-shell/engine/comm/rendezvous"
	"github.com/halo-shell/halo-shell/engine/mesh"
)

// The preference methods, reward models and GRPO on parallel layouts of simulated CPU devices:
// each layout's steps track the single device's (losses and the method's metrics), and context
// parallelism is refused with rule cp-sequence-loss before any weight loads.

// methodCase is one method's config: a tiny model (two kv heads, so tp=2 divides them; a
// mixture of experts where moe is set, for expert parallelism) and two micro-batches per step.
type methodCase struct {
	method string
	data   func(t *testing.T, dir string) string // the dataset: block of the YAML
	keys   string                                // the method's own keys
	moe    bool
}

var methodCases = withMoE([]methodCase{
	{method: MethodDPO, data: func(t *testing.T, dir string) string { return "{path: " + prefRows(t, dir, 24) + "}" }, keys: "beta: 0.5\nprecompute_ref_log_probs: false\n"},
	{method: MethodSMPO, data: func(t *testing.T, dir string) string { return "{path: " + prefRows(t, dir, 24) + "}" }, keys: "margin_ramp_ratio: 0.5\n"},
	{method: MethodKTO, data: func(t *testing.T, dir string) string { return "{path: " + ktoRows(t, dir, 24) + "}" }},
	{method: MethodReward, data: func(*testing.T, string) string {
		return "{synthetic: {kind: arithmetic, max_operand: 9, train: 48, eval: 8}}"
	}, keys: "center_rewards_coefficient: 0.01\n"},
	{method: MethodGRPO, data: func(*testing.T, string) string {
		return "{synthetic: {kind: arithmetic, seed: 1, max_operand: 20, train: 200, eval: 20}}"
	}, keys: "num_generations: 4\nmax_completion_length: 2\nreward_funcs: [{name: format, pattern: '.*[aeiou].*'}]\n"},
})

// withMoE is cases followed by each of them on a mixture-of-experts model.
func withMoE(cases []methodCase) []methodCase {
	out := slices.Clone(cases)
	for _, c := range cases {
		c.moe = true
		out = append(out, c)
	}
	return out
}

func (c methodCase) name() string {
	if c.moe {
		return c.method + "_moe"
	}
	return c.method
}

func methodLayoutConfig(t *testing.T, c methodCase, dataBlock string, extra ...string) *Config {
	t.Helper()
	arch := "arch: qwen3\n  preset: tiny\n  overrides: {hidden_size: 32, intermediate_size: 64, num_attention_heads: 2, num_key_value_heads: 2, head_dim: 16, num_hidden_layers: 2}"
	if c.moe {
		arch = "arch: qwen3_moe\n  preset: tiny\n  overrides: {hidden_size: 32, moe_intermediate_size: 16, num_experts: 4, num_experts_per_tok: 2, num_attention_heads: 2, num_key_value_heads: 2, head_dim: 16, num_hidden_layers: 2, output_router_logits: true, router_aux_loss_coef: 0.1}"
	}
	batch := 4
	if c.method == MethodGRPO {
		batch = 8 // two prompts x num_generations 4 per micro-batch
	}
	y := fmt.Sprintf(`init:
  %s
tokenizer_name_or_path: %s
dataset: %s
max_length: 32
per_device_train_batch_size: %d
gradient_accumulation_steps: 2
learning_rate: 3e-3
lr_scheduler_type: constant
max_steps: 20
seed: 7
device: cpu
output_dir: %s
%s`, arch, quickTok, dataBlock, batch, filepath.Join(t.TempDir(), "out"), c.keys)
	cfg, err := ParseConfig([]byte(y), c.method+".yaml", c.method, extra)
	if err != nil {
		t.Fatal(err)
	}
	return cfg
}

// methodLayouts are the layouts every method is run on (on cpu:2, whose two micro-batches per
// step split one per data rank), and the normalised layout each must report.
var methodLayouts = []struct {
	name   string
	extra  []string
	layout string
	moe    bool // only for a mixture-of-experts model
}{
	{"dp=2", []string{"--devices=cpu:2"}, "dp=2 tp=1 cp=1 ep=1 etp=1", false},
	{"dp=2 fsdp", []string{"--devices=cpu:2", "--fsdp=true"}, "dp=2 fsdp tp=1 cp=1 ep=1 etp=1", false},
	{"tp=2", []string{"--devices=cpu:2", "--tensor_parallel_size=2"}, "dp=1 tp=2 cp=1 ep=1 etp=1", false},
	{"dp=2 ep=2", []string{"--devices=cpu:2", "--expert_parallel_size=2"}, "dp=2 tp=1 cp=1 ep=2 etp=1", true},
}

// TestMethodLayoutsTrackSingleDevice runs three steps of every method on one device and on
// each layout, from the same initial weights and data, and checks each step's loss (relative
// 1e-4; GRPO's is about 0 before clipping, so plus 1e-9), its gradient norm (relative 1e-3,
// and not 0: the reward varies within the groups) and the method's metrics (1e-3 of their
// size, plus 1e-6).
func TestMethodLayoutsTrackSingleDevice(t *testing.T) {
	const n = 3
	for _, c := range methodCases {
		t.Run(c.name(), func(t *testing.T) {
			block := c.data(t, t.TempDir())
			want := methodSteps(t, newTrainer(t, methodLayoutConfig(t, c, block)), n)
			for _, l := range methodLayouts {
				if l.moe && !c.moe {
					continue
				}
				t.Run(l.name, func(t *testing.T) {
					tr := newTrainer(t, methodLayoutConfig(t, c, block, l.extra...))
					if got := tr.Layout(); !got.Parallel || got.Layout != l.layout {
						t.Fatalf("layout %+v, want %q on a plan", got, l.layout)
					}
					got := methodSteps(t, tr, n)
					for i := range want {
						if !(abs(got[i].Loss-want[i].Loss) <= 1e-4*max(abs(got[i].Loss), abs(want[i].Loss))+1e-9) {
							t.Fatalf("step %d: loss %v, single device %v", i+1, got[i].Loss, want[i].Loss)
						}
						if want[i].GradNorm == 0 || !relClose(got[i].GradNorm, want[i].GradNorm, 1e-3) {
							t.Fatalf("step %d: gradient norm %v, single device %v (it must not be 0)", i+1, got[i].GradNorm, want[i].GradNorm)
						}
						if len(got[i].Method) != len(want[i].Method) {
							t.Fatalf("step %d: metrics %v, single device %v", i+1, got[i].Method, want[i].Method)
						}
						for k, w := range want[i].Method {
							// Accuracies count the pairs whose margin is positive: at the first
							// step the policy is the reference and every margin is within
							// rounding of 0, so a pair counts either way.
							if strings.HasPrefix(k, "time/") || k == "rewards/accuracies" {
								continue
							}
							if g, ok := got[i].Method[k]; !ok || !(abs(g-w) <= 1e-3*abs(w)+1e-6) {
								t.Errorf("step %d: %s = %v, single device %v", i+1, k, g, w)
							}
						}
					}
				})
			}
		})
	}
}

func abs(x float64) float64 {
	if x < 0 {
		return -x
	}
	return x
}

func methodSteps(t *testing.T, tr *Trainer, n int) []StepMetrics {
	t.Helper()
	var out []StepMetrics
	for range n {
		m, err := tr.Step(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, m)
	}
	return out
}

// TestMethodsRefuseContextParallelism: every method whose loss reads whole sequences refuses
// cp=2, at New and at SetLayout, naming rule cp-sequence-loss and a layout that works, while
// sft accepts it.
func TestMethodsRefuseContextParallelism(t *testing.T) {
	for _, c := range methodCases {
		if c.moe {
			continue
		}
		t.Run(c.name(), func(t *testing.T) {
			block := c.data(t, t.TempDir())
			_, err := New(methodLayoutConfig(t, c, block, "--devices=cpu:2", "--context_parallel_size=2"))
			var le *mesh.LayoutError
			if !errors.As(err, &le) || le.Rule != RuleCPSequenceLoss || le.Suggest.CP != 1 || !strings.Contains(err.Error(), c.method) {
				t.Fatalf("cp=2: error %v, want rule %s naming %s with a layout without cp", err, RuleCPSequenceLoss, c.method)
			}
			tr := newTrainer(t, methodLayoutConfig(t, c, block))
			if _, err := tr.SetLayout("dp=1 cp=2"); !errors.As(err, &le) || le.Rule != RuleCPSequenceLoss {
				t.Fatalf("SetLayout cp=2: error %v, want rule %s", err, RuleCPSequenceLoss)
			}
			if got := tr.Layout(); got.Parallel {
				t.Fatalf("the refused move left the run on %+v", got)
			}
			if _, err := tr.SetLayout("dp=2"); err != nil {
				t.Fatalf("SetLayout dp=2: %v", err)
			}
			methodSteps(t, tr, 1)
		})
	}
}

// TestMethodsRefuseRunsAcrossNodes: a method that scores whole micro-batches on the process
// holding the plan is refused across nodes before the rendezvous, naming the method.
func TestMethodsRefuseRunsAcrossNodes(t *testing.T) {
	c := methodCases[0]
	cfg := methodLayoutConfig(t, c, c.data(t, t.TempDir()), "--devices=cpu:1")
	start := time.Now()
	_, err := NewOnNodes(context.Background(), cfg, rendezvous.Config{NNodes: 2, Addr: "127.0.0.1:1", Token: "x", Timeout: 20 * time.Second})
	if err == nil || !strings.Contains(err.Error(), "method "+c.method) || !strings.Contains(err.Error(), "one node") {
		t.Fatalf("dpo across 2 nodes: error %v, want a refusal naming the method", err)
	}
	if el := time.Since(start); el > 10*time.Second {
		t.Errorf("the refusal took %s", el)
	}
}
