package main

import (
	"encoding/binary"
	"math"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/halo-shell/halo-shell/engine/hf/safetensors"
)

// tinyCheckpoint writes a one-layer llama checkpoint and returns its directory.
func tinyCheckpoint(t *testing.T) string {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "ckpt")
	if _, err := runCLI(t, "run", "init-model", "--arch", "llama", "--preset", "tiny",
		"--tokenizer", "../../engine/models/testdata/tokenizer", "--out", dir, "--seed", "4",
		"--set", "num_hidden_layers=1"); err != nil {
		t.Fatal(err)
	}
	return dir
}

// rewriteWeights rewrites dir/model.safetensors with edit applied to the tensor named name.
func rewriteWeights(t *testing.T, dir, name string, edit func(*safetensors.Tensor)) {
	t.Helper()
	path := filepath.Join(dir, "model.safetensors")
	f, err := safetensors.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	var ts []safetensors.Tensor
	for _, n := range f.Names() {
		info, _ := f.Tensor(n)
		tt := safetensors.Tensor{Name: n, DType: info.DType, Shape: info.Shape, Data: append([]byte(nil), info.Data...)}
		if n == name {
			edit(&tt)
		}
		ts = append(ts, tt)
	}
	f.Close()
	if err := safetensors.Save(path, ts, nil); err != nil {
		t.Fatal(err)
	}
}

// runWithin runs the CLI and fails the test when it does not return within d.
func runWithin(t *testing.T, d time.Duration, args ...string) (string, error) {
	t.Helper()
	type result struct {
		out string
		err error
	}
	done := make(chan result, 1)
	go func() {
		out, err := runCLI(t, args...)
		done <- result{out, err}
	}()
	select {
	case r := <-done:
		return r.out, r.err
	case <-time.After(d):
		t.Fatalf("%v did not return within %v", args, d)
	}
	return "", nil
}

func TestNonRegularCheckpointFilesAreRefused(t *testing.T) {
	for _, name := range []string{"model.safetensors", "config.json"} {
		t.Run(name, func(t *testing.T) {
			dir := tinyCheckpoint(t)
			p := filepath.Join(dir, name)
			os.Remove(p)
			if err := syscall.Mkfifo(p, 0o644); err != nil {
				t.Skip("mkfifo:", err)
			}
			for _, args := range [][]string{{"run", "inspect", dir}, {"run", "logprobs", "--model", dir, "--ids", "5 17"}} {
				_, err := runWithin(t, 20*time.Second, args...)
				if err == nil || !strings.Contains(err.Error(), "not a regular file") || !strings.Contains(err.Error(), name) {
					t.Errorf("%v: err = %v, want %s refused as not a regular file", args, err, name)
				}
			}
		})
	}
}

func TestNaNWeightsAreNamed(t *testing.T) {
	dir := tinyCheckpoint(t)
	const bad = "model.layers.0.mlp.down_proj.weight"
	rewriteWeights(t, dir, bad, func(tt *safetensors.Tensor) {
		if tt.DType != safetensors.F32 {
			t.Fatalf("%s is %s, the test writes F32 NaN", bad, tt.DType)
		}
		binary.LittleEndian.PutUint32(tt.Data[8:], math.Float32bits(float32(math.NaN())))
	})
	_, err := runCLI(t, "run", "logprobs", "--model", dir, "--ids", "5 17 123 9")
	if err == nil || !strings.Contains(err.Error(), `weight "`+bad+`" holds 1 NaN and 0 infinite values`) {
		t.Fatalf("err = %v, want the NaN weight named", err)
	}
}

func TestNonFloatWeightsAreRefused(t *testing.T) {
	for _, c := range []struct {
		dtype safetensors.DType
		size  int
		want  string
	}{
		{safetensors.I64, 8, "stored as I64: a model weight is a floating-point tensor"},
		{safetensors.BOOL, 1, "stored as BOOL: a model weight is a floating-point tensor"},
		{safetensors.F8_E4M3, 1, "stored as F8_E4M3: an FP8 checkpoint keeps per-block scales"},
	} {
		t.Run(c.dtype.String(), func(t *testing.T) {
			dir := tinyCheckpoint(t)
			const name = "model.norm.weight"
			rewriteWeights(t, dir, name, func(tt *safetensors.Tensor) {
				n := len(tt.Data) / 4
				tt.DType, tt.Data = c.dtype, make([]byte, n*c.size)
			})
			_, err := runCLI(t, "run", "logprobs", "--model", dir, "--ids", "5 17")
			if err == nil || !strings.Contains(err.Error(), `tensor "`+name+`"`) || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("err = %v, want %q for %s", err, c.want, name)
			}
		})
	}
}

func TestDryRunWarnsWhenTheRunCannotFit(t *testing.T) {
	dir := t.TempDir()
	data := filepath.Join(dir, "d.jsonl")
	os.WriteFile(data, []byte(`{"text":"hello world"}`+"\n"), 0o644)
	cfg := filepath.Join(dir, "huge.yaml")
	os.WriteFile(cfg, []byte(`init:
  arch: qwen3
  preset: tiny
  overrides: {hidden_size: 16384, intermediate_size: 65536, num_attention_heads: 128, num_key_value_heads: 8, head_dim: 128, num_hidden_layers: 200}
tokenizer_name_or_path: ../../examples/quickstart/tokenizer
dataset: {path: `+data+`}
device: cpu
output_dir: `+filepath.Join(dir, "out")+`
`), 0o644)
	stdout, stderr, err := runRootErr(t, "", "launch", "pretrain", cfg, "--dry-run")
	if err != nil {
		t.Fatalf("a dry run only estimates; it failed: %v", err)
	}
	if !strings.Contains(stdout, "memory estimate per device") {
		t.Errorf("no estimate printed:\n%s", stdout)
	}
	if !strings.Contains(stderr, "launch: warning: the run needs about") || !strings.Contains(stderr, "the run would refuse to start") {
		t.Errorf("no warning on stderr:\n%s", stderr)
	}
	// A config that fits gets no warning.
	stdout, stderr, err = runRootErr(t, "", "launch", "sft", "../../examples/quickstart.yaml", "--dry-run")
	if err != nil || strings.Contains(stderr, "warning") {
		t.Errorf("quickstart dry run: %v, stderr:\n%s", err, stderr)
	}
}
