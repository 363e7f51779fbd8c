#!/usr/bin/env python3
"""Parity fixtures for halo-shell's model families, made by transformers itself.

For each case this creates a tiny random model with transformers, saves it as a Hugging Face
checkpoint (config.json + model.safetensors, float32) and records transformers' reference state:

  reference.json     input_ids (B x T), per-token logprobs (B x (T-1), float32 forward) and the
                     same in float64, the mean causal-LM loss, a packed-sequence case (documents run
                     separately, concatenated), and the losses of 3 AdamW steps on the same batch.
  grads.safetensors  d(loss)/d(param) for every parameter by its transformers parameter name
                     (float32; tied embeddings appear once, as model.embed_tokens.weight).
                     MoE cases: transformers 5.17's output loss already includes
                     router_aux_loss_coef * aux_loss when output_router_logits is set, so "loss"
                     and grads.safetensors are of CE + coef * aux, and "loss_total",
                     grads_total.safetensors and the AdamW objective are of CE + 2 * coef * aux.
                     MoE families whose transformers model computes no load-balancing loss
                     (deepseek_v3, glm4_moe, glm4_moe_lite: out.aux_loss is None) are plain CE
                     throughout: no aux_loss, no grads_total.safetensors, AdamW objective "ce".

AdamW: torch.optim.AdamW(lr=1e-3, betas=(0.9, 0.999), eps=1e-8), weight decay 0.1 on parameters
with ndim >= 2 and 0 on the rest, no clipping; "losses" holds the objective before step 1 and after
steps 1, 2 and 3 (for MoE cases with an aux loss the objective is CE + 2 * coef * aux_loss, see
above).

Everything runs on the CPU in float32 with deterministic algorithms, so no TF32 enters.

Usage: python3 make_fixtures.py OUTDIR [CASE ...]   (every case when none is named)
"""
import json
import math
import os
import sys

import torch
import transformers
from safetensors.torch import save_file
from transformers import AutoModelForCausalLM

torch.use_deterministic_algorithms(True)
torch.set_num_threads(min(8, os.cpu_count() or 1))

B, T = 2, 16
PACKED_DOCS = [10, 14]

BASE = dict(
    vocab_size=256,
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=128,
    rms_norm_eps=1e-6,
    initializer_range=0.2,
    bos_token_id=1,
    eos_token_id=2,
    pad_token_id=0,
)


def case(name, model_type, **kw):
    cfg = dict(BASE)
    cfg.update(kw)
    return name, model_type, cfg


CASES = [
    case("llama", "llama", tie_word_embeddings=False),
    case(
        "llama_tied_llama3",
        "llama",
        tie_word_embeddings=True,
        attention_bias=True,
        rope_parameters={
            "rope_type": "llama3",
            "rope_theta": 500000.0,
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 32,
        },
    ),
    case("mistral_swa", "mistral", sliding_window=6, tie_word_embeddings=False),
    case(
        "qwen2_yarn",
        "qwen2",
        tie_word_embeddings=True,
        rope_parameters={
            "rope_type": "yarn",
            "rope_theta": 10000.0,
            "factor": 4.0,
            "original_max_position_embeddings": 32,
        },
    ),
    case(
        "qwen3",
        "qwen3",
        head_dim=32,
        tie_word_embeddings=True,
        rope_parameters={"rope_type": "linear", "rope_theta": 1000000.0, "factor": 2.0},
    ),
    case(
        "qwen3_dynamic",
        "qwen3",
        head_dim=16,
        tie_word_embeddings=False,
        max_position_embeddings=8,
        rope_parameters={"rope_type": "dynamic", "rope_theta": 10000.0, "factor": 2.0},
    ),
    case(
        "qwen3_moe",
        "qwen3_moe",
        head_dim=16,
        num_experts=8,
        num_experts_per_tok=2,
        moe_intermediate_size=32,
        decoder_sparse_step=1,
        mlp_only_layers=[],
        norm_topk_prob=True,
        output_router_logits=True,
        router_aux_loss_coef=0.01,
        tie_word_embeddings=False,
    ),
    case(
        "qwen3_moe_sparse",
        "qwen3_moe",
        head_dim=16,
        num_experts=4,
        num_experts_per_tok=2,
        moe_intermediate_size=32,
        decoder_sparse_step=2,
        mlp_only_layers=[],
        norm_topk_prob=False,
        output_router_logits=True,
        router_aux_loss_coef=0.02,
        tie_word_embeddings=False,
    ),
    case(
        "mixtral",
        "mixtral",
        num_local_experts=4,
        num_experts_per_tok=2,
        output_router_logits=True,
        router_aux_loss_coef=0.02,
        tie_word_embeddings=False,
    ),
    case(
        "olmoe",
        "olmoe",
        num_experts=8,
        num_experts_per_tok=2,
        intermediate_size=32,
        norm_topk_prob=False,
        output_router_logits=True,
        router_aux_loss_coef=0.01,
        tie_word_embeddings=False,
    ),
    # Gemma 3 with every feature on, at odd sizes: 3 heads of 24 over 1 KV head, an MLP of 100,
    # a vocabulary of 263, explicit layer types with a window of 5 tokens on the sliding
    # layers (shorter than T), a local RoPE base beside a linearly scaled global one, a
    # query_pre_attn_scalar that is not head_dim, and a final-logit cap that bends the logits.
    case(
        "gemma3_text",
        "gemma3_text",
        vocab_size=263,
        hidden_size=72,
        intermediate_size=100,
        num_hidden_layers=3,
        num_attention_heads=3,
        num_key_value_heads=1,
        head_dim=24,
        layer_types=["sliding_attention", "full_attention", "sliding_attention"],
        sliding_window=5,
        query_pre_attn_scalar=20,
        final_logit_softcapping=3.0,
        attn_logit_softcapping=None,
        rope_parameters={
            "full_attention": {"rope_type": "linear", "factor": 2.0, "rope_theta": 1000000.0},
            "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
        },
        tie_word_embeddings=True,
    ),
]

# The families whose decoders depart from Llama's, in odd shapes (widths that are not powers of
# two, q width != hidden width, one KV head) with every feature their config has switched on.
ODD = dict(vocab_size=251, hidden_size=48, intermediate_size=72, num_attention_heads=6, num_key_value_heads=2)

CASES += [
    # Post-norms, q/k norms over the whole projections (a single KV head: k_norm of 8).
    case("olmo2", "olmo2", **dict(ODD, hidden_size=40, num_attention_heads=5, num_key_value_heads=1),
         tie_word_embeddings=False),
    # OLMo 2 plus the 3-in-4 sliding pattern over 4 layers.
    case("olmo3", "olmo3", **ODD, num_hidden_layers=4, sliding_window=5, tie_word_embeddings=False),
    # Fused qkv_proj and gate_up_proj; longrope over 3/4 of each head with T = 16 past the
    # original context of 8 (so the long factors and the attention factor sqrt(2) apply, for
    # the packed documents too: both are longer than 8); a sliding window on every layer.
    case("phi3_longrope", "phi3", **dict(ODD, num_attention_heads=3, num_key_value_heads=1),
         max_position_embeddings=64, original_max_position_embeddings=8, sliding_window=11,
         tie_word_embeddings=False,
         rope_parameters={
             "rope_type": "longrope",
             "rope_theta": 10000.0,
             "partial_rotary_factor": 0.75,
             "short_factor": [1.0, 1.1, 1.3, 1.6, 2.0, 2.5],
             "long_factor": [1.5, 2.0, 3.0, 4.5, 7.0, 11.0],
         }),
    # Every multiplier away from 1; biases on attention and MLP.
    case("granite", "granite", **ODD, attention_bias=True, mlp_bias=True, tie_word_embeddings=False,
         embedding_multiplier=6.0, residual_multiplier=0.3, attention_multiplier=0.2, logits_scaling=4.0),
    # NoPE on layers 1 and 3, which use a sliding window; attention and MLP biases; tied.
    case("smollm3", "smollm3", **dict(ODD, num_key_value_heads=3), num_hidden_layers=4,
         no_rope_layers=[1, 0, 1, 0], use_sliding_window=True, sliding_window=5,
         attention_bias=True, mlp_bias=True, tie_word_embeddings=True),
    # Four norms per layer, q/k/v biases, fused gate_up_proj, interleaved rotation of half of
    # each 12-wide head (3 pairs); q width 48 on a hidden width of 40.
    case("glm4", "glm4", **dict(ODD, hidden_size=40, num_attention_heads=4), head_dim=12,
         attention_bias=True, tie_word_embeddings=False),
    # Gated shared expert of 40 beside 6 experts of 24 (top 2), layer 1 dense, q/k/v biases.
    case("qwen2_moe", "qwen2_moe", **ODD, num_hidden_layers=3, num_experts=6, num_experts_per_tok=2,
         moe_intermediate_size=24, shared_expert_intermediate_size=40, decoder_sparse_step=1,
         mlp_only_layers=[1], norm_topk_prob=False, qkv_bias=True, output_router_logits=True,
         router_aux_loss_coef=0.01, tie_word_embeddings=False),
    # Sigmoid router with a (perturbed) correction bias and group-limited top-k (4 groups of 2,
    # best 2), scaled weights, one shared expert, a dense first layer, per-head q/k norms,
    # partial rotary (0.5 of 16).
    case("glm4_moe", "glm4_moe", **dict(ODD, num_attention_heads=4), head_dim=16, num_hidden_layers=3,
         n_routed_experts=8, num_experts_per_tok=2, n_group=4, topk_group=2, routed_scaling_factor=2.5,
         n_shared_experts=1, first_k_dense_replace=1, moe_intermediate_size=24, norm_topk_prob=True,
         use_qk_norm=True, attention_bias=True, tie_word_embeddings=False),
    # Multi-head latent attention: q LoRA, interleaved rotary dims, yarn with mscale_all_dim (so
    # the softmax scale carries mscale^2 and cos/sin the mscale ratio), values narrower than the
    # query/key heads (7 < 10 + 6), attention biases; the sigmoid router over 8 experts in 4
    # groups (best 2) with a perturbed correction bias, top 3, renormalised and scaled weights,
    # two shared experts, two dense layers first.
    case("deepseek_v3", "deepseek_v3", **dict(ODD, num_attention_heads=3, num_key_value_heads=3),
         num_hidden_layers=4, max_position_embeddings=64,
         q_lora_rank=20, kv_lora_rank=14, qk_nope_head_dim=10, qk_rope_head_dim=6, v_head_dim=7,
         n_routed_experts=8, num_experts_per_tok=3, n_group=4, topk_group=2, routed_scaling_factor=2.5,
         n_shared_experts=2, first_k_dense_replace=2, moe_intermediate_size=12, norm_topk_prob=True,
         attention_bias=True, rope_interleave=True, tie_word_embeddings=False,
         rope_parameters={"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0,
                          "original_max_position_embeddings": 16, "beta_fast": 32.0, "beta_slow": 1.0,
                          "mscale": 1.0, "mscale_all_dim": 0.7}),
    # A plain q_proj, rotate-half rotary dims, values wider than the query/key heads (13 > 4 + 6),
    # no expert groups, raw (not renormalised) scaled weights, one dense layer.
    case("deepseek_v3_qproj", "deepseek_v3", **dict(ODD, num_attention_heads=5, num_key_value_heads=5),
         num_hidden_layers=3, q_lora_rank=None, kv_lora_rank=9, qk_nope_head_dim=4, qk_rope_head_dim=6,
         v_head_dim=13, n_routed_experts=6, num_experts_per_tok=2, n_group=1, topk_group=1,
         routed_scaling_factor=1.5, n_shared_experts=1, first_k_dense_replace=1, moe_intermediate_size=16,
         norm_topk_prob=False, rope_interleave=False, tie_word_embeddings=False),
    # GLM-4.7-Flash: mlp_layer_types with a dense layer between sparse ones, q LoRA, values as
    # wide as the query/key heads, 2 groups of 4 (best 1); rms_norm_eps 1e-5 as the Hub model's,
    # which the latent norms do not take (they keep 1e-6).
    case("glm4_moe_lite", "glm4_moe_lite", **dict(ODD, num_attention_heads=4, num_key_value_heads=4),
         rms_norm_eps=1e-5,
         num_hidden_layers=4, mlp_layer_types=["dense", "sparse", "dense", "sparse"],
         q_lora_rank=18, kv_lora_rank=12, qk_nope_head_dim=8, qk_rope_head_dim=4, v_head_dim=12,
         n_routed_experts=8, num_experts_per_tok=2, n_group=2, topk_group=1, routed_scaling_factor=1.8,
         n_shared_experts=1, moe_intermediate_size=20, norm_topk_prob=True, tie_word_embeddings=False),
]

# gpt-oss with every feature on, at odd sizes: 6 heads of 10 over 2 KV heads, 5 experts of 20
# (top 2), alternating sliding (window 5, shorter than T) and full layers over 3 layers, yarn
# RoPE without truncation, attention sinks and biases, the router's and the experts' biases,
# and a swiglu_limit of 1.0, which transformers' experts do not read (they clamp at 7.0): the
# case checks that the model ignores it likewise.
CASES += [
    case("gpt_oss", "gpt_oss", vocab_size=251, hidden_size=48, intermediate_size=20, num_hidden_layers=3,
         num_attention_heads=6, num_key_value_heads=2, head_dim=10, num_local_experts=5, num_experts_per_tok=2,
         sliding_window=5, swiglu_limit=1.0, attention_bias=True, output_router_logits=False,
         rope_parameters={"rope_type": "yarn", "factor": 4.0, "beta_fast": 32.0, "beta_slow": 1.0,
                          "original_max_position_embeddings": 8, "rope_theta": 10000.0, "truncate": False},
         tie_word_embeddings=False),
]

# Gemma 4's text decoder at odd sizes with what the first case's model implements switched on:
# sliding layers (window 5) with heads of 16 beside full layers with heads of 24 (global_head_dim)
# over one shared key/value projection (attention_k_eq_v, num_global_key_value_heads), q/k norms
# and the unscaled value norm, proportional RoPE over half of each global head, a final-logit
# cap, and no per-layer inputs. The second case turns on the rest of the decoder: per-layer
# input embeddings, the last two layers reading the keys and values of earlier ones
# (num_kv_shared_layers) with double-wide MLPs, and the MoE block beside the dense MLP.
GEMMA4_ROPE = {
    "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
    "full_attention": {"rope_type": "proportional", "partial_rotary_factor": 0.5, "rope_theta": 1000000.0},
}
CASES += [
    case("gemma4_text", "gemma4_text", vocab_size=263, hidden_size=64, intermediate_size=100,
         num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
         global_head_dim=24, num_global_key_value_heads=1, attention_k_eq_v=True,
         layer_types=["sliding_attention", "full_attention", "sliding_attention", "full_attention"],
         sliding_window=5, final_logit_softcapping=3.0, hidden_size_per_layer_input=0,
         num_kv_shared_layers=0, enable_moe_block=False, use_double_wide_mlp=False,
         rope_parameters=GEMMA4_ROPE, tie_word_embeddings=True),
    case("gemma4_text_ple", "gemma4_text", vocab_size=263, hidden_size=64, intermediate_size=100,
         num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
         global_head_dim=24, attention_k_eq_v=False,
         layer_types=["sliding_attention", "full_attention", "sliding_attention", "full_attention"],
         sliding_window=5, final_logit_softcapping=3.0, hidden_size_per_layer_input=8,
         vocab_size_per_layer_input=263, num_kv_shared_layers=2, use_double_wide_mlp=True,
         enable_moe_block=True, num_experts=4, top_k_experts=2, moe_intermediate_size=24,
         rope_parameters=GEMMA4_ROPE, tie_word_embeddings=True),
]

# LFM2-MoE: short-convolution layers (depthwise causal conv of conv_L_cache taps between the
# B/C gates of in_proj) beside attention layers with per-head q/k layernorms; dense SwiGLU
# feed-forward in the first num_dense_layers layers and, after them, a sigmoid router whose
# expert_bias buffer (perturbed) only chooses, renormalised and scaled weights. The first case
# has every switch on (conv biases, expert bias, renormalisation, a scaling factor, tied
# embeddings); the second the other side of each (a 4-tap conv without biases, raw weights,
# every layer sparse, an untied head). norm_eps replaces BASE's rms_norm_eps.
LFM2 = dict(BASE, vocab_size=251, hidden_size=64, intermediate_size=100, num_attention_heads=4,
            num_key_value_heads=2, norm_eps=1e-5)
del LFM2["rms_norm_eps"]
CASES += [
    ("lfm2_moe", "lfm2_moe", dict(LFM2, num_hidden_layers=4,
                                  layer_types=["conv", "full_attention", "conv", "full_attention"],
                                  conv_bias=True, conv_L_cache=3, num_dense_layers=1, num_experts=6,
                                  num_experts_per_tok=2, moe_intermediate_size=24, use_expert_bias=True,
                                  routed_scaling_factor=1.5, norm_topk_prob=True,
                                  rope_parameters={"rope_type": "default", "rope_theta": 1000000.0},
                                  tie_word_embeddings=True)),
    ("lfm2_moe_raw", "lfm2_moe", dict(LFM2, num_hidden_layers=3,
                                      layer_types=["full_attention", "conv", "conv"],
                                      conv_bias=False, conv_L_cache=4, num_dense_layers=0, num_experts=5,
                                      num_experts_per_tok=3, moe_intermediate_size=20, use_expert_bias=False,
                                      routed_scaling_factor=1.0, norm_topk_prob=False,
                                      rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
                                      tie_word_embeddings=False)),
]

# Gated delta-net linear attention beside gated full attention, at odd sizes. qwen3_next:
# explicit layer types (linear, full, linear, full); 2 key heads of 12 serving 4 value heads of
# 10 (each key head feeds 2 consecutive value heads), a conv kernel of 3; full attention of 3
# heads of 20 over 1 KV head with its sigmoid output gate, per-head q/k norms, biases, rotary
# over half of each head; 6 experts of 24 (top 2, not renormalised) plus a gated shared expert
# of 40, with layer 2 dense (mlp_only_layers).
CASES += [
    case("qwen3_next", "qwen3_next", vocab_size=251, hidden_size=64, intermediate_size=72, num_hidden_layers=4,
         num_attention_heads=3, num_key_value_heads=1, head_dim=20, attention_bias=True,
         layer_types=["linear_attention", "full_attention", "linear_attention", "full_attention"],
         linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=12, linear_value_head_dim=10,
         linear_conv_kernel_dim=3, num_experts=6, num_experts_per_tok=2, moe_intermediate_size=24,
         shared_expert_intermediate_size=40, decoder_sparse_step=1, mlp_only_layers=[2], norm_topk_prob=False,
         output_router_logits=True, router_aux_loss_coef=0.01, tie_word_embeddings=False, partial_rotary_factor=0.5,
         rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.5}),
]
# Qwen3.5-MoE's text model: layer types from full_attention_interval 2 (linear, full, linear,
# full), 2 key heads of 8 serving 6 value heads of 14 (3 each), the default conv kernel of 4 and
# the default partial rotary factor 0.25 (4 of 16 dims), the Hub's mrope keys (text positions
# make them plain RoPE), 5 experts of 20 (top 3, always renormalised) plus a gated shared expert
# of 28 in every layer, tied embeddings.
CASES += [
    case("qwen3_5_moe_text", "qwen3_5_moe_text", vocab_size=263, hidden_size=64, num_hidden_layers=4,
         num_attention_heads=4, num_key_value_heads=2, head_dim=16, full_attention_interval=2,
         linear_num_key_heads=2, linear_num_value_heads=6, linear_key_head_dim=8, linear_value_head_dim=14,
         num_experts=5, num_experts_per_tok=3, moe_intermediate_size=20, shared_expert_intermediate_size=28,
         output_router_logits=True, router_aux_loss_coef=0.02, tie_word_embeddings=True,
         rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "mrope_section": [1, 1, 0],
                          "mrope_interleaved": True}),
]
# More MoE families built from the blocks above, in odd shapes with every feature on.
CASES += [
    # FlexOlmo: OLMo 2's post-norms and projection-wide q/k norms (6 heads of 8, attention
    # biases) around OLMoE's experts: 5 of 24, top 2, renormalised, with the aux loss.
    # num_key_value_heads=None: FlexOlmoConfig.__post_init__ fills it from the heads.
    case("flex_olmo", "flex_olmo", **dict(ODD, num_key_value_heads=None, intermediate_size=24),
         num_hidden_layers=2, num_experts=5, num_experts_per_tok=2, norm_topk_prob=True,
         attention_bias=True, output_router_logits=True, router_aux_loss_coef=0.02,
         tie_word_embeddings=False),
    # Granite MoE: every multiplier away from 1, attention biases, 5 experts of 24 (top 2, the
    # softmax over the two logits) held fused (input_linear, output_linear); no aux loss:
    # transformers 5.17's GraniteMoe records no router logits (its pretrained class has no
    # router_logits recorder), so with output_router_logits=True load_balancing_loss_func gets
    # None, returns the int 0, and GraniteMoeForCausalLM.forward fails on `aux_loss.to(...)`
    # whenever labels are given.
    case("granitemoe", "granitemoe", **dict(ODD, intermediate_size=24), num_hidden_layers=2,
         num_local_experts=5, num_experts_per_tok=2, attention_bias=True, embedding_multiplier=6.0,
         residual_multiplier=0.3, attention_multiplier=0.2, logits_scaling=4.0,
         output_router_logits=False, tie_word_embeddings=False),
    # HunYuan MoE: per-head q/k norms after RoPE, heads of 12 on a width of 48 (head_dim given:
    # transformers' attention does not derive it), attention biases, 5 experts of 24 (top 2,
    # renormalised) beside a shared MLP of 24; no aux loss in transformers.
    case("hunyuan_v1_moe", "hunyuan_v1_moe", **dict(ODD, intermediate_size=24), head_dim=12,
         num_hidden_layers=2, num_experts=5, moe_topk=2, attention_bias=True, tie_word_embeddings=False),
    # ERNIE 4.5 MoE: interleaved rotary pairs, a dense first layer (72 wide), then 5 experts of 20
    # (top 2, softmax plus the perturbed moe_statics correction bias for the choice, renormalised)
    # beside a shared MLP of 2 x 20, with the aux loss.
    case("ernie4_5_moe", "ernie4_5_moe", **ODD, num_hidden_layers=3, moe_num_experts=5, moe_k=2,
         moe_intermediate_size=20, moe_num_shared_experts=2, moe_layer_start_index=1, moe_layer_end_index=-1,
         moe_layer_interval=1, output_router_logits=True, router_aux_loss_coef=0.02, tie_word_embeddings=False),
    # MiniMax-M2: q/k norms over the whole projections (6 heads of 12 over 2 KV heads), 6 experts
    # of 24 (top 2) chosen by sigmoid plus the perturbed correction bias and weighted by the
    # renormalised sigmoids; no aux loss (its softmax over the sigmoid router's logits is not
    # implemented here).
    case("minimax_m2", "minimax_m2", **dict(ODD, intermediate_size=24), head_dim=12, num_hidden_layers=2,
         num_local_experts=6, num_experts_per_tok=2, output_router_logits=False, tie_word_embeddings=False),
    # PhiMoE: LayerNorms with biases (every norm), attention and lm_head biases, 5 experts of 24
    # under the sparsemixer router with its threshold (router_jitter_noise) at 0.3 so that its
    # stages keep several experts, with the aux loss; longrope over the heads of 8 with T = 16
    # past the original context of 8, cos and sin scaled by the (equal) mscales. Trained in eval
    # mode (EVAL_TRAINING).
    case("phimoe", "phimoe", **dict(ODD, intermediate_size=24), num_hidden_layers=2, num_local_experts=5,
         num_experts_per_tok=2, router_jitter_noise=0.3, attention_bias=True, lm_head_bias=True,
         output_router_logits=True, router_aux_loss_coef=0.02, tie_word_embeddings=False,
         max_position_embeddings=64,
         rope_parameters={
             "rope_type": "longrope",
             "rope_theta": 10000.0,
             "original_max_position_embeddings": 8,
             "short_factor": [1.0, 1.2, 1.5, 2.0],
             "long_factor": [1.5, 3.0, 5.0, 9.0],
             "short_mscale": 1.2,
             "long_mscale": 1.2,
         }),
    # Laguna: per-head q/k norms and softplus output gates (g_proj), sliding (window 5) and full
    # layers with their own rotary bases and widths (all of each 12-wide head, half of it),
    # attention biases, a dense first layer (40 wide), then 6 experts of 20 (top 2, sigmoid plus
    # the perturbed correction bias for the choice, renormalised, scaled 1.5) beside an ungated
    # shared expert of 28; no aux loss (transformers' takes a softmax over this router's logits).
    case("laguna", "laguna", **dict(ODD, intermediate_size=40), head_dim=12, num_hidden_layers=3,
         num_experts=6, num_experts_per_tok=2, moe_intermediate_size=20, shared_expert_intermediate_size=28,
         moe_routed_scaling_factor=1.5, sliding_window=5, attention_bias=True,
         layer_types=["sliding_attention", "full_attention", "sliding_attention"],
         mlp_layer_types=["dense", "sparse", "sparse"], output_router_logits=False, tie_word_embeddings=False,
         rope_parameters={
             "full_attention": {"rope_type": "default", "rope_theta": 500000.0, "partial_rotary_factor": 0.5},
             "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 1.0},
         }),
    # Cohere2-MoE (Command-A Plus): the parallel layer (one norm feeding attention and MLP, both
    # added to the residual) with LayerNorms without bias (rms_norm_eps null), interleaved rotary
    # pairs on the sliding layers and on the dense first layer (prefix pattern 1) while the full
    # sparse layer attends unrotated, a window of 5, heads of 8 (head_dim given: the config's
    # default is 128), attention biases, logits scaled by 0.5, an untied head; the dense layer
    # 40 wide from first_k_dense_replace (popped by transformers, which writes layer_types and
    # mlp_layer_types), then 6 experts of 24 (top 2, softmax of the top-2 logits) averaged with
    # a shared expert of 2 x 24; no aux loss in transformers.
    case("cohere2_moe", "cohere2_moe", **dict(ODD, intermediate_size=24), head_dim=8, num_hidden_layers=3,
         first_k_dense_replace=1, prefix_dense_intermediate_size=40, sliding_window_pattern=2, sliding_window=5,
         num_experts=6, num_experts_per_tok=2, num_shared_experts=2, shared_expert_combination_strategy="average",
         expert_selection_fn="softmax", rms_norm_eps=None, layer_norm_eps=1e-5, attention_bias=True,
         logit_scale=0.5, tie_word_embeddings=False),
    # Its other router and norm: RMSNorms (rms_norm_eps), the sigmoid of the top-3 logits without
    # renormalisation, the shared expert summed; two dense layers under prefix pattern 2 (a
    # sliding one, then a full one left unrotated), then a sliding and a full sparse layer.
    case("cohere2_moe_sigmoid", "cohere2_moe", **dict(ODD, intermediate_size=24), head_dim=8,
         num_hidden_layers=4, first_k_dense_replace=2, prefix_dense_sliding_window_pattern=2,
         prefix_dense_intermediate_size=40, sliding_window_pattern=2, sliding_window=5, num_experts=6,
         num_experts_per_tok=3, num_shared_experts=1, shared_expert_combination_strategy="sum",
         expert_selection_fn="sigmoid", norm_topk_prob=False, rms_norm_eps=1e-6, logit_scale=1.5,
         tie_word_embeddings=False),
]

# DeepSeek-V4, every feature on at tiny sizes, as a reference for the model to be written against
# (halo-shell does not build this family yet): two hyper-connection streams with 5 Sinkhorn
# iterations, one layer of each attention type (sliding only; compressed sparse, CSA, every 4
# tokens with its lightning indexer keeping 2 entries; heavily compressed, HCA, every 8), a
# sliding window of 6 (shorter than T), one shared KV head of 16 with interleaved rotary dims
# over half of it and attention sinks, q LoRA of 20, the grouped output projection (2 groups of
# 12), a hash-routed first layer (tid2eid perturbed to distinct experts) and two sqrtsoftplus
# routed layers, 6 experts of 16 (top 2, scaled 1.5) plus a shared expert, the SwiGLU clamp at
# 0.5 so that it bites. BASE's intermediate_size is left out: DeepseekV4Config maps it onto
# moe_intermediate_size.
DSV4 = {k: v for k, v in BASE.items() if k != "intermediate_size"}
DSV4.update(vocab_size=251, hidden_size=48, moe_intermediate_size=16, num_hidden_layers=3,
            num_attention_heads=4, num_key_value_heads=1, head_dim=16, q_lora_rank=20,
            partial_rotary_factor=0.5, num_experts_per_tok=2, n_routed_experts=6, n_shared_experts=1,
            scoring_func="sqrtsoftplus", norm_topk_prob=True, routed_scaling_factor=1.5,
            layer_types=["sliding_attention", "compressed_sparse_attention", "heavily_compressed_attention"],
            compress_rates={"compressed_sparse_attention": 4, "heavily_compressed_attention": 8},
            compress_rope_theta=160000.0, rope_theta=10000.0, hc_mult=2, hc_sinkhorn_iters=5,
            mlp_layer_types=["hash_moe", "moe", "moe"], swiglu_limit=0.5, sliding_window=6,
            o_groups=2, o_lora_rank=12, index_n_heads=2, index_head_dim=8, index_topk=2,
            num_nextn_predict_layers=0, output_router_logits=False, tie_word_embeddings=False)
CASES += [("deepseek_v4", "deepseek_v4", DSV4)]

# JetMoE, appended last so that the seeds of the cases above (their places in CASES) stay: a
# mixture of attention heads (4 experts, top 2, each with its own query and output projections
# of 2 KV heads x 6 over one shared kv_proj, so 4 query heads of 6 on a width of 24) and 4 GLU
# experts of 20 (top 2, softmax of the top-2 logits), each block with an output bias (mlp.bias,
# self_attention.experts.bias: zero at init, randomised by perturb), tied embeddings; no aux
# loss (output_router_logits=False: halo-shell refuses it for this family). JetMoeConfig
# derives num_attention_heads as num_key_value_heads * num_experts_per_tok; it is given here as
# that value so that no other one reaches the config.
CASES += [
    case("jetmoe", "jetmoe", vocab_size=61, hidden_size=24, num_hidden_layers=2, num_key_value_heads=2,
         num_attention_heads=4, kv_channels=6, num_local_experts=4, num_experts_per_tok=2,
         intermediate_size=20, activation_function="silu", output_router_logits=False,
         initializer_range=0.2, tie_word_embeddings=True),
]

# Keys of BASE that a family's config does not have (transformers would keep them as extra
# attributes and write them to config.json).
NOT_KEYS = {"qwen3_5_moe_text": ("intermediate_size",)}
CASES = [(n, mt, {k: v for k, v in kw.items() if k not in NOT_KEYS.get(mt, ())}) for n, mt, kw in CASES]

MOE_FAMILIES = ("qwen3_moe", "mixtral", "olmoe", "qwen2_moe", "glm4_moe", "deepseek_v3", "glm4_moe_lite",
                "lfm2_moe", "qwen3_next", "qwen3_5_moe_text", "flex_olmo",
                "granitemoe", "hunyuan_v1_moe", "ernie4_5_moe", "minimax_m2", "deepseek_v4",
                "laguna", "phimoe", "cohere2_moe", "jetmoe")
# Families with gated delta-net layers (torch_linear_attention).
LINEAR_ATTENTION = ("qwen3_next", "qwen3_5_moe_text")
# Families whose training mode is random where halo-shell's is not: PhiMoE's sparsemixer samples
# its experts (Gumbel noise) and its gradient estimator draws a random midpoint mask in training
# mode. Their AdamW steps run in eval mode, whose routing and exact gradient halo-shell computes.
EVAL_TRAINING = ("phimoe",)
# Families whose experts need transformers' eager experts implementation in float64.
EAGER_EXPERTS = MOE_FAMILIES + ("gpt_oss",)


def perturb(model, seed):
    """Make norms, biases and routing-correction buffers non-trivial so the fixtures exercise them."""
    g = torch.Generator().manual_seed(seed + 7)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.ndim == 1:
                if "norm" in name and not p.any():
                    # Gemma's norms scale by 1 + w and start at zero: give w its own noise.
                    p.copy_(0.1 * torch.randn(p.shape, generator=g))
                elif "norm" in name:
                    p.mul_(1.0 + 0.1 * torch.randn(p.shape, generator=g))
                else:
                    p.copy_(0.1 * torch.randn(p.shape, generator=g))
            elif name.endswith("_bias"):
                # gpt-oss's stacked expert biases [E, 2I] and [E, C] start at zero.
                p.copy_(0.1 * torch.randn(p.shape, generator=g))
            elif not p.any():
                # A matrix transformers' init leaves at zero (ERNIE 4.5's router weight, a bare
                # parameter of Ernie4_5_MoeTopKRouter): every router probability would tie, and
                # the experts the aux loss counts would depend on how torch.topk breaks ties.
                p.copy_(model.config.initializer_range * torch.randn(p.shape, generator=g))
        for name, b in model.named_buffers():
            if name.endswith("e_score_correction_bias") or name.endswith("expert_bias"):
                # Selection-only router biases (DeepSeek's, LFM2-MoE's).
                b.copy_(0.05 * torch.randn(b.shape, generator=g))
            elif name.endswith("layer_scalar"):
                # Gemma 4's per-layer output scale, a checkpoint buffer of ones.
                b.copy_(1.0 + 0.2 * torch.randn(b.shape, generator=g))
            elif name.endswith("tid2eid"):
                # DeepSeek-V4's hash routing table [vocab, top_k] starts at zero (every token to
                # expert 0): give each token top_k distinct experts.
                e = model.config.n_routed_experts
                b.copy_(torch.argsort(torch.rand(b.shape[0], e, generator=g), dim=1)[:, : b.shape[1]])


def torch_linear_attention(model):
    """Make gated delta-net layers use transformers' torch fallbacks (the causal conv1d and the
    chunked gated delta rule written in torch), whatever kernels the machine has installed: the
    references are of that path, in float32 on the CPU."""
    import importlib
    mod = importlib.import_module(type(model).__module__)
    chunk = getattr(mod, "torch_chunk_gated_delta_rule", None)
    recurrent = getattr(mod, "torch_recurrent_gated_delta_rule", None)
    for m in model.modules():
        if hasattr(m, "causal_conv1d_fn"):
            m.causal_conv1d_fn = None
        if chunk is not None and hasattr(m, "chunk_gated_delta_rule"):
            m.chunk_gated_delta_rule = chunk
        if recurrent is not None and hasattr(m, "recurrent_gated_delta_rule"):
            m.recurrent_gated_delta_rule = recurrent


def token_logprobs(logits, ids):
    lp = torch.log_softmax(logits.float() if logits.dtype != torch.float64 else logits, dim=-1)
    return lp[:, :-1, :].gather(-1, ids[:, 1:].unsqueeze(-1)).squeeze(-1)


def aux_coef(config):
    """The load-balancing loss's coefficient (JetMoeConfig names it aux_loss_coef)."""
    coef = getattr(config, "router_aux_loss_coef", None)
    return config.aux_loss_coef if coef is None else coef


def objective(model, ids, is_moe):
    out = model(input_ids=ids, labels=ids)
    ce = out.loss
    if is_moe and getattr(out, "aux_loss", None) is not None:
        return ce, ce + aux_coef(model.config) * out.aux_loss, out.aux_loss
    return ce, ce, None


def checkpoint_names(model, d):
    """Each parameter's name in the checkpoint that save_pretrained wrote to d. transformers
    renames some families' parameters on save (granitemoe's fused experts are gate_up_proj in
    memory and input_linear.weight on disk), and a checkpoint reader knows only the saved names;
    a parameter is matched to the saved tensor of equal shape and equal values (the weights are
    random, so the match is unique)."""
    from safetensors import safe_open

    saved = {}
    for f in sorted(os.listdir(d)):
        if f.endswith(".safetensors"):
            with safe_open(os.path.join(d, f), framework="pt") as st:
                for k in st.keys():
                    saved[k] = st.get_tensor(k)
    def match(v):
        return [k for k, t in saved.items() if t.shape == v.shape and torch.equal(t.to(v.dtype), v)]

    whole = lambda t: t
    names = {}
    for n, p in model.named_parameters():
        if n in saved and saved[n].shape == p.shape:
            names[n] = [(n, whole)]
            continue
        v = p.detach().cpu()
        hits = match(v)
        if len(hits) == 1:
            names[n] = [(hits[0], whole)]
            continue
        # A stacked expert tensor [E, ...] that the checkpoint stores per expert: each expert's
        # slice whole (down_proj) or as two halves of its rows (gate_up_proj: gate, then up),
        # in memory's orientation or transposed.
        parts = split_experts(n, v, match)
        if parts is None:
            raise RuntimeError(f"parameter {n} {tuple(p.shape)}: {len(hits)} saved tensors match it ({hits[:4]})")
        names[n] = parts
    return names


def split_experts(n, v, match):
    """The per-expert saved names of stacked parameter v, with a function from the stacked
    tensor to each saved tensor, or None when the checkpoint does not hold v that way."""
    if v.dim() != 3:
        return None
    views = [
        lambda t, e: [t[e]],
        lambda t, e: [t[e].transpose(0, 1)],
        lambda t, e: [t[e, : t.shape[1] // 2], t[e, t.shape[1] // 2 :]],
        lambda t, e: [t[e].transpose(0, 1)[: t.shape[2] // 2], t[e].transpose(0, 1)[t.shape[2] // 2 :]],
    ]
    for view in views:
        out = []
        for e in range(v.shape[0]):
            pieces = view(v, e)
            for j, piece in enumerate(pieces):
                hits = match(piece.contiguous())
                if len(hits) != 1:
                    break
                out.append((hits[0], lambda t, e=e, j=j, view=view: view(t, e)[j]))
            else:
                continue
            break
        else:
            return out
    return None


def by_saved(saved_as, named):
    """{saved name: tensor} of (parameter name, in-memory tensor) pairs, each split as the
    checkpoint stores it."""
    out = {}
    for n, t in named:
        for k, f in saved_as[n]:
            out[k] = f(t).float().contiguous()
    return out


def make(outdir, name, model_type, cfg_kw, seed):
    torch.manual_seed(seed)
    config = transformers.AutoConfig.for_model(model_type, **cfg_kw)
    config._attn_implementation = "eager"
    model = AutoModelForCausalLM.from_config(config, attn_implementation="eager").float()
    if model_type in LINEAR_ATTENTION:
        torch_linear_attention(model)
    perturb(model, seed)
    model.eval()
    is_moe = model_type in MOE_FAMILIES
    d = os.path.join(outdir, name)
    os.makedirs(d, exist_ok=True)
    model.save_pretrained(d, safe_serialization=True)
    saved_as = checkpoint_names(model, d)
    for extra in ("generation_config.json",):
        p = os.path.join(d, extra)
        if os.path.exists(p):
            os.remove(p)

    g = torch.Generator().manual_seed(seed + 1)
    ids = torch.randint(3, cfg_kw["vocab_size"], (B, T), generator=g)
    ref = {
        "family": model_type,
        "case": name,
        "transformers_version": transformers.__version__,
        "torch_version": torch.__version__,
        "input_ids": ids.tolist(),
    }

    # Float32 forward: per-token logprobs and the loss.
    model.zero_grad(set_to_none=True)
    ce, total, aux = objective(model, ids, is_moe)
    # The aux-loss objective only where transformers computes one, not for every MoE family.
    has_aux = aux is not None
    with torch.no_grad():
        logits = model(input_ids=ids).logits
    ref["logprobs"] = token_logprobs(logits, ids).tolist()
    ref["loss"] = ce.item()
    if has_aux:
        ref["aux_loss"] = aux.item()
        ref["router_aux_loss_coef"] = aux_coef(model.config)
        ref["loss_total"] = total.item()

    # Gradients of the cross-entropy (and of the total objective where there is an aux loss).
    ce.backward(retain_graph=has_aux)
    grads = by_saved(saved_as, [(n, p.grad.detach()) for n, p in model.named_parameters() if p.grad is not None])
    save_file(grads, os.path.join(d, "grads.safetensors"), metadata={"format": "pt"})
    if has_aux:
        model.zero_grad(set_to_none=True)
        _, total, _ = objective(model, ids, is_moe)
        total.backward()
        gt = by_saved(saved_as, [(n, p.grad.detach()) for n, p in model.named_parameters() if p.grad is not None])
        save_file(gt, os.path.join(d, "grads_total.safetensors"), metadata={"format": "pt"})
    ref["param_names"] = [k for n, _ in model.named_parameters() for k, _ in saved_as[n]]
    ref["param_shapes"] = {k: list(t.shape) for k, t in by_saved(saved_as, [(n, p.detach()) for n, p in model.named_parameters()]).items()}

    # Float64 logprobs of the same weights, for diagnosing precision questions.
    # (MoE experts need the eager experts implementation: grouped_mm has no float64 kernel.)
    eager = model_type in EAGER_EXPERTS or cfg_kw.get("enable_moe_block")
    extra64 = {"experts_implementation": "eager"} if eager else {}

    def logprobs64(**kw):
        m64 = AutoModelForCausalLM.from_pretrained(d, attn_implementation="eager", dtype=torch.float64, **kw)
        if model_type in LINEAR_ATTENTION:
            torch_linear_attention(m64)
        m64.eval()
        with torch.no_grad():
            return token_logprobs(m64(input_ids=ids).logits, ids).tolist()

    try:
        ref["logprobs_f64"] = logprobs64(**extra64)
    except Exception as e:
        # Experts without transformers' experts-implementation switch (granitemoe's input_linear)
        # may refuse it: load them as they are. The float64 logprobs are a diagnostic, so a
        # second failure is recorded rather than losing the case.
        if not extra64:
            raise
        print(f"{name}: float64 with {extra64} failed: {e!r}; again without it", file=sys.stderr)
        try:
            ref["logprobs_f64"] = logprobs64()
        except Exception as e2:
            ref["logprobs_f64_error"] = repr(e2)

    # Packed documents: the reference is each document run on its own.
    gp = torch.Generator().manual_seed(seed + 2)
    docs = [torch.randint(3, cfg_kw["vocab_size"], (1, n), generator=gp) for n in PACKED_DOCS]
    with torch.no_grad():
        ref["packed"] = {
            "doc_lengths": PACKED_DOCS,
            "input_ids": torch.cat(docs, dim=1)[0].tolist(),
            "logprobs": [token_logprobs(model(input_ids=x).logits, x)[0].tolist() for x in docs],
        }

    # Three AdamW steps on the same batch.
    if model_type in EVAL_TRAINING:
        model.eval()
    else:
        model.train()
    if hasattr(model.config, "router_jitter_noise"):
        model.config.router_jitter_noise = 0.0
    decay = [p for p in model.parameters() if p.ndim >= 2]
    no_decay = [p for p in model.parameters() if p.ndim < 2]
    opt = torch.optim.AdamW(
        [{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}],
        lr=1e-3, betas=(0.9, 0.999), eps=1e-8, foreach=False,
    )
    losses = []
    for step in range(4):
        opt.zero_grad(set_to_none=True)
        _, obj, _ = objective(model, ids, is_moe)
        losses.append(obj.item())
        if step < 3:
            obj.backward()
            opt.step()
    ref["adamw"] = {
        "lr": 1e-3, "betas": [0.9, 0.999], "eps": 1e-8, "weight_decay": 0.1,
        "decay": "ndim>=2", "objective": "ce+aux" if has_aux else "ce", "losses": losses,
    }
    with open(os.path.join(d, "reference.json"), "w") as f:
        json.dump(ref, f)
    with open(os.path.join(d, "model.safetensors"), "rb") as f:
        n = int.from_bytes(f.read(8), "little")
        keys = sorted(k for k in json.loads(f.read(n)) if k != "__metadata__")
    return {"case": name, "loss": ref["loss"], "checkpoint_keys": keys[:6] + (["..."] if len(keys) > 6 else []),
            "n_checkpoint_tensors": len(keys), "n_params": len(ref["param_names"])}


def main():
    outdir = sys.argv[1]
    summary = []
    only = set(sys.argv[2:])
    for i, (name, mt, kw) in enumerate(CASES):
        if only and name not in only:
            continue
        try:
            summary.append(make(outdir, name, mt, kw, seed=1000 + i))
        except Exception as e:  # report and go on with the other cases
            import traceback
            traceback.print_exc()
            summary.append({"case": name, "error": repr(e)})
    print(json.dumps(summary, indent=1))
    with open(os.path.join(outdir, "summary.json"), "w") as f:
        json.dump(summary, f, indent=1)
    return 1 if any("error" in s for s in summary) else 0


if __name__ == "__main__":
    sys.exit(main())
