package train

import (
	"context"
	"fmt"
	"math"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/halo-shell/halo-shell/engine/data"
)

// tinyMoEConfig is a from-scratch tiny qwen3_moe whose aux loss weighs enough to matter.
func tinyMoEConfig(t *testing.T, dataPath string, extra ...string) *Config {
	t.Helper()
	return tinyMoEConfigKV(t, dataPath, 1, extra...)
}

// tinyMoEConfigKV is tinyMoEConfig with kv key/value heads (2 allows tensor parallelism).
func tinyMoEConfigKV(t *testing.T, dataPath string, kv int, extra ...string) *Config {
	t.Helper()
	y := fmt.Sprintf(`init:
  arch: qwen3_moe
  preset: tiny
  overrides: {hidden_size: 32, moe_intermediate_size: 16, num_experts: 4, num_experts_per_tok: 2, num_attention_heads: 2, num_key_value_heads: %d, head_dim: 16, num_hidden_layers: 2, output_router_logits: true, router_aux_loss_coef: 0.5}
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
`, kv, quickTok, dataPath, filepath.Join(t.TempDir(), "out"))
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
	if !one.model.IsMoE() {
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

// isZero reports whether every bias entry is 0 (or there is none).
func isZero(b [][]float32) bool {
	for _, l := range b {
		for _, v := range l {
			if v != 0 {
				return false
			}
		}
	}
	return true
}

// TestStepExpertLoadSumsMicroBatches checks that a step's expert load is the sum of the loads
// of its micro-batches (not the last one's), with max, min and dead experts of that sum: a
// twin trainer runs the same micro-batches one forward at a time from the same weights.
func TestStepExpertLoadSumsMicroBatches(t *testing.T) {
	path := writeJSONL(t, t.TempDir(), "d.jsonl", pcRecords(12))
	cfg := tinyMoEConfig(t, path, "--gradient_accumulation_steps=3")
	tr, twin := newTrainer(t, cfg), newTrainer(t, cfg)
	var want [][]int
	for i := range 3 {
		b, err := twin.loader.Next()
		if err != nil {
			t.Fatal(err)
		}
		if _, _, err := twin.model.ForwardBackward(toModelBatch(b), 1); err != nil {
			t.Fatal(err)
		}
		for j, l := range twin.model.ExpertLoad() {
			if i == 0 {
				want = append(want, make([]int, len(l.Tokens)))
			}
			for e, n := range l.Tokens {
				want[j][e] += n
			}
		}
	}
	m, err := tr.Step(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if len(m.ExpertLoad) != len(want) {
		t.Fatalf("expert load for %d layers, want %d", len(m.ExpertLoad), len(want))
	}
	for j, l := range m.ExpertLoad {
		if !slices.Equal(l.Tokens, want[j]) {
			t.Errorf("layer %d: step load %v, sum of the micro-batches' loads %v", l.Layer, l.Tokens, want[j])
		}
		sum := 0
		for _, n := range l.Tokens {
			sum += n
		}
		if sum != 2*m.Tokens {
			t.Errorf("layer %d: %d assignments for %d tokens at top-2", l.Layer, sum, m.Tokens)
		}
		if l.Max != slices.Max(want[j]) || l.Min != slices.Min(want[j]) {
			t.Errorf("layer %d: max %d min %d for %v", l.Layer, l.Max, l.Min, want[j])
		}
	}
}

// TestPlanExpertLoadAndBiasMatchSingleDevice runs balancing (aux loss off) on one device and on
// parallel plans: every step's summed load and the balancing bias after it must equal the
// single-device run's, and every rank must hold the same bias.
func TestPlanExpertLoadAndBiasMatchSingleDevice(t *testing.T) {
	path := writeJSONL(t, t.TempDir(), "d.jsonl", pcRecords(40))
	common := []string{"--gradient_accumulation_steps=4", "--moe_balancing_rate=0.02", "--router_aux_loss_coef=0"}
	run := func(t *testing.T, tr *Trainer) (loads [][][]int, bias [][][]float32) {
		for range 4 {
			m, err := tr.Step(context.Background())
			if err != nil {
				t.Fatal(err)
			}
			var l [][]int
			for _, x := range m.ExpertLoad {
				l = append(l, x.Tokens)
			}
			loads = append(loads, l)
			bias = append(bias, tr.ExpertBias())
		}
		return loads, bias
	}
	type want struct {
		loads [][][]int
		bias  [][][]float32
	}
	single := map[int]want{} // by key/value heads
	for _, kv := range []int{1, 2} {
		l, b := run(t, newTrainer(t, tinyMoEConfigKV(t, path, kv, common...)))
		if isZero(b[len(b)-1]) {
			t.Fatal("single-device balancing left the bias at zero")
		}
		single[kv] = want{l, b}
	}
	for _, tc := range []struct {
		name  string
		kv    int
		extra []string
	}{
		{"ep=2 on cpu:2", 1, []string{"--devices=cpu:2", "--expert_parallel_size=2"}},
		{"dp=2 on cpu:2", 1, []string{"--devices=cpu:2"}},
		{"ep=2 fsdp on cpu:4", 1, []string{"--devices=cpu:4", "--expert_parallel_size=2", "--fsdp=true"}},
		{"tp=2 on cpu:2", 2, []string{"--devices=cpu:2", "--tensor_parallel_size=2"}},
		{"tp=2 ep=2 etp=2 on cpu:4", 2, []string{"--devices=cpu:4", "--expert_parallel_size=2", "--expert_tensor_parallel_size=2", "--tensor_parallel_size=2"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			wantLoads, wantBias := single[tc.kv].loads, single[tc.kv].bias
			tr := newTrainer(t, tinyMoEConfigKV(t, path, tc.kv, append(tc.extra, common...)...))
			if !tr.Layout().Parallel {
				t.Fatalf("layout %+v is not a plan", tr.Layout())
			}
			loads, bias := run(t, tr)
			for s := range loads {
				if !reflect.DeepEqual(loads[s], wantLoads[s]) {
					t.Fatalf("step %d: load %v, single device %v", s+1, loads[s], wantLoads[s])
				}
				if !reflect.DeepEqual(bias[s], wantBias[s]) {
					t.Fatalf("step %d: bias %v, single device %v", s+1, bias[s], wantBias[s])
				}
			}
			// The host model (checkpoints, evaluation) holds the plan's bias once read.
			hm, err := tr.HostModel()
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(hm.ExpertBias(), wantBias[len(wantBias)-1]) {
				t.Fatalf("host model bias %v, want %v", hm.ExpertBias(), wantBias[len(wantBias)-1])
			}
		})
	}
}

// TestBalancingReducesExpertLoadCV trains a tiny qwen3_moe without the aux loss for 30 steps,
// with and without aux-loss-free balancing: balancing must leave a lower load CV.
func TestBalancingReducesExpertLoadCV(t *testing.T) {
	path := writeJSONL(t, t.TempDir(), "d.jsonl", pcRecords(40))
	meanCV := func(rate string) (float64, int) {
		tr := newTrainer(t, tinyMoEConfig(t, path, "--router_aux_loss_coef=0", "--moe_balancing_rate="+rate, "--gradient_accumulation_steps=2", "--learning_rate=1e-2", "--per_device_train_batch_size=4"))
		if tr.AuxLossCoef() != 0 {
			t.Fatalf("router_aux_loss_coef=0 left the aux weight at %v", tr.AuxLossCoef())
		}
		cv, dead := 0.0, 0
		for s := range 30 {
			m, err := tr.Step(context.Background())
			if err != nil {
				t.Fatal(err)
			}
			if s >= 20 {
				for _, l := range m.ExpertLoad {
					cv += l.CV / float64(10*len(m.ExpertLoad))
					dead += l.Dead
				}
			}
		}
		return cv, dead
	}
	off, offDead := meanCV("0")
	on, onDead := meanCV("0.01")
	t.Logf("mean load CV over steps 21-30: %.3f without balancing (%d dead), %.3f with (%d dead)", off, offDead, on, onDead)
	if !(on < 0.6*off) || onDead >= offDead {
		t.Fatalf("balancing did not even the load: CV %.3f (dead %d) with, %.3f (dead %d) without", on, onDead, off, offDead)
	}
}

// TestMoEConfigRefusals checks that the MoE keys are refused with their name when they are
// out of range or set on a dense model, and that router_aux_loss_coef overrides config.json.
func TestMoEConfigRefusals(t *testing.T) {
	path := writeJSONL(t, t.TempDir(), "d.jsonl", pcRecords(4))
	for _, tc := range []struct {
		name, override, key string
	}{
		{"negative rate", "--moe_balancing_rate=-0.1", "moe_balancing_rate"},
		{"infinite rate", "--moe_balancing_rate=.inf", "moe_balancing_rate"},
		{"negative aux weight", "--router_aux_loss_coef=-1", "router_aux_loss_coef"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			y := fmt.Sprintf("model_name_or_path: x\ndataset: {path: %s}\noutput_dir: o\n", path)
			_, err := ParseConfig([]byte(y), "c.yaml", MethodSFT, []string{tc.override})
			if err == nil || !strings.Contains(err.Error(), tc.key) {
				t.Fatalf("%s: error %v, want one naming %s", tc.override, err, tc.key)
			}
		})
	}
	for _, tc := range []struct{ override, key string }{
		{"--moe_balancing_rate=0.01", "moe_balancing_rate"},
		{"--router_aux_loss_coef=0.1", "router_aux_loss_coef"},
	} {
		t.Run("dense model "+tc.key, func(t *testing.T) {
			_, err := New(tinyConfig(t, path, tc.override))
			if err == nil || !strings.Contains(err.Error(), tc.key) || !strings.Contains(err.Error(), "mixture-of-experts") {
				t.Fatalf("%s on a dense model: %v, want an error naming %s", tc.override, err, tc.key)
			}
		})
	}
	if tr := newTrainer(t, tinyMoEConfig(t, path)); tr.AuxLossCoef() != 0.5 {
		t.Errorf("aux weight %v, want config.json's router_aux_loss_coef 0.5", tr.AuxLossCoef())
	}
	if tr := newTrainer(t, tinyMoEConfig(t, path, "--router_aux_loss_coef=0.25")); tr.AuxLossCoef() != 0.25 {
		t.Errorf("aux weight %v, want the config key's 0.25", tr.AuxLossCoef())
	}
	tr := newTrainer(t, tinyMoEConfig(t, path, "--router_aux_loss_coef=0", "--moe_balancing_rate=0.001"))
	if s := tr.Summary(); !strings.Contains(s, "experts: 2 MoE layers, aux-loss weight 0, aux-loss-free balancing rate 0.001") {
		t.Errorf("summary does not state the MoE settings:\n%s", s)
	}
}

// TestSetLayoutCarriesExpertBias moves a balancing run between layouts (one device, ep=2,
// ep=2 with fsdp, back to one device): the balancing bias travels with the router, so after
// each step it equals the bias of a run that stayed on one device.
func TestSetLayoutCarriesExpertBias(t *testing.T) {
	path := writeJSONL(t, t.TempDir(), "d.jsonl", pcRecords(40))
	common := []string{"--gradient_accumulation_steps=4", "--moe_balancing_rate=0.02", "--router_aux_loss_coef=0"}
	ref, moved := newTrainer(t, tinyMoEConfig(t, path, common...)), newTrainer(t, tinyMoEConfig(t, path, common...))
	for i, spec := range []string{"", "devices=cpu:2 ep=2", "devices=cpu:4 ep=2 fsdp", "dp=1"} {
		if spec != "" {
			if _, err := moved.SetLayout(spec); err != nil {
				t.Fatalf("SetLayout(%q): %v", spec, err)
			}
		}
		steps1(t, ref)
		steps1(t, moved)
		if want, got := ref.ExpertBias(), moved.ExpertBias(); !reflect.DeepEqual(got, want) || isZero(want) {
			t.Fatalf("step %d after SetLayout(%q): bias %v, one device %v", i+1, spec, got, want)
		}
	}
}
