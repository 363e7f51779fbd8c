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
	if bd == nil || bd.Step != 4 || bd.Ops == 0 || bd.ByClassS["matmul"] <= 0 || bd.ByClassS["optimizer"] <= 0 {
		t.Fatalf("breakdown %+v", bd)
	}
	sum := 0.0
	for _, f := range bd.Fraction {
		sum += f
	}
	if math.Abs(sum-1) > 1e-9 {
		t.Fatalf("breakdown fractions add up to %v: %v", sum, bd.Fraction)
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
