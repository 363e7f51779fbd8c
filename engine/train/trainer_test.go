package train

import (
	"context"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/halo-shell/halo-shell/engine/backend"
	"github.com/halo-shell/halo-shell/engine/backend/cpu"
	"github.com/halo-shell/halo-shell/engine/data"
	"github.com/halo-shell/halo-shell/engine/profile"
)

// quickTok is the quickstart tokenizer (byte-level BPE with ChatML special tokens).
const quickTok = "../../examples/quickstart/tokenizer"

// writeJSONL writes records to dir/name and returns the path.
func writeJSONL(t testing.TB, dir, name string, recs []data.Record) string {
	t.Helper()
	p := filepath.Join(dir, name)
	f, err := os.Create(p)
	if err != nil {
		t.Fatal(err)
	}
	if err := data.WriteJSONL(f, recs); err != nil {
		t.Fatal(err)
	}
	f.Close()
	return p
}

// pcRecords makes prompt/completion additions, n of them.
func pcRecords(n int) []data.Record {
	recs := make([]data.Record, n)
	for i := range recs {
		a, b := (i*7)%23, (i*11)%19
		recs[i] = data.Record{Kind: data.FormatPromptCompletion, Prompt: fmt.Sprintf("%d+%d=", a, b), Completion: fmt.Sprint(a + b)}
	}
	return recs
}

// tinyConfig is a from-scratch tiny qwen3 on the CPU over a prompt/completion file.
func tinyConfig(t *testing.T, dataPath string, extra ...string) *Config {
	t.Helper()
	y := fmt.Sprintf(`init:
  arch: qwen3
  preset: tiny
  overrides: {hidden_size: 32, intermediate_size: 64, num_attention_heads: 2, num_key_value_heads: 1, head_dim: 16, num_hidden_layers: 2}
tokenizer_name_or_path: %s
dataset: {path: %s}
max_length: 32
per_device_train_batch_size: 2
learning_rate: 3e-3
max_steps: 20
warmup_steps: 2
seed: 7
device: cpu
output_dir: %s
`, quickTok, dataPath, filepath.Join(t.TempDir(), "out"))
	cfg, err := ParseConfig([]byte(y), "test.yaml", MethodSFT, extra)
	if err != nil {
		t.Fatal(err)
	}
	return cfg
}

func newTrainer(t *testing.T, cfg *Config) *Trainer {
	t.Helper()
	tr, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { tr.Close() })
	return tr
}

func steps(t *testing.T, tr *Trainer, n int) []float64 {
	t.Helper()
	var losses []float64
	for range n {
		m, err := tr.Step(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		losses = append(losses, m.Loss)
	}
	return losses
}

func TestResumeReproducesLossesExactly(t *testing.T) {
	for _, tc := range []struct {
		name  string
		make  func(*testing.T, string, ...string) *Config
		extra []string
	}{
		{"fp32 adamw_torch", tinyConfig, nil},
		{"bf16 weights with fp32 masters", tinyConfig, []string{"--bf16=true"}},
		{"adamw_bf16 stochastic rounding", tinyConfig, []string{"--bf16=true", "--optim=adamw_bf16"}},
		{"adamw_bf16_nearest", tinyConfig, []string{"--bf16=true", "--optim=adamw_bf16_nearest"}},
		{"qwen3_moe with expert balancing", tinyMoEConfig, []string{"--moe_balancing_rate=0.01", "--router_aux_loss_coef=0"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			path := writeJSONL(t, dir, "d.jsonl", pcRecords(40))
			cfg := tc.make(t, path, append([]string{"--gradient_accumulation_steps=2", "--weight_decay=0.1"}, tc.extra...)...)
			fullRun := newTrainer(t, cfg)
			full := steps(t, fullRun, 6)

			first := newTrainer(t, cfg)
			got := steps(t, first, 3)
			ck := filepath.Join(dir, "ck")
			if err := first.Save(ck); err != nil {
				t.Fatal(err)
			}
			second := newTrainer(t, cfg)
			if err := second.Resume(ck); err != nil {
				t.Fatal(err)
			}
			if second.Steps() != 3 {
				t.Fatalf("resumed at step %d, want 3", second.Steps())
			}
			if b := first.ExpertBias(); b != nil && !reflect.DeepEqual(second.ExpertBias(), b) {
				t.Fatalf("resumed expert bias %v, saved %v", second.ExpertBias(), b)
			}
			got = append(got, steps(t, second, 3)...)
			if cfg.Optim.MoEBalancingRate > 0 {
				b := fullRun.ExpertBias()
				if !reflect.DeepEqual(second.ExpertBias(), b) || isZero(b) {
					t.Fatalf("expert bias after the resumed run %v, uninterrupted %v", second.ExpertBias(), b)
				}
			}
			for i := range full {
				if math.Float64bits(full[i]) != math.Float64bits(got[i]) {
					t.Fatalf("step %d: uninterrupted loss %v, resumed %v (all: %v vs %v)", i+1, full[i], got[i], full, got)
				}
			}
			if !(full[5] < full[0]) {
				t.Fatalf("loss did not fall over 6 steps: %v", full)
			}
			for _, f := range []string{"config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json", StateFile, OptimizerFile} {
				if _, err := os.Stat(filepath.Join(ck, f)); err != nil {
					t.Errorf("checkpoint lacks %s", f)
				}
			}
			leftovers, _ := filepath.Glob(filepath.Join(dir, ".ck.tmp-*"))
			if len(leftovers) > 0 {
				t.Fatalf("temporary directories left: %v", leftovers)
			}
			// Saving again over an existing checkpoint replaces it.
			if err := second.Save(ck); err != nil {
				t.Fatal(err)
			}
			other := tc.make(t, path, append([]string{"--per_device_train_batch_size=3"}, tc.extra...)...)
			if err := newTrainer(t, other).Resume(ck); err == nil || !strings.Contains(err.Error(), "data plan") {
				t.Fatalf("resume with another batch size: %v", err)
			}
		})
	}
}

func TestResumeRefusesAnotherOptimizer(t *testing.T) {
	dir := t.TempDir()
	path := writeJSONL(t, dir, "d.jsonl", pcRecords(20))
	tr := newTrainer(t, tinyConfig(t, path, "--bf16=true"))
	steps(t, tr, 1)
	ck := filepath.Join(dir, "ck")
	if err := tr.Save(ck); err != nil {
		t.Fatal(err)
	}
	other := newTrainer(t, tinyConfig(t, path, "--bf16=true", "--optim=adamw_bf16"))
	if err := other.Resume(ck); err == nil || !strings.Contains(err.Error(), "optim") {
		t.Fatalf("resuming an adamw_torch checkpoint with adamw_bf16: %v", err)
	}
	if err := other.Resume(filepath.Join(dir, "nothing")); err == nil || !strings.Contains(err.Error(), "checkpoint") {
		t.Fatalf("resuming from a missing directory: %v", err)
	}
}

func TestGradientAccumulationMatchesOneBigMicroBatch(t *testing.T) {
	dir := t.TempDir()
	// Two documents with different numbers of targets, so a mean of per-micro-batch means
	// would differ from the mean over the step's tokens.
	recs := []data.Record{
		{Kind: data.FormatPromptCompletion, Prompt: "12+30=", Completion: "42"},
		{Kind: data.FormatPromptCompletion, Prompt: "1+1=", Completion: "2 is the answer to 1+1"},
	}
	path := writeJSONL(t, dir, "two.jsonl", recs)
	one := newTrainer(t, tinyConfig(t, path, "--packing=false", "--per_device_train_batch_size=2", "--gradient_accumulation_steps=1"))
	two := newTrainer(t, tinyConfig(t, path, "--packing=false", "--per_device_train_batch_size=1", "--gradient_accumulation_steps=2"))
	m1, err := one.Step(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	m2, err := two.Step(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if m1.Targets != m2.Targets || m1.Tokens != m2.Tokens {
		t.Fatalf("steps saw different data: %+v vs %+v", m1, m2)
	}
	close := func(a, b, tol float64) bool { return math.Abs(a-b) <= tol*(1+math.Abs(a)) }
	if !close(m1.Loss, m2.Loss, 1e-6) || !close(m1.GradNorm, m2.GradNorm, 1e-5) {
		t.Fatalf("loss %v vs %v, grad norm %v vs %v", m1.Loss, m2.Loss, m1.GradNorm, m2.GradNorm)
	}
	maxDiff := 0.0
	for _, s := range one.model.Specs {
		a, err := one.model.ParamFloat32(s.Name)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := two.model.ParamFloat32(s.Name)
		for i := range a {
			maxDiff = max(maxDiff, math.Abs(float64(a[i]-b[i])))
		}
	}
	// One AdamW step moves each weight by about lr = 3e-3 * warmup factor; the two runs must
	// agree far below that.
	if maxDiff > 1e-5 {
		t.Fatalf("parameters after one step differ by up to %g", maxDiff)
	}
}

func TestSFTTrainsOnlyOnCompletions(t *testing.T) {
	c, err := loadCodec(quickTok, false)
	if err != nil {
		t.Fatal(err)
	}
	rec := data.Record{Kind: data.FormatPromptCompletion, Prompt: "What is 2+2?", Completion: "4"}
	for _, tc := range []struct {
		method    string
		wantTrain int
	}{{MethodSFT, 2}, {MethodPretrain, -1}} {
		d, err := c.encoder(tc.method, 1<<20)(rec)
		if err != nil {
			t.Fatal(err)
		}
		prompt := len(c.ids(rec.Prompt))
		n := 0
		for i, tr := range d.Train {
			if tr {
				n++
			}
			if tc.method == MethodSFT && tr != (i >= prompt) {
				t.Fatalf("sft: token %d train=%v; prompt has %d tokens", i, tr, prompt)
			}
		}
		want := tc.wantTrain
		if want < 0 {
			want = len(d.Tokens)
		}
		if n != want {
			t.Fatalf("%s: %d trained tokens, want %d (ids %v)", tc.method, n, want, d.Tokens)
		}
		if d.Tokens[len(d.Tokens)-1] != c.eos {
			t.Fatalf("%s: document does not end with eos", tc.method)
		}
	}
}

func TestSFTChatMasksOnlyAssistantTokens(t *testing.T) {
	c, err := loadCodec(quickTok, false)
	if err != nil {
		t.Fatal(err)
	}
	rec := data.Record{Kind: data.FormatMessages, Messages: []data.Message{
		{Role: "system", Content: "Be brief."}, {Role: "user", Content: "What is 37+48?"}, {Role: "assistant", Content: "85"},
		{Role: "user", Content: "And 1+1?"}, {Role: "assistant", Content: "2"},
	}}
	d, err := c.encoder(MethodSFT, 1<<20)(rec)
	if err != nil {
		t.Fatal(err)
	}
	var trained []int32
	for i, tr := range d.Train {
		if tr {
			trained = append(trained, d.Tokens[i])
		}
	}
	// The assistant replies and their end-of-turn markers: "85<|im_end|>" and "2<|im_end|>".
	want := append(c.ids("85<|im_end|>"), c.ids("2<|im_end|>")...)
	if fmt.Sprint(trained) != fmt.Sprint(want) {
		t.Fatalf("trained tokens %v (%q), want %v", trained, c.decode(trained), want)
	}
	p, err := c.generationPrompt(rec.Messages[:2])
	if err != nil {
		t.Fatal(err)
	}
	if fmt.Sprint(p) != fmt.Sprint(c.ids("<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nWhat is 37+48?<|im_end|>\n<|im_start|>assistant\n")) {
		t.Fatalf("generation prompt %v", p)
	}
}

func TestSetHyperTakesEffectNextStep(t *testing.T) {
	dir := t.TempDir()
	path := writeJSONL(t, dir, "d.jsonl", pcRecords(20))
	tr := newTrainer(t, tinyConfig(t, path, "--lr_scheduler_type=constant", "--warmup_steps=0"))
	m, err := tr.Step(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if m.LR != 3e-3 {
		t.Fatalf("lr %v, want the configured 3e-3", m.LR)
	}
	if err := tr.SetLR(1e-4); err != nil {
		t.Fatal(err)
	}
	if tr.LR() != 1e-4 {
		t.Fatalf("next lr %v", tr.LR())
	}
	m, _ = tr.Step(context.Background())
	if m.LR != 1e-4 {
		t.Fatalf("lr after SetLR %v, want 1e-4", m.LR)
	}
	for _, bad := range []func(h *Hyper){
		func(h *Hyper) { h.LearningRate = -1 },
		func(h *Hyper) { h.MaxGradNorm = -1 },
		func(h *Hyper) { h.LRSchedulerType = "cosin" },
		func(h *Hyper) { h.GradientAccumulationSteps = 0 },
		func(h *Hyper) { h.AdamBeta1 = 0.5 },
	} {
		h := tr.Hyper()
		bad(&h)
		if err := tr.SetHyper(h); err == nil {
			t.Errorf("SetHyper(%+v) accepted", h)
		}
	}
	if tr.Hyper().LearningRate != 1e-4 {
		t.Fatal("a refused SetHyper changed the hyperparameters")
	}
	h := tr.Hyper()
	h.GradientAccumulationSteps = 3
	if err := tr.SetHyper(h); err != nil {
		t.Fatal(err)
	}
	one, _ := tr.Step(context.Background())
	if one.Tokens <= m.Tokens {
		t.Fatalf("3 micro-batches processed %d tokens, 1 processed %d", one.Tokens, m.Tokens)
	}
}

func TestStepReportsTimeByOpClassWhenTheBackendDoes(t *testing.T) {
	dir := t.TempDir()
	path := writeJSONL(t, dir, "d.jsonl", pcRecords(20))
	b, err := backend.Open("cpu")
	if err != nil {
		t.Fatal(err)
	}
	rec := profile.NewRecorder()
	tr, err := NewOn(tinyConfig(t, path), profile.Wrap(b, rec))
	if err != nil {
		t.Fatal(err)
	}
	defer tr.Close()
	rec.Enable(true, false)
	m, err := tr.Step(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	total := 0.0
	for _, s := range m.TimeByOpS {
		total += s
	}
	if len(m.TimeByOpS) < 2 || total <= 0 || total > m.StepTimeS*1.01 {
		t.Fatalf("time by op %v (sum %v) for a step of %v s", m.TimeByOpS, total, m.StepTimeS)
	}
}

func TestContinueFromSavedModelAndMemoryEstimate(t *testing.T) {
	dir := t.TempDir()
	path := writeJSONL(t, dir, "d.jsonl", pcRecords(20))
	cfg := tinyConfig(t, path)
	tr := newTrainer(t, cfg)
	steps(t, tr, 2)
	modelDir := filepath.Join(dir, "model")
	if err := tr.SaveModel(modelDir); err != nil {
		t.Fatal(err)
	}
	want, _ := tr.model.ParamFloat32("model.norm.weight")

	mc, err := ModelConfigFor(cfg)
	if err != nil {
		t.Fatal(err)
	}
	est, err := EstimateMemory(cfg, mc)
	if err != nil {
		t.Fatal(err)
	}
	if est.Params != int64(tr.model.NumParams()) || est.ParamBytes != 4*est.Params || est.OptimBytes != 8*est.Params {
		t.Fatalf("estimate %+v for a model of %d parameters", est, tr.model.NumParams())
	}
	if est.Total() <= est.ParamBytes+est.GradBytes+est.OptimBytes || !strings.Contains(est.String(), "total") {
		t.Fatalf("estimate without activations: %s", est)
	}

	y := fmt.Sprintf("model_name_or_path: %s\ndataset: {path: %s}\nmax_length: 32\nmax_steps: 1\ndevice: cpu\noutput_dir: %s\n", modelDir, path, filepath.Join(dir, "out2"))
	cfg2, err := ParseConfig([]byte(y), "c.yaml", MethodSFT, nil)
	if err != nil {
		t.Fatal(err)
	}
	tr2 := newTrainer(t, cfg2)
	got, _ := tr2.model.ParamFloat32("model.norm.weight")
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatal("model_name_or_path did not load the saved weights")
	}
	if tr2.tok.dir != modelDir {
		t.Fatalf("tokenizer from %s, want the model directory", tr2.tok.dir)
	}
	if _, err := tr2.Step(context.Background()); err != nil {
		t.Fatal(err)
	}
}

func TestEpochsPlanTheNumberOfSteps(t *testing.T) {
	dir := t.TempDir()
	path := writeJSONL(t, dir, "d.jsonl", pcRecords(50))
	for _, tc := range []struct {
		epochs string
		accum  int
	}{{"1", 1}, {"2.5", 1}, {"1", 3}} {
		cfg := tinyConfig(t, path, "--max_steps=-1", "--warmup_steps=0", "--num_train_epochs="+tc.epochs, fmt.Sprintf("--gradient_accumulation_steps=%d", tc.accum))
		tr := newTrainer(t, cfg)
		per := tr.loader.BatchesPerEpoch()
		want := int(math.Ceil(cfg.Sched.NumTrainEpochs * float64(per) / float64(tc.accum)))
		if tr.TotalSteps() != want || want < 1 {
			t.Errorf("epochs %s accum %d: %d steps for %d micro-batches per epoch, want %d", tc.epochs, tc.accum, tr.TotalSteps(), per, want)
		}
	}
}

func TestChatRecordsNeedAChatTemplate(t *testing.T) {
	dir := t.TempDir()
	for _, f := range []string{"tokenizer.json"} {
		raw, err := os.ReadFile(filepath.Join(quickTok, f))
		if err != nil {
			t.Fatal(err)
		}
		os.WriteFile(filepath.Join(dir, f), raw, 0o644)
	}
	os.WriteFile(filepath.Join(dir, "tokenizer_config.json"), []byte(`{"eos_token": "<|endoftext|>"}`), 0o644)
	c, err := loadCodec(dir, false)
	if err != nil {
		t.Fatal(err)
	}
	_, err = c.encoder(MethodSFT, 1<<20)(data.Record{Kind: data.FormatMessages, Messages: []data.Message{{Role: "user", Content: "q"}, {Role: "assistant", Content: "a"}}})
	if err == nil || !strings.Contains(err.Error(), "no chat_template") {
		t.Fatalf("chat record without a template: %v", err)
	}
	d, err := c.encoder(MethodPretrain, 1<<20)(data.Record{Kind: data.FormatText, Text: "hello"})
	if err != nil || d.Tokens[len(d.Tokens)-1] != c.eos || d.Targets() != len(d.Tokens)-1 {
		t.Fatalf("pretraining text: %+v, %v", d, err)
	}
}

func TestScheduleHoldsItsFinalValuePastTheEnd(t *testing.T) {
	dir := t.TempDir()
	path := writeJSONL(t, dir, "d.jsonl", pcRecords(20))
	tr := newTrainer(t, tinyConfig(t, path, "--max_steps=4", "--warmup_steps=1", "--lr_scheduler_type=cosine"))
	var lrs []float64
	for range 6 {
		m, err := tr.Step(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		lrs = append(lrs, m.LR)
	}
	// HF cosine with 1 warmup step over 4 steps: 0, peak, peak*0.75, peak*0.25, then 0 onwards.
	want := []float64{0, 3e-3, 3e-3 * 0.75, 3e-3 * 0.25, 0, 0}
	for i := range want {
		if math.Abs(lrs[i]-want[i]) > 1e-12 {
			t.Fatalf("learning rates %v, want %v", lrs, want)
		}
	}
	if !tr.Done() {
		t.Fatal("not done after the planned steps")
	}
}

// TestEmptyOutputsAreAlwaysWritten trains tiny qwen3 models (fp32; bf16 with gradient
// accumulation) and a tiny qwen3_moe on a CPU backend
// whose Empty tensors start as NaN and on a plain one: the losses and gradient norms of every
// step agree bit for bit, so no layer reads an output it asked Empty for before writing it, or
// accumulates into one.
func TestEmptyOutputsAreAlwaysWritten(t *testing.T) {
	dir := t.TempDir()
	path := writeJSONL(t, dir, "d.jsonl", pcRecords(20))
	for _, c := range []struct {
		name string
		cfg  func() *Config
	}{
		{"qwen3_f32", func() *Config { return tinyConfig(t, path) }},
		{"qwen3_bf16", func() *Config { return gpuDenseConfig(t, path, 2) }},
		{"qwen3_moe_bf16", func() *Config { return gpuMoEConfig(t, path, 1) }},
	} {
		t.Run(c.name, func(t *testing.T) {
			var runs [2][]float64
			for i, poison := range []bool{false, true} {
				tr, err := NewOn(c.cfg(), cpu.New(cpu.Options{Workers: 1, PoisonEmpty: poison}))
				if err != nil {
					t.Fatal(err)
				}
				for s := 0; s < 3; s++ {
					m, err := tr.Step(context.Background())
					if err != nil {
						t.Fatal(err)
					}
					runs[i] = append(runs[i], m.Loss, m.GradNorm)
				}
				tr.Close()
			}
			for k := range runs[0] {
				if runs[0][k] != runs[1][k] || math.IsNaN(runs[1][k]) {
					t.Fatalf("plain %v, NaN-filled Empty %v", runs[0], runs[1])
				}
			}
		})
	}
}
