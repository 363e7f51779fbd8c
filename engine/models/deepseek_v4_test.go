package models

import (
	"bytes"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/halo-shell/halo-shell/engine/hf/config"
	"github.com/halo-shell/halo-shell/engine/hf/safetensors"
	"github.com/halo-shell/halo-shell/engine/nn"
)

// TestDeepseekV4Names maps the names of DeepSeek's own checkpoints onto transformers' modules.
func TestDeepseekV4Names(t *testing.T) {
	for _, tc := range []struct{ disk, want string }{
		{"embed.weight", "model.embed_tokens.weight"},
		{"model.embed_tokens.weight", "model.embed_tokens.weight"},
		{"head.weight", "lm_head.weight"},
		{"lm_head.weight", "lm_head.weight"},
		{"norm.weight", "model.norm.weight"},
		{"hc_head_fn", "model.hc_head.hc_fn"},
		{"model.hc_head.hc_scale", "model.hc_head.hc_scale"},
		{"layers.3.attn_norm.weight", "model.layers.3.input_layernorm.weight"},
		{"model.layers.0.ffn_norm.weight", "model.layers.0.post_attention_layernorm.weight"},
		{"layers.0.hc_attn_fn", "model.layers.0.attn_hc.fn"},
		{"layers.0.hc_ffn_scale", "model.layers.0.ffn_hc.scale"},
		{"layers.1.attn.attn_sink", "model.layers.1.self_attn.sinks"},
		{"layers.1.attn.norm.weight", "model.layers.1.self_attn.kv_norm.weight"},
		{"layers.1.attn.q_norm.weight", "model.layers.1.self_attn.q_a_norm.weight"},
		{"layers.1.attn.wq_a.weight", "model.layers.1.self_attn.q_a_proj.weight"},
		{"layers.1.attn.wq_b.weight", "model.layers.1.self_attn.q_b_proj.weight"},
		{"layers.1.attn.wkv.weight", "model.layers.1.self_attn.kv_proj.weight"},
		{"layers.1.attn.wo_a.weight", "model.layers.1.self_attn.o_a_proj.weight"},
		{"layers.1.attn.wo_b.weight", "model.layers.1.self_attn.o_b_proj.weight"},
		{"layers.1.attn.compressor.ape", "model.layers.1.self_attn.compressor.position_bias"},
		{"layers.1.attn.compressor.norm.weight", "model.layers.1.self_attn.compressor.kv_norm.weight"},
		{"layers.1.attn.compressor.wkv.weight", "model.layers.1.self_attn.compressor.kv_proj.weight"},
		{"layers.1.attn.compressor.wgate.weight", "model.layers.1.self_attn.compressor.gate_proj.weight"},
		{"layers.1.attn.indexer.compressor.ape", "model.layers.1.self_attn.compressor.indexer.position_bias"},
		{"layers.1.attn.indexer.compressor.norm.weight", "model.layers.1.self_attn.compressor.indexer.kv_norm.weight"},
		{"layers.1.attn.indexer.compressor.wkv.weight", "model.layers.1.self_attn.compressor.indexer.kv_proj.weight"},
		{"layers.1.attn.indexer.wq_b.weight", "model.layers.1.self_attn.compressor.indexer.q_b_proj.weight"},
		{"layers.1.attn.indexer.weights_proj.weight", "model.layers.1.self_attn.compressor.indexer.scorer.weights_proj.weight"},
		{"layers.2.ffn.gate.bias", "model.layers.2.mlp.gate.e_score_correction_bias"},
		{"layers.2.ffn.gate.tid2eid", "model.layers.2.mlp.gate.tid2eid"},
		{"layers.2.ffn.experts.5.w1.weight", "model.layers.2.mlp.experts.5.gate_proj.weight"},
		{"layers.2.ffn.experts.5.w2.weight", "model.layers.2.mlp.experts.5.down_proj.weight"},
		{"layers.2.ffn.experts.5.w3.weight", "model.layers.2.mlp.experts.5.up_proj.weight"},
		{"layers.2.ffn.shared_experts.w3.weight", "model.layers.2.mlp.shared_experts.up_proj.weight"},
		{"model.layers.2.self_attn.compressor.indexer.scorer.weights_proj.weight", "model.layers.2.self_attn.compressor.indexer.scorer.weights_proj.weight"},
	} {
		if got := dsv4Name(tc.disk); got != tc.want {
			t.Errorf("%s: got %s, want %s", tc.disk, got, tc.want)
		}
	}
}

// A DeepSeek-V4 checkpoint saved here has transformers' tensors: DeepSeek's names, the same
// values (the hash layer's tid2eid table as int64) and the same config.json.
func TestDeepseekV4SavesTransformersCheckpoint(t *testing.T) {
	dir := filepath.Join("testdata", "parity", "deepseek_v4")
	m, err := Load(dir, newCPU(), Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	if len(m.Unused) != 0 {
		t.Errorf("unused tensors %v", m.Unused)
	}
	out := t.TempDir()
	if err := m.Save(out, SaveOptions{}); err != nil {
		t.Fatal(err)
	}
	want, err := safetensors.Open(filepath.Join(dir, "model.safetensors"))
	if err != nil {
		t.Fatal(err)
	}
	defer want.Close()
	got, err := safetensors.Open(filepath.Join(out, "model.safetensors"))
	if err != nil {
		t.Fatal(err)
	}
	defer got.Close()
	if !slices.Equal(got.Names(), want.Names()) {
		t.Fatalf("saved tensors %v, transformers saved %v", got.Names(), want.Names())
	}
	for _, n := range want.Names() {
		w, _ := want.Tensor(n)
		g, _ := got.Tensor(n)
		if g.DType != w.DType || !slices.Equal(g.Shape, w.Shape) || !bytes.Equal(g.Data, w.Data) {
			t.Errorf("%s: saved %s %v differs from transformers' %s %v", n, g.DType, g.Shape, w.DType, w.Shape)
		}
	}
	wc, _ := os.ReadFile(filepath.Join(dir, "config.json"))
	gc, _ := os.ReadFile(filepath.Join(out, "config.json"))
	if !bytes.Equal(gc, wc) {
		t.Errorf("saved config.json differs from transformers':\n%s", gc)
	}
}

// What the host decoder does not have is refused with the reason.
func TestDeepseekV4Refusals(t *testing.T) {
	c, err := config.Preset("deepseek_v4", "tiny")
	if err != nil {
		t.Fatal(err)
	}
	m, err := New(c, newCPU(), Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	if err := m.AttachLoRA(LoRAConfig{R: 4, Alpha: 8, Targets: []string{"all-linear"}}); err == nil || !strings.Contains(err.Error(), "host tape") {
		t.Errorf("LoRA: %v", err)
	}
	cm, err := New(c, newCPU(), Options{NumLabels: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer cm.Close()
	if _, err := cm.Scores(Batch{Tokens: []int32{1, 2, 3}}); err == nil {
		t.Error("a sequence classifier ran on the host decoder")
	}
	y := c.Clone()
	y.Rope.Type, y.Rope.Factor = "dynamic", 4
	if _, err := New(y, newCPU(), Options{}); err == nil || !strings.Contains(err.Error(), "rope") {
		t.Errorf("dynamic compress rope: %v", err)
	}
}

// A Hub-style file with a flat yarn rope_scaling rotates the compressed layers by yarn's
// table at attention factor 1 (DeepseekV4Config's __post_init__) and the sliding layers by
// the default one.
func TestDeepseekV4YarnCompressRope(t *testing.T) {
	c, err := config.Parse([]byte(`{"model_type": "deepseek_v4", "num_hidden_layers": 3, "vocab_size": 64,
		"hidden_size": 32, "num_attention_heads": 4, "head_dim": 16, "q_lora_rank": 8, "o_groups": 2,
		"o_lora_rank": 8, "n_routed_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 8,
		"hc_mult": 2, "hc_sinkhorn_iters": 3, "index_n_heads": 2, "index_head_dim": 8, "index_topk": 2,
		"sliding_window": 4, "partial_rotary_factor": 0.5, "pad_token_id": null,
		"compress_rates": {"compressed_sparse_attention": 2, "heavily_compressed_attention": 4},
		"layer_types": ["sliding_attention", "compressed_sparse_attention", "heavily_compressed_attention"],
		"rope_scaling": {"type": "yarn", "factor": 16.0, "original_max_position_embeddings": 64, "beta_fast": 32, "beta_slow": 1}}`), "hub")
	if err != nil {
		t.Fatal(err)
	}
	if c.Rope.Type != "yarn" || c.Rope.AttentionFactor != 1 || c.Rope.Theta != 160000 || c.SlidingRope.Type != "default" {
		t.Fatalf("compress rope %+v, main rope %+v", c.Rope, c.SlidingRope)
	}
	m, err := New(c, newCPU(), Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	if err := m.InitRandom(3); err != nil {
		t.Fatal(err)
	}
	dec, err := dsv4Decoder{}.decoder(m, func(string) *nn.HVar { return nil })
	if err != nil {
		t.Fatal(err)
	}
	inv, scale, err := m.Arch.Rope.Compute(0)
	if err != nil {
		t.Fatal(err)
	}
	if dec.Cfg.CompressScale != float64(scale) || scale != 1 || len(dec.Cfg.CompressInvFreq) != len(inv) || dec.Cfg.CompressInvFreq[3] != float64(inv[3]) {
		t.Errorf("compress table %v scale %v, yarn's %v scale %v", dec.Cfg.CompressInvFreq, dec.Cfg.CompressScale, inv, scale)
	}
	if want := nn.RopeInvFreq(10000, 8); !slices.Equal(dec.Cfg.MainInvFreq, want) || dec.Cfg.MainScale != 1 {
		t.Errorf("main table %v scale %v, want the default %v", dec.Cfg.MainInvFreq, dec.Cfg.MainScale, want)
	}
	lp, err := m.Logprobs([]int32{1, 5, 9, 2, 7, 3, 8, 4, 6, 10})
	if err != nil {
		t.Fatal(err)
	}
	for _, v := range lp {
		if math.IsNaN(float64(v)) || v > 0 {
			t.Fatalf("logprobs %v", lp)
		}
	}
}
