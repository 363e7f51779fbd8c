package train

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

const goodYAML = `# a comment
model_name_or_path: ckpt
dataset:
  path: [a.jsonl, b.jsonl]
  eval_split: 0.1
max_length: 128
learning_rate: 3e-4
lr_scheduler_type: cosine
warmup_ratio: 0.1
max_steps: 100
output_dir: out
`

func TestParseConfigDefaultsAndValues(t *testing.T) {
	cfg, err := ParseConfig([]byte(goodYAML), "c.yaml", "sft", nil)
	if err != nil {
		t.Fatal(err)
	}
	checks := []struct {
		name      string
		got, want any
	}{
		{"method from command", cfg.Method, "sft"},
		{"paths list", strings.Join(cfg.Dataset.Path, ","), "a.jsonl,b.jsonl"},
		{"max_length", cfg.Batch.MaxLength, 128},
		{"learning_rate", cfg.Optim.LearningRate, 3e-4},
		{"scheduler", cfg.Sched.LRSchedulerType, "cosine"},
		{"packing default", *cfg.Batch.Packing, true},
		{"batch default", cfg.Batch.PerDeviceTrainBatchSize, 8},
		{"eval batch follows train", cfg.Batch.PerDeviceEvalBatchSize, 8},
		{"accum default", cfg.Batch.GradientAccumulationSteps, 1},
		{"grad norm default", *cfg.Optim.MaxGradNorm, 1.0},
		{"beta2 default", cfg.Optim.AdamBeta2, 0.999},
		{"seed default", *cfg.Run.Seed, int64(42)},
		{"tokenizer follows model", cfg.Model.TokenizerNameOrPath, "ckpt"},
		{"optim default", cfg.Optim.Optim, "adamw_torch"},
		{"device default", cfg.Run.Device, "auto"},
		{"format default", cfg.Dataset.Format, "auto"},
	}
	for _, c := range checks {
		if c.got != c.want {
			t.Errorf("%s: got %v, want %v", c.name, c.got, c.want)
		}
	}
	one, err := ParseConfig([]byte(strings.Replace(goodYAML, "[a.jsonl, b.jsonl]", "single.jsonl", 1)), "c.yaml", "sft", nil)
	if err != nil || len(one.Dataset.Path) != 1 || one.Dataset.Path[0] != "single.jsonl" {
		t.Fatalf("a single path: %v %v", one, err)
	}
	zero, err := ParseConfig([]byte(goodYAML+"max_grad_norm: 0\nseed: 0\n"), "c.yaml", "sft", nil)
	if err != nil || *zero.Optim.MaxGradNorm != 0 || *zero.Run.Seed != 0 {
		t.Fatalf("explicit zeros must survive defaults: %v", err)
	}
}

// aliasBomb is nine levels of ten aliases under init.overrides (1.5 KB; 10^9 nodes expanded).
var aliasBomb = func() string {
	var b strings.Builder
	b.WriteString("init:\n  arch: qwen3\n  overrides:\n    l0: &l0 [x, x, x, x, x, x, x, x, x, x]\n")
	for i := 1; i < 9; i++ {
		fmt.Fprintf(&b, "    l%d: &l%d [%s]\n", i, i, strings.TrimSuffix(strings.Repeat(fmt.Sprintf("*l%d, ", i-1), 10), ", "))
	}
	return b.String()
}()

// flowAliasBomb is the same bomb on one line, as a --key=value override would carry it.
var flowAliasBomb = func() string {
	parts := []string{"l0: &l0 [x, x, x, x, x, x, x, x, x, x]"}
	for i := 1; i < 9; i++ {
		parts = append(parts, fmt.Sprintf("l%d: &l%d [%s]", i, i, strings.TrimSuffix(strings.Repeat(fmt.Sprintf("*l%d, ", i-1), 10), ", ")))
	}
	return "{" + strings.Join(parts, ", ") + "}"
}()

func TestParseConfigRefusals(t *testing.T) {
	tests := []struct {
		name      string
		yaml      string
		overrides []string
		want      []string
	}{
		{"unknown key with suggestion", goodYAML + "learnig_rate: 1\n", nil,
			[]string{"c.yaml:12:1", `unknown key "learnig_rate"`, `did you mean "learning_rate"?`}},
		{"unknown nested key", strings.Replace(goodYAML, "  eval_split: 0.1", "  eval_splt: 0.1", 1), nil,
			[]string{"c.yaml:5:3", `unknown key "eval_splt"`, `"eval_split"`}},
		{"wrong type", strings.Replace(goodYAML, "max_length: 128", "max_length: long", 1), nil,
			[]string{"c.yaml:6:", "max_length", "expected an integer"}},
		{"bad value with position", strings.Replace(goodYAML, "learning_rate: 3e-4", "learning_rate: -1", 1), nil,
			[]string{"c.yaml:7:16", "learning_rate: -1 must be in (0, 10)"}},
		{"bad choice with suggestion", strings.Replace(goodYAML, "cosine", "cosin", 1), nil,
			[]string{"c.yaml:8:", `lr_scheduler_type: "cosin" is not one of`, `did you mean "cosine"?`}},
		{"contradiction", goodYAML + "init: {arch: qwen3}\n", nil,
			[]string{"init: model_name_or_path and init exclude each other"}},
		{"two warmups", goodYAML + "warmup_steps: 5\n", nil, []string{"warmup_ratio: warmup_steps and warmup_ratio exclude"}},
		{"missing output", strings.Replace(goodYAML, "output_dir: out\n", "", 1), nil, []string{"output_dir: name a directory"}},
		{"method mismatch", goodYAML + "method: pretrain\n", nil, []string{"c.yaml:12:", `the file says "pretrain" but the command is`}},
		{"bf16 optimizer needs bf16", goodYAML + "optim: adamw_bf16\n", nil, []string{"optim: adamw_bf16 keeps bf16 weights"}},
		{"nearest bf16 optimizer needs bf16", goodYAML + "optim: adamw_bf16_nearest\n", nil, []string{"optim: adamw_bf16_nearest keeps bf16 weights"}},
		{"eval without data", strings.Replace(goodYAML, "  eval_split: 0.1\n", "", 1) + "eval_steps: 10\n", nil,
			[]string{"eval_steps: evaluation needs held-out data"}},
		{"override unknown", goodYAML, []string{"--learning_rat=1"}, []string{"command line", `did you mean "learning_rate"?`}},
		{"override wrong type", goodYAML, []string{"--max_steps=many"}, []string{"command line", "max_steps", "expected an integer"}},
		{"override bad value", goodYAML, []string{"--max_steps=-5"}, []string{"command line: max_steps: -5 must be positive"}},
		{"override malformed", goodYAML, []string{"--max_steps"}, []string{"overrides look like --key=value"}},
		{"alias bomb under init.overrides", strings.Replace(goodYAML, "model_name_or_path: ckpt\n", "tokenizer_name_or_path: tok\n"+aliasBomb, 1), nil,
			[]string{"config: c.yaml: yaml: aliases expand the document to more than 100000 nodes", "yamlsafe MaxNodes"}},
		{"deep flow nesting", goodYAML + "dataset_extra: " + strings.Repeat("[", 30000) + strings.Repeat("]", 30000) + "\n", nil,
			[]string{"config: c.yaml: yaml: collections nest 65 deep", "yamlsafe MaxDepth"}},
		{"deep flow nesting of 400 KB", goodYAML + "x: " + strings.Repeat("[", 200000) + strings.Repeat("]", 200000) + "\n", nil,
			[]string{"config: c.yaml: yaml: the document has 400", "yamlsafe MaxBytes"}},
		{"a second document", goodYAML + "---\nlearning_rate: 1\n", nil,
			[]string{"config: c.yaml: yaml: line 12, column 1: a second YAML document starts here", "remove the \"---\" line"}},
		{"alias bomb in an override", goodYAML, []string{"--init.overrides=" + flowAliasBomb},
			[]string{"command line: init.overrides", "yamlsafe MaxNodes"}},
		{"zero batch size", goodYAML + "per_device_train_batch_size: 0\n", nil,
			[]string{"c.yaml:12:30: per_device_train_batch_size: 0 would be taken for unset and replaced by the default (8)"}},
		{"zero max_length", strings.Replace(goodYAML, "max_length: 128", "max_length: 0", 1), nil,
			[]string{"c.yaml:6:13: max_length: 0 would be taken for unset", "default (1024)"}},
		{"zero nested key", goodYAML + "generation_eval: {max_new_tokens: 0}\n", nil, []string{"generation_eval.max_new_tokens: 0 would be taken for unset"}},
		{"zero adam_beta1", goodYAML + "adam_beta1: 0.0\n", nil, []string{"adam_beta1: 0 would be taken for unset and replaced by the default (0.9)"}},
		{"override zero", goodYAML, []string{"--max_length=0"}, []string{"command line: max_length: 0 would be taken for unset"}},
		{"override zero max_steps", goodYAML, []string{"--max_steps=0"}, []string{"max_steps: 0 would be taken for unset and replaced by the default (-1: num_train_epochs decides)"}},
		{"huge unknown override", goodYAML, []string{"--" + strings.Repeat("k", 1<<20) + "=1"}, []string{"command line: kkkk", "(1048576 bytes): unknown key"}},
		{"huge unknown key in the file", goodYAML + strings.Repeat("k", 60000) + ": 1\n", nil, []string{"unknown key \"kkkk", "(60000 bytes)"}},
		{"huge bad value", goodYAML, []string{"--max_length=" + strings.Repeat("x", 1<<20)}, []string{"bad value \"xxxx", "(1048576 bytes)"}},
		{"several errors at once", strings.Replace(goodYAML, "max_length: 128", "max_length: 1", 1) + "adam_beta1: 1\n", nil,
			[]string{"max_length: 1 must be", "adam_beta1: 1 must be in [0, 1)"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, err := ParseConfig([]byte(tc.yaml), "c.yaml", "sft", tc.overrides)
			if err == nil {
				t.Fatal("accepted")
			}
			if len(err.Error()) > 2000 {
				t.Errorf("the error is %d bytes long", len(err.Error()))
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q\nlacks %q", err, w)
				}
			}
		})
	}
}

func TestOverridesApply(t *testing.T) {
	cfg, err := ParseConfig([]byte(goodYAML), "c.yaml", "sft", []string{"--learning_rate=1e-3", "max_steps=7", "--dataset.eval_split=0.2", "--packing=false", "--init.arch=qwen3", "--model_name_or_path=", "--tokenizer_name_or_path=tok"})
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Optim.LearningRate != 1e-3 || cfg.Sched.MaxSteps != 7 || cfg.Dataset.EvalSplit != 0.2 || *cfg.Batch.Packing || cfg.Model.Init == nil || cfg.Model.Init.Arch != "qwen3" {
		t.Fatalf("overrides not applied: %+v", cfg)
	}
}

func FuzzParseConfig(f *testing.F) {
	f.Add([]byte(goodYAML))
	f.Add([]byte("dataset: {path: 1}\n"))
	f.Add([]byte("init:\n  arch: qwen3\n  overrides: {hidden_size: 64}\n"))
	f.Add([]byte("max_length: [1, 2]\n"))
	f.Add([]byte("moe_balancing_rate: -1e-3\nrouter_aux_loss_coef: .nan\n"))
	f.Add([]byte(goodYAML + "moe_balancing_rate: 0.001\nrouter_aux_loss_coef: 0\n"))
	f.Fuzz(func(t *testing.T, src []byte) {
		cfg, err := ParseConfig(src, "f.yaml", "sft", nil)
		if err == nil {
			if cfg.Validate() != nil {
				t.Fatal("accepted a config that does not validate")
			}
			return
		}
		if !strings.HasPrefix(err.Error(), "config: ") {
			t.Fatalf("error without the package prefix: %v", err)
		}
	})
}

// TestLoadConfigResolvesInputsFromTheConfigDirectory checks that a config's relative input
// paths work from the working directory and, failing that, from the config file's directory,
// and come out absolute (a session in another directory can load them); output_dir stays as
// written.
func TestLoadConfigResolvesInputsFromTheConfigDirectory(t *testing.T) {
	dir := t.TempDir()
	if err := os.MkdirAll(filepath.Join(dir, "tok"), 0o755); err != nil {
		t.Fatal(err)
	}
	data := filepath.Join(dir, "train.jsonl")
	if err := os.WriteFile(data, []byte(`{"text": "hello"}`+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	cfgPath := filepath.Join(dir, "run.yaml")
	yml := `init: {arch: qwen3, preset: tiny}
tokenizer_name_or_path: tok
dataset: {path: train.jsonl}
max_steps: 1
output_dir: out/run
`
	if err := os.WriteFile(cfgPath, []byte(yml), 0o644); err != nil {
		t.Fatal(err)
	}
	cfg, err := LoadConfig(cfgPath, MethodPretrain, nil)
	if err != nil {
		t.Fatal(err)
	}
	if got := cfg.Model.TokenizerNameOrPath; got != filepath.Join(dir, "tok") {
		t.Errorf("tokenizer path %q, want %q", got, filepath.Join(dir, "tok"))
	}
	if len(cfg.Dataset.Path) != 1 || cfg.Dataset.Path[0] != data {
		t.Errorf("dataset path %v, want [%s]", cfg.Dataset.Path, data)
	}
	if cfg.Run.OutputDir != "out/run" {
		t.Errorf("output_dir %q changed", cfg.Run.OutputDir)
	}
	// ParseConfig (bytes, no file) leaves relative paths alone.
	raw, err := ParseConfig([]byte(yml), "bytes.yaml", MethodPretrain, nil)
	if err != nil {
		t.Fatal(err)
	}
	if raw.Model.TokenizerNameOrPath != "tok" {
		t.Errorf("ParseConfig rewrote the tokenizer path to %q", raw.Model.TokenizerNameOrPath)
	}
}
