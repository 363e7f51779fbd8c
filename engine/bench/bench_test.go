package bench

import (
	"context"
	"encoding/json"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/halo-shell/halo-shell/engine/backend"
	_ "github.com/halo-shell/halo-shell/engine/backend/cpu"
	"github.com/halo-shell/halo-shell/engine/data"
	"github.com/halo-shell/halo-shell/engine/models"
	"github.com/halo-shell/halo-shell/engine/tensor"
	"time"

	"github.com/halo-shell/halo-shell/engine/profile"
)

// tinyLlama saves a random tiny llama (tied embeddings, vocab 256) with our own save code.
func tinyLlama(t *testing.T) string {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "ckpt")
	saveTinyModel(t, dir, tensor.BF16, 5, "num_attention_heads=4", "num_key_value_heads=2", "head_dim=8")
	return dir
}

// saveTinyModel writes a random tiny llama (hidden 32, MLP 64, tied embeddings) with the
// config overrides set, as halo-shell run init-model does.
func saveTinyModel(t *testing.T, dir string, dt tensor.DType, seed uint64, set ...string) {
	t.Helper()
	b, err := backend.Open("cpu")
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	spec := models.InitSpec{Arch: "llama", Preset: "tiny", OutDir: dir, Seed: seed, DType: dt,
		Set: append([]string{"hidden_size=32", "intermediate_size=64", "tie_word_embeddings=true"}, set...)}
	if _, err := models.InitCheckpoint(b, spec); err != nil {
		t.Fatal(err)
	}
}

// tokenFile writes rows of length n that cycle through a period of 5 ids.
func tokenFile(t *testing.T, rows, n int) string {
	t.Helper()
	recs := make([]data.Record, rows)
	for i := range recs {
		ids := make([]int32, n)
		for j := range ids {
			ids[j] = int32(40 + (i+j)%5)
		}
		recs[i] = data.Record{Kind: data.FormatTokens, IDs: ids}
	}
	p := filepath.Join(t.TempDir(), "tokens.jsonl")
	f, err := os.Create(p)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if err := data.WriteJSONL(f, recs); err != nil {
		t.Fatal(err)
	}
	return p
}

func tinyOptions(t *testing.T) Options {
	return Options{Model: tinyLlama(t), Data: tokenFile(t, 6, 16), Device: "cpu", Steps: 3, Warmup: 1,
		BatchSize: 2, SeqLen: 16, LR: 1e-2}
}

func TestRunTrainsAndReports(t *testing.T) {
	o := tinyOptions(t)
	var seen []StepResult
	o.Progress = func(s StepResult) { seen = append(seen, s) }
	r, err := Run(context.Background(), o)
	if err != nil {
		t.Fatal(err)
	}
	if len(r.Steps) != 3 || len(r.Losses) != 3 {
		t.Fatalf("%d steps and %d losses, want 3 timed steps", len(r.Steps), len(r.Losses))
	}
	if !(r.Losses[2] < r.Losses[0]-0.3) {
		t.Fatalf("losses %v do not fall on a periodic sequence at lr 1e-2", r.Losses)
	}
	if len(seen) != 4 || !seen[3].Profiled || seen[2].Profiled {
		t.Fatalf("progress saw %+v, want 3 timed steps then the profiled one", seen)
	}
	for i, s := range r.Steps {
		if s.Step != i+1 || s.Tokens != 2*16 || !(s.StepTimeS > 0) || math.Abs(s.TokensPerS*s.StepTimeS-32) > 1e-6 {
			t.Fatalf("step %d: %+v", i, s)
		}
		if s.LR != 1e-2 {
			t.Fatalf("step %d lr %v, want the constant 1e-2", i, s.LR)
		}
	}
	// The median is over the steps after warmup: two of them here.
	want := (r.Steps[1].TokensPerS + r.Steps[2].TokensPerS) / 2
	if math.Abs(r.TokensPerS-want) > 1e-9*want {
		t.Fatalf("median tokens/s %v, want %v (steps 2 and 3)", r.TokensPerS, want)
	}
	mi := r.Model
	// Tied llama: embedding 256x32, per layer 2 norms + q,k,v,o + 3 MLP matrices, final norm.
	params := int64(256*32 + 2*(2*32+32*32+2*32*16+32*32+3*32*64) + 32)
	if mi.Params != params || mi.Layers != 2 || mi.Heads != 4 || mi.KVHeads != 2 || mi.HeadDim != 8 || !mi.Tied || mi.DType != "bf16" {
		t.Fatalf("model info %+v (want %d params)", mi, params)
	}
	if f := FLOPsPerToken(params, 2, 16, 4, 8); r.FLOPsPerToken != f || f != 6*float64(params)+6*2*16*32 {
		t.Fatalf("flops per token %v, want %v", r.FLOPsPerToken, f)
	}
	if mfu := r.FLOPsPerToken * r.TokensPerS / (H200PeakTFLOPS * 1e12); math.Abs(r.MFU-mfu) > 1e-12 {
		t.Fatalf("mfu %v, want %v", r.MFU, mfu)
	}
	if r.Memory.PeakAllocated <= 0 || r.Memory.PeakAllocatedGiB != float64(r.Memory.PeakAllocated)/(1<<30) {
		t.Fatalf("memory %+v", r.Memory)
	}
	bd := r.Breakdown
	if bd == nil || bd.Step != 4 || bd.Ops == 0 || bd.Syncs == 0 || bd.ByClassS["matmul"] <= 0 || bd.ByClassS["optimizer"] <= 0 {
		t.Fatalf("breakdown %+v", bd)
	}
	sum := 0.0
	for _, f := range bd.Fraction {
		sum += f
	}
	if math.Abs(sum-1) > 1e-9 {
		t.Fatalf("breakdown fractions add up to %v: %v", sum, bd.Fraction)
	}
	// The top ops are the step's ops by name: sorted, within their class's time, and led by ops
	// that ran (the matmul class is among them).
	if len(bd.TopOps) == 0 || len(bd.TopOps) > topOpsKept {
		t.Fatalf("%d top ops, want 1 to %d", len(bd.TopOps), topOpsKept)
	}
	byClass := map[string]float64{}
	seenMatmul := false
	for i, o := range bd.TopOps {
		if i > 0 && o.S > bd.TopOps[i-1].S {
			t.Fatalf("top ops not sorted by time: %+v", bd.TopOps)
		}
		if o.Calls <= 0 || o.Name == "" {
			t.Fatalf("top op %+v", o)
		}
		byClass[o.Class] += o.S
		seenMatmul = seenMatmul || o.Class == "matmul"
	}
	for c, v := range byClass {
		if v > bd.ByClassS[c]*(1+1e-9)+1e-12 {
			t.Errorf("top ops of class %s take %v s, more than the class's %v s", c, v, bd.ByClassS[c])
		}
	}
	if !seenMatmul {
		t.Errorf("no matmul op among the top ops %+v", bd.TopOps)
	}
	raw, err := json.Marshal(r)
	if err != nil {
		t.Fatal(err)
	}
	var fields map[string]any
	if err := json.Unmarshal(raw, &fields); err != nil {
		t.Fatal(err)
	}
	for _, k := range []string{"engine", "version", "device", "model", "settings", "steps", "losses", "tokens_per_s",
		"step_time_s", "memory", "flops_per_token", "flops_formula", "peak_tflops", "mfu", "breakdown", "load_s"} {
		if _, ok := fields[k]; !ok {
			t.Errorf("report JSON lacks %q", k)
		}
	}
}

func TestRunRefusesWhatItCannotMeasure(t *testing.T) {
	o := tinyOptions(t)
	for _, tc := range []struct {
		name string
		edit func(*Options)
		want string
	}{
		{"too few rows", func(o *Options) { o.Steps = 4 }, "has 6 rows; 4 steps of 2 rows need 8"},
		{"rows longer than the sequence", func(o *Options) { o.SeqLen = 8 }, "6 rows are longer than the sequence length 8"},
		{"no model", func(o *Options) { o.Model = "" }, "--model"},
		{"missing model", func(o *Options) { o.Model = filepath.Join(t.TempDir(), "none") }, "model_name_or_path"},
		{"no data", func(o *Options) { o.Data = "" }, "--data"},
		{"bf16 optimizer on fp32", func(o *Options) { o.FP32 = true }, "keeps bf16 weights: drop fp32"},
		{"unknown optimizer", func(o *Options) { o.Optim = "sgd" }, `"sgd" is not one of`},
		{"bad peak", func(o *Options) { o.PeakTFLOPS = -1 }, "peak TFLOP/s"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			oo := o
			tc.edit(&oo)
			_, err := Run(context.Background(), oo)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("error %v, want it to contain %q", err, tc.want)
			}
		})
	}
}

func TestMedian(t *testing.T) {
	for _, tc := range []struct {
		in   []float64
		want float64
	}{{nil, 0}, {[]float64{3}, 3}, {[]float64{5, 1, 3}, 3}, {[]float64{4, 1, 3, 2}, 2.5}} {
		if got := median(tc.in); got != tc.want {
			t.Errorf("median(%v) = %v, want %v", tc.in, got, tc.want)
		}
	}
}

// tinyMoE saves a random tiny qwen3_moe (2 layers, 4 experts of width 16, top-2, vocab 256)
// with our own save code.
func tinyMoE(t *testing.T, dt tensor.DType) string {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "moe")
	b, err := backend.Open("cpu")
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	spec := models.InitSpec{Arch: "qwen3_moe", Preset: "tiny", OutDir: dir, Seed: 11, DType: dt,
		Set: []string{"hidden_size=32", "moe_intermediate_size=16", "num_local_experts=4", "num_experts_per_tok=2",
			"num_attention_heads=2", "num_key_value_heads=1", "head_dim=16", "num_hidden_layers=2", "vocab_size=256"}}
	if _, err := models.InitCheckpoint(b, spec); err != nil {
		t.Fatal(err)
	}
	return dir
}

// TestExpertParallelReportsLayoutMemoryAndAllToAll runs the benchmark of a tiny MoE on two
// simulated devices with ep=2 and checks the layout, the per-device memory, the dispatch and
// combine shares, the active parameter count and that the losses follow the one-device run
// with the same micro-batches (two of one row per step).
func TestExpertParallelReportsLayoutMemoryAndAllToAll(t *testing.T) {
	model := tinyMoE(t, tensor.BF16)
	rows := tokenFile(t, 6, 16)
	base := Options{Model: model, Data: rows, Steps: 3, Warmup: 1, BatchSize: 2, SeqLen: 16, LR: 1e-2}
	one := base
	one.Device, one.GradAccum, one.NoProfile = "cpu", 2, true
	ref, err := Run(context.Background(), one)
	if err != nil {
		t.Fatal(err)
	}
	ep := base
	ep.Devices, ep.EP = "cpu:2", 2
	r, err := Run(context.Background(), ep)
	if err != nil {
		t.Fatal(err)
	}
	if r.Layout != "dp=2 tp=1 cp=1 ep=2 etp=1" || r.Device != "cpu:2" || ref.Layout != "dp=1 tp=1 cp=1 ep=1 etp=1" {
		t.Fatalf("layout %q on %q (one device: %q)", r.Layout, r.Device, ref.Layout)
	}
	st := r.Settings
	if st.DataRanks != 2 || st.MicroBatchesPerRank != 1 || st.RowsPerMicroBatch != 1 || st.EP != 2 || st.Devices != "cpu:2" {
		t.Fatalf("settings %+v, want 2 data ranks x 1 micro-batch x 1 row", st)
	}
	if ref.Settings.DataRanks != 1 || ref.Settings.MicroBatchesPerRank != 2 || ref.Settings.RowsPerMicroBatch != 1 {
		t.Fatalf("one-device settings %+v, want 1 data rank x 2 micro-batches x 1 row", ref.Settings)
	}
	for i := range r.Losses {
		l, want := r.Losses[i], ref.Losses[i]
		if math.IsNaN(l) || math.IsInf(l, 0) || math.Abs(l-want) > 1e-3*math.Abs(want) {
			t.Fatalf("step %d: loss %v on ep=2, %v on one device (relative tolerance 1e-3); all: %v vs %v", i+1, l, want, r.Losses, ref.Losses)
		}
	}
	m := r.Memory
	if len(m.PerDevice) != 2 || m.Aggregate == "" || m.HostPeakAllocated <= 0 {
		t.Fatalf("memory %+v, want two devices and the host view", m)
	}
	peak := int64(0)
	for i, d := range m.PerDevice {
		if d.Rank != i || d.PeakAllocated <= 0 || d.PeakAllocatedGiB != float64(d.PeakAllocated)/(1<<30) {
			t.Fatalf("device %d memory %+v", i, d)
		}
		peak = max(peak, d.PeakAllocated)
	}
	if m.PeakAllocated != peak {
		t.Fatalf("peak %d, want the largest device peak %d", m.PeakAllocated, peak)
	}
	// Each device holds half of the experts, so neither holds the whole model's weights.
	mi := r.Model
	expert := int64(3 * 32 * 16)
	if mi.Experts != 4 || mi.TopK != 2 || mi.MoELayers != 2 || mi.ActiveParams != mi.Params-2*2*expert || mi.Params != ref.Model.Params {
		t.Fatalf("model %+v, want 4 experts, top-2, 2 MoE layers and active = total - 2 layers x 2 skipped experts", mi)
	}
	if want := FLOPsPerToken(mi.ActiveParams, 2, 16, 2, 16); r.FLOPsPerToken != want {
		t.Fatalf("flops per token %v, want %v (active parameters)", r.FLOPsPerToken, want)
	}
	if mfu := r.FLOPsPerToken * r.TokensPerS / (2 * H200PeakTFLOPS * 1e12); math.Abs(r.MFU-mfu) > 1e-12*mfu {
		t.Fatalf("mfu %v, want %v (the peak of two devices)", r.MFU, mfu)
	}
	bd := r.Breakdown
	if bd == nil || bd.Comm == nil {
		t.Fatalf("breakdown %+v without communication", bd)
	}
	c := bd.Comm
	t.Logf("losses %v (one device %v); dispatch %.3f combine %.3f comm %.3f of %.4f s; peaks %d %d bytes",
		r.Losses, ref.Losses, c.DispatchFraction, c.CombineFraction, c.CommFraction, c.WallS, m.PerDevice[0].PeakAllocated, m.PerDevice[1].PeakAllocated)
	for name, f := range map[string]float64{"dispatch": c.DispatchFraction, "combine": c.CombineFraction} {
		if !(f > 0 && f < 1) {
			t.Errorf("%s fraction %v, want in (0, 1)", name, f)
		}
	}
	if c.DispatchFraction != c.Share["all_to_all_dispatch"] || c.CombineFraction != c.Share["all_to_all_combine"] ||
		!(c.CommFraction >= c.DispatchFraction+c.CombineFraction) || c.Method != ShareMethod {
		t.Errorf("shares %+v", c)
	}
	if bd.ByClassS["comm.all_to_all_dispatch"] != c.ByKindS["all_to_all_dispatch"] || !(c.Bytes["all_to_all_dispatch"] > 0) || !(c.Calls["all_to_all_combine"] > 0) {
		t.Errorf("dispatch %v s in the breakdown, %v s in comm, bytes %v, calls %v", bd.ByClassS["comm.all_to_all_dispatch"], c.ByKindS["all_to_all_dispatch"], c.Bytes, c.Calls)
	}
	if len(c.PerDevice) != 2 || c.PerDevice[1].Rank != 1 || !(c.PerDevice[0].DispatchFraction > 0) {
		t.Errorf("per device %+v", c.PerDevice)
	}
}

// TestBadLayoutIsRefusedBeforeLoading checks that layouts the trainer refuses are reported
// with the degree and the device count, before any weight is read.
func TestBadLayoutIsRefusedBeforeLoading(t *testing.T) {
	model := tinyMoE(t, tensor.BF16)
	rows := tokenFile(t, 6, 16)
	// With the weights gone, an error about them would mean they were read first.
	if err := os.Remove(filepath.Join(model, "model.safetensors")); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		edit func(*Options)
		want []string
	}{
		{"ep does not divide the devices", func(o *Options) { o.EP = 3 }, []string{"ep=3", "on 2 devices", "ep-experts"}},
		{"tp does not divide the devices", func(o *Options) { o.Devices, o.TP = "cpu:3", 2 }, []string{"tp=2", "on 3 devices"}},
		{"batch not dealt evenly", func(o *Options) { o.BatchSize = 3 }, []string{"batch 3", "2 data ranks", "multiple of 2"}},
		{"layout without devices", func(o *Options) { o.Devices = "" }, []string{"ep 2", "--devices"}},
		{"device kinds disagree", func(o *Options) { o.Device = "cuda" }, []string{"device cuda and devices cpu:2 disagree"}},
		{"bad device list", func(o *Options) { o.Devices = "cpu:x" }, []string{"--devices cpu:x"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			o := Options{Model: model, Data: rows, Devices: "cpu:2", EP: 2, Steps: 3, BatchSize: 2, SeqLen: 16}
			tc.edit(&o)
			_, err := Run(context.Background(), o)
			if err == nil {
				t.Fatal("no error")
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Fatalf("error %q, want it to contain %q", err, w)
				}
			}
		})
	}
}

// TestNumberedDeviceIsAcceptedByTheConfig checks that a numbered device (cuda:1, as
// moe-bench.sh passes for one GPU) gives a config of that device's kind, which the trainer's
// validation accepts, while the run opens the numbered device itself.
func TestNumberedDeviceIsAcceptedByTheConfig(t *testing.T) {
	for _, tc := range []struct{ device, devices, kind, open string }{
		{"cuda:1", "", "cuda", "cuda:1"},
		{"cuda", "", "cuda", "cuda"},
		{"cpu", "", "cpu", "cpu"},
		{"auto", "cuda:2", "cuda", "cuda:2"},
	} {
		o := Options{Model: "unused", Data: "unused", Device: tc.device, Devices: tc.devices}
		cfg, err := o.Config()
		if err != nil {
			t.Fatalf("device %q devices %q: %v", tc.device, tc.devices, err)
		}
		if cfg.Run.Device != tc.kind {
			t.Errorf("device %q devices %q: config device %q, want %q", tc.device, tc.devices, cfg.Run.Device, tc.kind)
		}
		o.defaults()
		lay, err := o.layout()
		if err != nil {
			t.Fatal(err)
		}
		if got := lay.oneDevice(o.Device); got != tc.open {
			t.Errorf("device %q devices %q: opens %q, want %q", tc.device, tc.devices, got, tc.open)
		}
	}
}

// TestRunWritesTheProfiledStepTrace: with Trace set, the profiled step's ops land in a Chrome
// trace (one compute event per op) and the breakdown says how they were timed (host on the CPU).
func TestRunWritesTheProfiledStepTrace(t *testing.T) {
	o := tinyOptions(t)
	o.Steps, o.Warmup = 1, 0
	o.Trace = filepath.Join(t.TempDir(), "step.json")
	r, err := Run(context.Background(), o)
	if err != nil {
		t.Fatal(err)
	}
	raw, err := os.ReadFile(o.Trace)
	if err != nil {
		t.Fatal(err)
	}
	var tr struct {
		TraceEvents []struct {
			Name string `json:"name"`
			Ph   string `json:"ph"`
			Tid  int    `json:"tid"`
		} `json:"traceEvents"`
	}
	if err := json.Unmarshal(raw, &tr); err != nil {
		t.Fatalf("trace is not JSON: %v", err)
	}
	ops := 0
	for _, e := range tr.TraceEvents {
		if e.Ph == "X" && e.Tid == 2 {
			ops++
		}
	}
	if r.Breakdown == nil || ops != r.Breakdown.Ops || ops == 0 || r.Breakdown.Timing != "host" {
		t.Fatalf("trace has %d op events; breakdown %+v", ops, r.Breakdown)
	}
}

// TestQLoRAOptions: --lora-r and --load-in-4bit make the benchmark's run a QLoRA run (adapters
// of that rank on every linear layer, the base in NF4, gradient checkpointing), which trains;
// a 4-bit base without adapters is refused, and the device memory cap is applied.
func TestQLoRAOptions(t *testing.T) {
	o := tinyOptions(t)
	o.LoRARank, o.LoadIn4bit, o.GradientCheckpointing, o.NoProfile = 4, true, true, true
	cfg, err := o.Config()
	if err != nil {
		t.Fatal(err)
	}
	if !cfg.PEFT.UsePEFT || cfg.PEFT.LoRAR != 4 || cfg.PEFT.LoRAAlpha != 8 || !cfg.Quant.LoadIn4bit || !cfg.Run.GradientCheckpointing ||
		len(cfg.PEFT.LoRATargetModules) != 1 || cfg.PEFT.LoRATargetModules[0] != "all-linear" {
		t.Fatalf("config %+v %+v %+v: want r 4, alpha 8, all-linear, NF4, checkpointing", cfg.PEFT, cfg.Quant, cfg.Run)
	}
	r, err := Run(context.Background(), o)
	if err != nil {
		t.Fatal(err)
	}
	if len(r.Losses) != 3 || !(r.Losses[2] < r.Losses[0]) {
		t.Fatalf("QLoRA losses %v: want 3 falling losses", r.Losses)
	}
	// The memory cap reaches the device: a few KiB cannot hold the model.
	o.MaxDeviceMemoryGiB = 4.0 / (1 << 20)
	if _, err := Run(context.Background(), o); err == nil || !strings.Contains(err.Error(), "4.0 KiB is available") {
		t.Fatalf("a 4 KiB cap: %v, want the run refused for the 4 KiB available", err)
	}
	t.Setenv("HALO_MEMORY_CHECK", "off") // past the estimate, the allocator itself refuses
	if _, err := Run(context.Background(), o); err == nil || !strings.Contains(err.Error(), "--max-device-memory-gib") {
		t.Fatalf("a 4 KiB cap without the estimate's check: %v, want the allocator's refusal naming --max-device-memory-gib", err)
	}
	o = tinyOptions(t)
	o.LoadIn4bit = true
	if _, err := o.Config(); err == nil || !strings.Contains(err.Error(), "--lora-r") {
		t.Fatalf("a 4-bit base without adapters: %v, want a refusal naming --lora-r", err)
	}
}

// TestTopOps: spans are summed by name within class (collectives left out), the most time
// first with ties by name, and cut to n.
func TestTopOps(t *testing.T) {
	ms := func(n int) time.Duration { return time.Duration(n) * time.Millisecond }
	spans := []profile.Span{
		{Name: "LinearBackward", Class: "matmul", Dur: ms(3), FLOPs: 2e9},
		{Name: "Attention", Class: "attention", Dur: ms(4)},
		{Name: "LinearBackward", Class: "matmul", Dur: ms(2), FLOPs: 1e9},
		{Name: "all_reduce", Class: "all_reduce", Comm: true, Dur: ms(9)},
		{Name: "Add", Class: "other", Dur: ms(1)},
		{Name: "Fill", Class: "other", Dur: ms(1)},
	}
	got := topOps(spans, 3)
	want := []OpTime{
		{Name: "LinearBackward", Class: "matmul", S: 0.005, Calls: 2, GFLOP: 3},
		{Name: "Attention", Class: "attention", S: 0.004, Calls: 1},
		{Name: "Add", Class: "other", S: 0.001, Calls: 1},
	}
	if len(got) != len(want) {
		t.Fatalf("topOps = %+v, want %+v", got, want)
	}
	for i := range want {
		g, w := got[i], want[i]
		if g.Name != w.Name || g.Class != w.Class || g.Calls != w.Calls || math.Abs(g.S-w.S) > 1e-12 || math.Abs(g.GFLOP-w.GFLOP) > 1e-9 {
			t.Errorf("topOps[%d] = %+v, want %+v", i, g, w)
		}
	}
}
