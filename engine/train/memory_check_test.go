package train

import (
	"fmt"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// hugeConfig is a run no machine holds: about 650 billion parameters on one CPU device.
func hugeConfig(t *testing.T, extra ...string) *Config {
	t.Helper()
	path := writeJSONL(t, t.TempDir(), "d.jsonl", pcRecords(4))
	y := fmt.Sprintf(`init:
  arch: qwen3
  preset: tiny
  overrides: {hidden_size: 16384, intermediate_size: 65536, num_attention_heads: 128, num_key_value_heads: 8, head_dim: 128, num_hidden_layers: 200}
tokenizer_name_or_path: %s
dataset: {path: %s}
max_length: 64
per_device_train_batch_size: 1
max_steps: 2
device: cpu
output_dir: %s
`, quickTok, path, filepath.Join(t.TempDir(), "out"))
	cfg, err := ParseConfig([]byte(y), "huge.yaml", MethodPretrain, extra)
	if err != nil {
		t.Fatal(err)
	}
	return cfg
}

func TestRunThatCannotFitIsRefusedBeforeAllocating(t *testing.T) {
	for _, c := range []struct {
		name  string
		extra []string
		count string
	}{
		{"one device", nil, "(one device)"},
		{"four cpu devices", []string{"--devices=cpu:4", "--fsdp=true", "--gradient_accumulation_steps=4"}, "(4 cpu devices x"},
	} {
		t.Run(c.name, func(t *testing.T) {
			cfg := hugeConfig(t, c.extra...)
			start := time.Now()
			tr, err := New(cfg)
			if err == nil {
				tr.Close()
				t.Fatal("a run of 650 billion parameters was accepted")
			}
			for _, w := range []string{"train: the run needs about", "of host memory " + c.count, "is available", "parameters, gradients and optimizer state alone take", "HALO_MEMORY_CHECK=warn"} {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q lacks %q", err, w)
				}
			}
			if d := time.Since(start); d > 10*time.Second {
				t.Errorf("refusing took %v: something was allocated first", d)
			}
		})
	}
}

func TestMemoryShortfall(t *testing.T) {
	need := MemoryNeed{Bytes: 70 << 30, Exact: 20 << 30, Host: true, Detail: "one device"}
	if s := MemoryShortfall(need, 80<<30, "host memory"); s != "" {
		t.Errorf("70 GiB in 80 GiB: %q", s)
	}
	s := MemoryShortfall(need, 23<<30+512<<20, "host memory")
	for _, w := range []string{"needs about 70.00 GiB of host memory (one device) and 23.50 GiB is available", "may fit", "gradient_checkpointing"} {
		if !strings.Contains(s, w) {
			t.Errorf("%q lacks %q", s, w)
		}
	}
	if s := MemoryShortfall(need, 10<<30, "cuda:0"); !strings.Contains(s, "alone take 20.00 GiB") || strings.Contains(s, "may fit") {
		t.Errorf("exact part over the memory: %q", s)
	}
	if s := MemoryShortfall(need, 0, "host memory"); s != "" {
		t.Errorf("unknown memory: %q", s)
	}
}

func TestMemoryCheckSwitch(t *testing.T) {
	for _, mode := range []string{"warn", "off"} {
		t.Run(mode, func(t *testing.T) {
			t.Setenv("HALO_MEMORY_CHECK", mode)
			tr, err := New(hugeConfig(t))
			if err == nil {
				tr.Close()
				t.Fatal("a run of 650 billion parameters was built")
			}
			// The check let it through: the CPU backend's allocator refused the arena.
			if strings.Contains(err.Error(), "the run needs about") || !strings.Contains(err.Error(), "cpu: out of memory") {
				t.Fatalf("HALO_MEMORY_CHECK=%s: %v, want the allocator's refusal", mode, err)
			}
		})
	}
}

// TestMaxDeviceMemoryGiB: the run key caps the device, so that a run which fits the machine
// is refused against the cap before anything is allocated, and a bad value is a config error.
func TestMaxDeviceMemoryGiB(t *testing.T) {
	path := writeJSONL(t, t.TempDir(), "d.jsonl", pcRecords(4))
	y := fmt.Sprintf(`init:
  arch: qwen3
  preset: tiny
  overrides: {hidden_size: 1024, intermediate_size: 4096, num_attention_heads: 8, num_key_value_heads: 8, head_dim: 128, num_hidden_layers: 8}
tokenizer_name_or_path: %s
dataset: {path: %s}
max_length: 64
per_device_train_batch_size: 1
max_steps: 1
device: cpu
max_device_memory_gib: %%s
output_dir: %s
`, quickTok, path, filepath.Join(t.TempDir(), "out"))
	cfg, err := ParseConfig([]byte(fmt.Sprintf(y, "0.25")), "capped.yaml", MethodPretrain, nil)
	if err != nil {
		t.Fatal(err)
	}
	tr, err := New(cfg)
	if err == nil {
		tr.Close()
		t.Fatal("a run of about 1.5 GiB was accepted under a 0.25 GiB cap")
	}
	for _, w := range []string{"train: the run needs about", "of cpu memory (capped)", "and 256.0 MiB is available"} {
		if !strings.Contains(err.Error(), w) {
			t.Errorf("error %q lacks %q", err, w)
		}
	}
	t.Setenv("HALO_MEMORY_CHECK", "off")
	tr, err = New(cfg)
	if err == nil {
		tr.Close()
		t.Fatal("with the check off, the capped allocator accepted the run")
	}
	if !strings.Contains(err.Error(), "out of memory") || !strings.Contains(err.Error(), "max_device_memory_gib") {
		t.Errorf("with the check off: %v, want the allocator's refusal naming max_device_memory_gib", err)
	}
	if _, err := ParseConfig([]byte(fmt.Sprintf(y, "-1")), "capped.yaml", MethodPretrain, nil); err == nil || !strings.Contains(err.Error(), "max_device_memory_gib") {
		t.Errorf("a negative cap: %v", err)
	}
}
