package train

import (
	"strings"
	"testing"
)

func TestQLoRAConfigKeys(t *testing.T) {
	path := writeJSONL(t, t.TempDir(), "d.jsonl", pcRecords(4))
	for _, c := range []struct {
		name  string
		extra []string
		want  string // "" accepts
	}{
		{"nf4 nested", []string{"--use_peft=true", "--load_in_4bit=true", "--use_bnb_nested_quant=true", "--bnb_4bit_compute_dtype=bfloat16"}, ""},
		{"transformers names", []string{"--use_peft=true", "--load_in_4bit=true", "--bnb_4bit_quant_type=nf4", "--bnb_4bit_use_double_quant=true"}, ""},
		{"without use_peft", []string{"--load_in_4bit=true"}, "load_in_4bit: a 4-bit base is frozen"},
		{"fp4", []string{"--use_peft=true", "--load_in_4bit=true", "--bnb_4bit_quant_type=fp4"}, "bnb_4bit_quant_type: quant: bnb_4bit_quant_type fp4 is not supported"},
		{"float16 compute", []string{"--use_peft=true", "--load_in_4bit=true", "--bnb_4bit_compute_dtype=float16"}, "bnb_4bit_compute_dtype"},
		{"keys without load_in_4bit", []string{"--use_peft=true", "--use_bnb_nested_quant=true"}, "load_in_4bit is not"},
	} {
		t.Run(c.name, func(t *testing.T) {
			y := "init: {arch: qwen3, preset: tiny}\ntokenizer_name_or_path: " + quickTok + "\ndataset: {path: " + path + "}\noutput_dir: " + t.TempDir() + "\n"
			_, err := ParseConfig([]byte(y), "test.yaml", MethodSFT, c.extra)
			switch {
			case c.want == "" && err != nil:
				t.Fatalf("refused: %v", err)
			case c.want != "" && (err == nil || !strings.Contains(err.Error(), c.want)):
				t.Fatalf("got %v, want an error containing %q", err, c.want)
			}
		})
	}
}

// TestQLoRARun: with load_in_4bit the trainer stores the base's linears in NF4 before the
// adapters attach, training lowers the loss, and the memory estimate counts the NF4 base
// exactly as the model holds it (arena, NF4 weights, adapters) plus the scratch.
func TestQLoRARun(t *testing.T) {
	path := writeJSONL(t, t.TempDir(), "d.jsonl", pcRecords(40))
	cfg := tinyConfig(t, path, "--use_peft=true", "--load_in_4bit=true", "--use_bnb_nested_quant=true",
		"--lora_target_modules=all-linear", "--lora_r=4", "--learning_rate=1e-2")
	tr := newTrainer(t, cfg)
	m := tr.model
	ok, nf4, _ := m.Quantized()
	if !ok || len(m.QuantizedNames()) == 0 {
		t.Fatal("load_in_4bit left the base in full precision")
	}
	losses := steps(t, tr, 6)
	if !(losses[5] < losses[0]) {
		t.Fatalf("QLoRA steps did not lower the loss: %v", losses)
	}
	_, _, scratch := m.Quantized()
	mc, err := ModelConfigFor(cfg)
	if err != nil {
		t.Fatal(err)
	}
	e, err := EstimateMemory(cfg, mc)
	if err != nil {
		t.Fatal(err)
	}
	held := m.Params.Flat.Bytes() + nf4 + int64(4*m.LoRA().NumParams())
	if e.ParamBytes != held {
		t.Errorf("the estimate counts %d parameter bytes, the model holds %d (arena, NF4 weights, adapters)", e.ParamBytes, held)
	}
	if e.ScratchBytes != scratch {
		t.Errorf("the estimate counts a %d-byte scratch, the model's is %d", e.ScratchBytes, scratch)
	}
	if !strings.Contains(e.String(), "in NF4") || !strings.Contains(e.String(), "nf4 weight scratch") {
		t.Errorf("the estimate does not show the NF4 base:\n%s", e)
	}
	plain, _ := EstimateMemory(tinyConfig(t, path, "--use_peft=true", "--lora_target_modules=all-linear", "--lora_r=4"), mc)
	if !(e.ParamBytes < plain.ParamBytes) {
		t.Errorf("NF4 parameters %d bytes, not fewer than the fp32 base's %d", e.ParamBytes, plain.ParamBytes)
	}
}
