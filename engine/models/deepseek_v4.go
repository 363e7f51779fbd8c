package models

import (
	"regexp"
	"strings"
)

// dsv4Renames map the names of DeepSeek-V4's own checkpoints (the Hub's release: attn / ffn,
// wq_a / wkv / wo_a, hc_attn_fn, ape, gate.bias ...) to transformers' module names, in the
// order transformers 5.17 applies them (its conversion mapping for deepseek_v4). A name
// already in transformers' form passes through unchanged.
var dsv4Renames = []struct {
	re  *regexp.Regexp
	out string
}{
	{regexp.MustCompile(`^embed\.weight$`), "embed_tokens.weight"},
	{regexp.MustCompile(`^head\.weight$`), "lm_head.weight"},
	{regexp.MustCompile(`^hc_head_(fn|base|scale)$`), "hc_head.hc_$1"},
	{regexp.MustCompile(`^layers\.(\d+)\.attn_norm\.`), "layers.$1.input_layernorm."},
	{regexp.MustCompile(`^layers\.(\d+)\.ffn_norm\.`), "layers.$1.post_attention_layernorm."},
	{regexp.MustCompile(`^layers\.(\d+)\.hc_attn_(fn|base|scale)$`), "layers.$1.attn_hc.$2"},
	{regexp.MustCompile(`^layers\.(\d+)\.hc_ffn_(fn|base|scale)$`), "layers.$1.ffn_hc.$2"},
	{regexp.MustCompile(`^layers\.(\d+)\.attn\.`), "layers.$1.self_attn."},
	{regexp.MustCompile(`^layers\.(\d+)\.ffn\.`), "layers.$1.mlp."},
	{regexp.MustCompile(`^layers\.(\d+)\.self_attn\.attn_sink$`), "layers.$1.self_attn.sinks"},
	{regexp.MustCompile(`^layers\.(\d+)\.self_attn\.indexer\.compressor\.norm\.`), "layers.$1.self_attn.compressor.indexer.kv_norm."},
	{regexp.MustCompile(`^layers\.(\d+)\.self_attn\.indexer\.compressor\.ape$`), "layers.$1.self_attn.compressor.indexer.position_bias"},
	{regexp.MustCompile(`^layers\.(\d+)\.self_attn\.indexer\.compressor\.`), "layers.$1.self_attn.compressor.indexer."},
	{regexp.MustCompile(`^layers\.(\d+)\.self_attn\.indexer\.weights_proj\.`), "layers.$1.self_attn.compressor.indexer.scorer.weights_proj."},
	{regexp.MustCompile(`^layers\.(\d+)\.self_attn\.indexer\.`), "layers.$1.self_attn.compressor.indexer."},
	{regexp.MustCompile(`^layers\.(\d+)\.self_attn\.compressor\.norm\.`), "layers.$1.self_attn.compressor.kv_norm."},
	{regexp.MustCompile(`^layers\.(\d+)\.self_attn\.compressor\.ape$`), "layers.$1.self_attn.compressor.position_bias"},
	{regexp.MustCompile(`^layers\.(\d+)\.self_attn\.(.*?\.)?wq_a\.`), "layers.$1.self_attn.${2}q_a_proj."},
	{regexp.MustCompile(`^layers\.(\d+)\.self_attn\.(.*?\.)?wq_b\.`), "layers.$1.self_attn.${2}q_b_proj."},
	{regexp.MustCompile(`^layers\.(\d+)\.self_attn\.(.*?\.)?wkv\.`), "layers.$1.self_attn.${2}kv_proj."},
	{regexp.MustCompile(`^layers\.(\d+)\.self_attn\.(.*?\.)?wgate\.`), "layers.$1.self_attn.${2}gate_proj."},
	{regexp.MustCompile(`^layers\.(\d+)\.self_attn\.(.*?\.)?wo_a\.`), "layers.$1.self_attn.${2}o_a_proj."},
	{regexp.MustCompile(`^layers\.(\d+)\.self_attn\.(.*?\.)?wo_b\.`), "layers.$1.self_attn.${2}o_b_proj."},
	{regexp.MustCompile(`^layers\.(\d+)\.self_attn\.q_norm\.`), "layers.$1.self_attn.q_a_norm."},
	{regexp.MustCompile(`^layers\.(\d+)\.self_attn\.norm\.`), "layers.$1.self_attn.kv_norm."},
	{regexp.MustCompile(`^layers\.(\d+)\.mlp\.gate\.bias$`), "layers.$1.mlp.gate.e_score_correction_bias"},
	{regexp.MustCompile(`^layers\.(\d+)\.mlp\.(shared_experts|experts\.\d+)\.w1\.`), "layers.$1.mlp.$2.gate_proj."},
	{regexp.MustCompile(`^layers\.(\d+)\.mlp\.(shared_experts|experts\.\d+)\.w2\.`), "layers.$1.mlp.$2.down_proj."},
	{regexp.MustCompile(`^layers\.(\d+)\.mlp\.(shared_experts|experts\.\d+)\.w3\.`), "layers.$1.mlp.$2.up_proj."},
}

// dsv4Name returns the transformers name of a DeepSeek-V4 checkpoint tensor (with or
// without the "model." prefix of the base model; lm_head.weight stays outside it).
func dsv4Name(disk string) string {
	n := strings.TrimPrefix(disk, "model.")
	if n == "lm_head.weight" {
		return n
	}
	for _, r := range dsv4Renames {
		n = r.re.ReplaceAllString(n, r.out)
	}
	if n == "lm_head.weight" {
		return n
	}
	return "model." + n
}
