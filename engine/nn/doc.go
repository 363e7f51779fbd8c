// Package nn holds the layers of a decoder-only transformer with explicit Forward and Backward
// methods over packed token rows: linear, embedding, RMSNorm (or LayerNorm with a bias,
// composed of the backend's ops: layernorm.go), rotary attention with grouped
// query heads, multi-head latent attention (MLA: DeepSeek-V3's low-rank query and key/value
// projections with a shared rotary key, run through the same attention op), gated delta-net
// linear attention (Qwen3-Next's causal conv and gated norm on the host, its gated delta rule in
// the backend's GatedDelta op where it has one) and a sigmoid output gate on attention, the
// SwiGLU MLP,
// the sparse mixture-of-experts block (softmax top-k router, or DeepSeek's sigmoid router with
// a correction bias, expert groups and shared experts, or Phi-3.5-MoE's sparsemixer on the
// host; SwiGLU experts, transformers' load-balancing loss; on the device with grouped GEMMs
// where the backend has the MoE ops, else composed with per-expert GEMMs and host routing) and
// the LM head with a fused cross-entropy loss (and an optional bias). A decoder layer (Block) is pre-norm, or has norms on
// its branch outputs with or without the pre-norms (OLMo 2, GLM-4) and a residual scale
// (Granite) and an output scale (Gemma 4's layer_scalar); attention may skip RoPE (NoPE layers),
// rotate interleaved pairs (GLM), take its own score scale, normalise its values and take them
// from the key projection (Gemma 4), or give way to LFM2's gated short convolution (ShortConv,
// whose gating and causal depthwise convolution run in the backend's ShortConv op where it has
// one, on the host otherwise and when decoding),
// or attend over an earlier layer's keys and values (SharedKV: Gemma 4's shared KV layers), or
// give way to JetMoE's mixture of attention heads (MoA: top-k routed query and output experts
// over shared keys and values, routed on the host). A
// Block may end with Gemma 4's per-layer input stage (PerLayerInput) and take, in place of its
// MLP, Gemma 4's mixture of GeGLU experts beside the MLP (MoEBesideMLP, on the MoE device path
// where the backend has it, routed on the host otherwise).
// A Linear may carry a LoRA adapter (two small GEMMs,
// a scale and an add on top of a frozen base weight read through Linear.Weight), and that base
// may be stored in 4-bit NF4 (QuantWeight, QLoRA), dequantised into a WeightScratch shared by
// the layers right before each product.
//
// HostTape is a small reverse-mode differentiator over float64 matrices on the host, for
// layers built of many small reductions the backends have no fused ops for; DSV4 runs
// DeepSeek-V4's decoder on it (hyper-connection residual streams with Sinkhorn-projected
// mixing, shared-key-value attention with sinks over a sliding window plus compressed entries
// chosen by a lightning indexer, a grouped output projection, hash- or score-routed clamped
// SwiGLU experts), its gradients coming from the tape. DSV4Device runs the same decoder
// through the backend's ops (backend.Optional.DSV4 for the pieces only DeepSeek-V4 has), on a
// DevTape that records each op's backward over device tensors; only the discrete choices (the
// routers' and the indexer's top-k, the hash tables) and the routing weights are made on the
// host.
//
// Every activation is a row-major [N, ...] tensor where N is the total number of tokens of a
// packed micro-batch; documents are separated by cumulative sequence lengths and positions
// restart at 0 for each document. Letters used in shape comments:
//
//	N   tokens in the micro-batch (all documents packed)
//	C   hidden size
//	I   MLP intermediate size
//	V   vocabulary size
//	NH  attention heads, NKV key/value heads, HD head dimension
//
// Gradient contract: Backward overwrites (=) the gradient it returns for the layer input and
// accumulates (+=) into parameter gradients, so micro-batches accumulate without extra copies.
// A layer caches what its backward needs during Forward and releases it in Backward (or in
// Release when a forward is abandoned).
//
// The package is not a model (engine/models assembles layers into HF families), holds no
// parameters of its own (they are views into the model's arena), and calls only the backend
// interface.
package nn
