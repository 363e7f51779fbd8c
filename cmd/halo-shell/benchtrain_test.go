package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/halo-shell/halo-shell/engine/backend"
	"github.com/halo-shell/halo-shell/engine/data"
	"github.com/halo-shell/halo-shell/engine/models"
	"github.com/halo-shell/halo-shell/engine/tensor"
)

// TestBenchTrainOnCPU runs bench-train for 3 steps of a tiny llama saved by our own code on
// rows that repeat a short period, and reads the report it writes.
func TestBenchTrainOnCPU(t *testing.T) {
	dir := t.TempDir()
	ckpt, tokens := benchInputs(t, dir, models.InitSpec{Arch: "llama", Preset: "tiny", OutDir: filepath.Join(dir, "ckpt"), Seed: 9, DType: tensor.BF16,
		Set: []string{"hidden_size=32", "intermediate_size=64", "head_dim=8", "tie_word_embeddings=true"}}, 6, 24)
	report := filepath.Join(dir, "report.json")
	out, err := runCLI(t, "run", "bench-train", "--model", ckpt, "--data", tokens, "--device", "cpu", "--steps", "3",
		"--warmup", "1", "--batch", "2", "--seq-len", "24", "--lr", "1e-2", "--out", report)
	if err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	if !strings.Contains(out, "step 4 ") || !strings.Contains(out, "profiled") || !strings.Contains(out, "MFU") {
		t.Fatalf("progress output lacks the steps, the profiled step or the summary:\n%s", out)
	}
	raw, err := os.ReadFile(report)
	if err != nil {
		t.Fatal(err)
	}
	var r struct {
		Engine   string
		Device   string
		Losses   []float64
		Steps    []map[string]any
		Settings struct {
			Steps       int     `json:"steps"`
			Warmup      int     `json:"warmup"`
			Optim       string  `json:"optim"`
			Beta2       float64 `json:"beta2"`
			MaxGradNorm float64 `json:"max_grad_norm"`
		}
		TokensPerS   float64 `json:"tokens_per_s"`
		MFU          float64 `json:"mfu"`
		FLOPsFormula string  `json:"flops_formula"`
		Memory       struct {
			Peak float64 `json:"peak_allocated_gib"`
		}
		Breakdown struct {
			ByClassS map[string]float64 `json:"by_class_s"`
		}
	}
	if err := json.Unmarshal(raw, &r); err != nil {
		t.Fatalf("report %s: %v", raw, err)
	}
	if r.Engine != "halo-shell" || r.Device != "cpu" || len(r.Losses) != 3 || len(r.Steps) != 3 {
		t.Fatalf("report %s", raw)
	}
	if !(r.Losses[2] < r.Losses[0]) {
		t.Fatalf("losses %v do not fall", r.Losses)
	}
	s := r.Settings
	if s.Steps != 3 || s.Warmup != 1 || s.Optim != "adamw_bf16_nearest" || s.Beta2 != 0.95 || s.MaxGradNorm != 1 {
		t.Fatalf("settings %+v", s)
	}
	if !(r.TokensPerS > 0 && r.MFU > 0 && r.Memory.Peak > 0) || !strings.Contains(r.FLOPsFormula, "6*N") || r.Breakdown.ByClassS["matmul"] <= 0 {
		t.Fatalf("report %s", raw)
	}
	if _, err := runCLI(t, "run", "bench-train", "--model", ckpt, "--data", tokens, "--device", "cpu", "--steps", "4",
		"--batch", "2", "--seq-len", "24", "--out", report); err == nil || !strings.Contains(err.Error(), "need 8") {
		t.Fatalf("4 steps of 2 rows from 6 rows: %v", err)
	}
}

// TestBenchTrainExpertParallel runs bench-train on a tiny qwen3_moe over two simulated devices
// with --ep 2 and reads the layout, per-device memory and all-to-all shares from its report;
// --ep 3 on two devices is refused naming the degree and the device count.
func TestBenchTrainExpertParallel(t *testing.T) {
	dir := t.TempDir()
	ckpt, tokens := benchInputs(t, dir, models.InitSpec{Arch: "qwen3_moe", Preset: "tiny", OutDir: filepath.Join(dir, "moe"), Seed: 3, DType: tensor.BF16,
		Set: []string{"hidden_size=32", "moe_intermediate_size=16", "num_local_experts=4", "num_experts_per_tok=2",
			"num_attention_heads=2", "num_key_value_heads=1", "head_dim=16", "num_hidden_layers=2", "vocab_size=256"}}, 4, 16)
	report := filepath.Join(dir, "report.json")
	args := []string{"run", "bench-train", "--model", ckpt, "--data", tokens, "--devices", "cpu:2", "--steps", "2",
		"--warmup", "1", "--batch", "2", "--seq-len", "16", "--out", report}
	out, err := runCLI(t, append(args, "--ep", "2")...)
	if err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	if !strings.Contains(out, "rank 1 ") || !strings.Contains(out, "all-to-all dispatch") {
		t.Fatalf("summary lacks the devices or the all-to-all shares:\n%s", out)
	}
	raw, err := os.ReadFile(report)
	if err != nil {
		t.Fatal(err)
	}
	var r struct {
		Device string
		Layout string
		Memory struct {
			PerDevice []struct {
				Peak int64 `json:"peak_allocated_bytes"`
			} `json:"per_device"`
		}
		Breakdown struct {
			Comm struct {
				Dispatch float64 `json:"dispatch_fraction"`
				Combine  float64 `json:"combine_fraction"`
				Method   string  `json:"method"`
			}
		}
	}
	if err := json.Unmarshal(raw, &r); err != nil {
		t.Fatalf("report %s: %v", raw, err)
	}
	c := r.Breakdown.Comm
	if r.Device != "cpu:2" || r.Layout != "dp=2 tp=1 cp=1 ep=2 etp=1" || len(r.Memory.PerDevice) != 2 || r.Memory.PerDevice[1].Peak <= 0 ||
		!(c.Dispatch > 0 && c.Dispatch < 1 && c.Combine > 0 && c.Combine < 1) || c.Method == "" {
		t.Fatalf("report %s", raw)
	}
	_, err = runCLI(t, append(args, "--ep", "3")...)
	if err == nil || !strings.Contains(err.Error(), "ep=3") || !strings.Contains(err.Error(), "2 devices") {
		t.Fatalf("--ep 3 on cpu:2: %v", err)
	}
}

// benchInputs saves a checkpoint made by our own code from spec and writes rows token rows of
// length ids to dir/tokens.jsonl; it returns the checkpoint directory and the token file.
func benchInputs(t *testing.T, dir string, spec models.InitSpec, rows, length int) (ckpt, tokens string) {
	t.Helper()
	b, err := backend.Open("cpu")
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	if _, err := models.InitCheckpoint(b, spec); err != nil {
		t.Fatal(err)
	}
	recs := make([]data.Record, rows)
	for i := range recs {
		ids := make([]int32, length)
		for j := range ids {
			ids[j] = int32(100 + (i+j)%6)
		}
		recs[i] = data.Record{Kind: data.FormatTokens, IDs: ids}
	}
	var sb strings.Builder
	if err := data.WriteJSONL(&sb, recs); err != nil {
		t.Fatal(err)
	}
	tokens = filepath.Join(dir, "tokens.jsonl")
	if err := os.WriteFile(tokens, []byte(sb.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	return spec.OutDir, tokens
}
