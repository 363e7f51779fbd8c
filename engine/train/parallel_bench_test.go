package train

import (
	"context"
	"testing"
)

// BenchmarkStepByLayout times one optimizer step of the tiny model on one device and on
// simulated CPU devices (all sharing this machine's cores).
func BenchmarkStepByLayout(b *testing.B) {
	path := writeJSONL(b, b.TempDir(), "d.jsonl", pcRecords(200))
	for _, tc := range []struct {
		name  string
		extra []string
	}{
		{"single", nil},
		{"dp=2", []string{"--devices=cpu:2"}},
		{"tp=2", []string{"--devices=cpu:2", "--tensor_parallel_size=2"}},
		{"cp=2", []string{"--devices=cpu:2", "--context_parallel_size=2"}},
		{"dp=2_tp=2_fsdp", []string{"--devices=cpu:4", "--tensor_parallel_size=2", "--fsdp=true"}},
	} {
		b.Run(tc.name, func(b *testing.B) {
			cfg := tinyParallelConfig(b, path, append(tc.extra, "--max_steps=100000", "--warmup_steps=0")...)
			tr, err := New(cfg)
			if err != nil {
				b.Fatal(err)
			}
			defer tr.Close()
			for b.Loop() {
				if _, err := tr.Step(context.Background()); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// BenchmarkSetLayout times moving the tiny model's parameters and optimizer state between one
// device and a tp=2 fsdp layout on four simulated devices, both ways.
func BenchmarkSetLayout(b *testing.B) {
	path := writeJSONL(b, b.TempDir(), "d.jsonl", pcRecords(40))
	tr, err := New(tinyParallelConfig(b, path))
	if err != nil {
		b.Fatal(err)
	}
	defer tr.Close()
	if _, err := tr.Step(context.Background()); err != nil {
		b.Fatal(err)
	}
	for b.Loop() {
		if _, err := tr.SetLayout("devices=cpu:4 tp=2 fsdp"); err != nil {
			b.Fatal(err)
		}
		if _, err := tr.SetLayout("dp=1"); err != nil {
			b.Fatal(err)
		}
	}
}

// smallParallelShape is a qwen3 shape about thirty times the tiny one (about 1M parameters),
// so the per-step cost of bringing the parameters to the host model is visible next to the
// step's compute.
const smallParallelShape = "{hidden_size: 128, intermediate_size: 512, num_attention_heads: 4, num_key_value_heads: 2, head_dim: 32, num_hidden_layers: 4}"

// BenchmarkFSDPStep times one optimizer step with dp=4 fsdp on four simulated CPU devices,
// for the tiny and the small model: the step as a training loop sees it (parameters stay on
// the devices), and the step followed by HostModel (what a run that reads the host model
// after every step pays).
func BenchmarkFSDPStep(b *testing.B) {
	path := writeJSONL(b, b.TempDir(), "d.jsonl", pcRecords(200))
	for _, sh := range []struct{ name, shape string }{{"tiny", tinyParallelShape}, {"small", smallParallelShape}} {
		for _, sync := range []bool{false, true} {
			name := sh.name
			if sync {
				name += "_sync"
			}
			b.Run(name, func(b *testing.B) {
				cfg := parallelConfig(b, path, sh.shape, "--devices=cpu:4", "--fsdp=true", "--gradient_accumulation_steps=4", "--max_steps=100000", "--warmup_steps=0")
				tr, err := New(cfg)
				if err != nil {
					b.Fatal(err)
				}
				defer tr.Close()
				for b.Loop() {
					if _, err := tr.Step(context.Background()); err != nil {
						b.Fatal(err)
					}
					if sync {
						if _, err := tr.HostModel(); err != nil {
							b.Fatal(err)
						}
					}
				}
			})
		}
	}
}

// BenchmarkGatherParams times one gather of a dp=4 fsdp plan's parameters (on four simulated
// CPU devices) into the host model: what every plan step paid when the host model was kept
// current after each step, and what the first reader after a step pays now.
func BenchmarkGatherParams(b *testing.B) {
	path := writeJSONL(b, b.TempDir(), "d.jsonl", pcRecords(40))
	for _, sh := range []struct{ name, shape string }{{"tiny", tinyParallelShape}, {"small", smallParallelShape}} {
		b.Run(sh.name, func(b *testing.B) {
			cfg := parallelConfig(b, path, sh.shape, "--devices=cpu:4", "--fsdp=true", "--gradient_accumulation_steps=4")
			tr, err := New(cfg)
			if err != nil {
				b.Fatal(err)
			}
			defer tr.Close()
			if _, err := tr.Step(context.Background()); err != nil {
				b.Fatal(err)
			}
			for b.Loop() {
				if err := tr.onPlan().gather(); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(tr.NumParams()), "params")
		})
	}
}
