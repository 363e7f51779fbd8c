package backend

// Optional holds a backend's optional capabilities: fused fast paths and device services that not
// every backend has. A nil member is absent and the caller takes the fallback its comment gives;
// with a member present, results must match that fallback within the dtype's tolerance.
//
// Every backend hands them out through the required method Backend.Optional, never through type
// assertions on the backend value, so that wrappers cannot lose them: a wrapper that embeds the
// backend it wraps forwards every member by construction, and one that defines Optional itself
// decides per member whether to forward it, wrap it with its own instrumentation (engine/profile
// records a span around each fused op), or drop it, saying why. A member is called like the
// backend's methods, from the goroutine that owns the device.
type Optional struct {
	// AddRMSNorm fuses the residual add with the following RMSNorm:
	// residualOut = x + residual (=, may alias residual); out = RMSNorm(residualOut) (=);
	// rstd [N] F32 =. Shapes as in Ops.RMSNorm.
	//
	// Fallback: Add(residualOut, x, residual); RMSNorm(out, rstd, residualOut, w, eps).
	AddRMSNorm func(residualOut, out, rstd, x, residual, w T, eps float32) error

	// AdamW runs one AdamW update of one parameter tensor on the device (AdamWArgs). The CPU
	// and CUDA backends have it.
	//
	// Fallback: none at the Ops level; engine/optim performs the same update on host copies
	// (Download, update, Upload).
	AdamW func(a AdamWArgs) error

	// GroupedGEMM runs the matrix products of all experts of a layer in one call
	// (GroupedGEMMArgs in moe.go): the forward of an expert projection, its input gradient or
	// its weight gradient, with each group's rows found from offsets on the device. The CPU and
	// CUDA backends have it.
	//
	// Fallback: one GEMM per group on Rows views of the operands, which needs the offsets on
	// the host (a Download, so a synchronisation, per call).
	GroupedGEMM func(a GroupedGEMMArgs) error

	// Timer times ops on a device queue without waiting for them (DeviceTimer): backends whose
	// ops run asynchronously (the CUDA backend) have it.
	//
	// Fallback: the host clock after a Sync of each op (engine/profile).
	Timer DeviceTimer

	// Syncs counts the host's waits for the device (SyncCounter): the CUDA backend has it.
	//
	// Fallback: engine/profile counts the downloads and Syncs that pass through its wrapper,
	// which misses the waits inside ops.
	Syncs SyncCounter

	// MoERoute, MoERouteBackward, MoEPermute, MoEPermuteBackward, MoECombine and
	// MoECombineBackward route the tokens of a mixture-of-experts layer, sort them by expert and
	// combine the experts' outputs on the device (moe_route.go), so that a layer reads nothing
	// on the host. The CPU and CUDA backends have them.
	//
	// Fallback: the host routing of engine/nn's MoE (logits downloaded, per-expert gathers
	// with Embedding, ScaleRows and scatter-adds with EmbeddingBackward).
	MoERoute           func(a MoERouteArgs) error
	MoERouteBackward   func(a MoERouteBackwardArgs) error
	MoEPermute         func(a MoEPermuteArgs) error
	MoEPermuteBackward func(a MoEPermuteBackwardArgs) error
	MoECombine         func(a MoECombineArgs) error
	MoECombineBackward func(a MoECombineBackwardArgs) error

	// SwiGLUPacked is SwiGLU over packed gate|up rows: gateUp [R,2I] holds per row the gate
	// (columns 0..I-1) and the up projection (I..2I-1), as a grouped GEMM with the [E,2I,C]
	// gate_up weight writes them; out [R,I] = silu(gate) * up (=).
	//
	// Fallback: SwiGLU on copies of the two halves (Rows views cannot split columns).
	SwiGLUPacked func(out, gateUp T) error
	// SwiGLUPackedBackward writes dGateUp [R,2I] (=) from dOut [R,I] and the forward's gateUp;
	// dGateUp may be gateUp itself (each element is read before it is written).
	//
	// Fallback: SwiGLUBackward on copies of the halves.
	SwiGLUPackedBackward func(dGateUp, dOut, gateUp T) error
	// GeGLUPacked is GeGLU over packed gate|up rows, laid out as for SwiGLUPacked:
	// out [R,I] = gelu_tanh(gate) * up (=), the experts of Gemma 4's MoE block. The CPU and
	// CUDA backends have it.
	//
	// Fallback: GeGLU on copies of the two halves.
	GeGLUPacked func(out, gateUp T) error
	// GeGLUPackedBackward writes dGateUp [R,2I] (=) from dOut [R,I] and the forward's gateUp;
	// dGateUp may be gateUp itself (each element is read before it is written).
	//
	// Fallback: GeGLUBackward on copies of the halves.
	GeGLUPackedBackward func(dGateUp, dOut, gateUp T) error

	// DequantNF4 writes a 4-bit NormalFloat weight (QLoRA's frozen base) into a bf16 tensor
	// (DequantNF4Args in nf4.go): Out = NF4Code[code] * scale (=). The CPU and CUDA backends
	// have it.
	//
	// Fallback: quant.Weight.DequantizeBF16 on the host and an Upload of the result, one
	// transfer of the bf16 weight per use.
	DequantNF4 func(a DequantNF4Args) error

	// Dropout is inverted dropout with a keep mask drawn on the device from (Seed, Key,
	// element) (DropoutArgs in dropout.go): Out = X * (keep ? 1/(1-P) : 0) (=). The CPU and
	// CUDA backends have it.
	//
	// Fallback: backend.DropoutMask on the host, uploaded, and ScaleRows (the same bits).
	Dropout func(a DropoutArgs) error

	// DecodeAttention is one decoding step of B rows over a slotted KV cache: it appends each
	// row's new key and value at its position and attends its query over the row's keys
	// (DecodeAttentionArgs in decode.go). The CPU and CUDA backends have it.
	//
	// Fallback: a contiguous cache regathered every step (engine/nn's Pass.CacheGather) and
	// Attention with separate key boundaries.
	DecodeAttention func(a DecodeAttentionArgs) error

	// ShortConv and ShortConvBackward run the gated causal depthwise convolution of a
	// short-convolution layer on the device, forward and backward (ShortConvArgs in
	// shortconv.go), documents kept apart by the token positions. The CPU and CUDA backends
	// have them.
	//
	// Fallback: the host computation of engine/nn's ShortConv (the input projection's rows
	// downloaded, convolved and gated on the host, the result uploaded).
	ShortConv         func(a ShortConvArgs) error
	ShortConvBackward func(a ShortConvBackwardArgs) error

	// GatedDelta and GatedDeltaBackward run the gated delta rule, the recurrence of the gated
	// delta-net linear-attention layers, per document and value head on the device
	// (GatedDeltaArgs in gated_delta.go). The CPU and CUDA backends have them.
	//
	// Fallback: the float64 host recurrence of engine/nn's GatedDeltaNet.
	GatedDelta         func(a GatedDeltaArgs) error
	GatedDeltaBackward func(a GatedDeltaBackwardArgs) error

	// GatedDeltaPrep and GatedDeltaPrepBackward run the stages of a gated delta-net layer
	// between its input projections and the recurrence (the causal conv, SiLU, the l2 norms of
	// q and k and the gates β and g), and GatedRMSNorm and GatedRMSNormBackward the gated
	// RMSNorm after it, on the device (GatedDeltaPrepArgs and GatedRMSNormArgs in
	// gated_delta_stages.go). The CPU and CUDA backends have them.
	//
	// Fallback: the float64 host stages of engine/nn's GatedDeltaNet over downloaded rows.
	GatedDeltaPrep         func(a GatedDeltaPrepArgs) error
	GatedDeltaPrepBackward func(a GatedDeltaPrepBackwardArgs) error
	GatedRMSNorm           func(a GatedRMSNormArgs) error
	GatedRMSNormBackward   func(a GatedRMSNormBackwardArgs) error

	// DSV4 holds DeepSeek-V4's ops (hyper-connection weights, stream collapse and expand,
	// sink attention over own and compressed keys, window pooling, index scores, sqrt-softplus
	// and the split clamped SwiGLU; dsv4.go), set only when the backend has every one of them.
	// The CPU and CUDA backends have it.
	//
	// Fallback: deepseek_v4's decoder on the host tape (nn.DSV4), parameters downloaded.
	DSV4 *DSV4Ops

	// SampleTokens draws one token per row of logits on the device: greedy, or with
	// temperature, top-k and top-p from a counter-based stream (SampleArgs in decode.go). The
	// CPU and CUDA backends have it.
	//
	// Fallback: the logits downloaded and sampled on the host (engine/models' sampler, with its
	// own random stream).
	SampleTokens func(a SampleArgs) error
}

// AdamWArgs describe one AdamW step of one parameter (torch.optim.AdamW semantics):
//
//	g  = Grad * GradScale
//	m  = Beta1*m + (1-Beta1)*g
//	v  = Beta2*v + (1-Beta2)*g*g
//	p  = p - LR*WeightDecay*p                       (decoupled decay, applied first)
//	p  = p - LR/(1-Beta1^Step) * m / (sqrt(v)/sqrt(1-Beta2^Step) + Eps)
//
// all in fp32 registers. Param, M and V are read and written (=); Shadow, if set, receives Param
// rounded to its dtype (the bf16 model copy of fp32 master weights). Stores into BF16 tensors
// round to nearest even, or stochastically when Stochastic is set, using
// SRBits(Seed, Step, ParamIndex, role, element) as the random source (role 0 = param, 1 = m,
// 2 = v, 3 = shadow), so the result depends only on (seed, step, parameter, element).
type AdamWArgs struct {
	Param       T // [n] F32 (master or plain fp32 training) or BF16 (AdamW-BF16)
	Grad        T // [n] F32 or BF16
	M, V        T // [n] F32 or BF16 moments
	Shadow      T // [n] optional model copy written from Param
	LR          float32
	Beta1       float32
	Beta2       float32
	Eps         float32
	WeightDecay float32
	GradScale   float32 // multiplies Grad (clipping coefficient, loss-scale undo); 0 means 1
	Step        int     // 1-based step count after this update, for bias correction
	Stochastic  bool
	Seed        uint64
	ParamIndex  uint32

	// Precise scalars, optional: zero means "derive from the fields above". torch computes them
	// in float64 from the Python hyperparameters and rounds once to float32; engine/optim fills
	// them the same way so that every backend can match torch.optim.AdamW bit for bit where fp32
	// allows. With them the update reads: m = m + Weight1*(g-m); v = Beta2*v + Weight2*g*g;
	// p = p*Decay; p = p - StepSize * m / (sqrt(v)/BC2Sqrt + Eps).
	Weight1  float32 // 1 - beta1
	Weight2  float32 // 1 - beta2
	Decay    float32 // 1 - lr*weight_decay
	StepSize float32 // lr / (1 - beta1^step)
	BC2Sqrt  float32 // sqrt(1 - beta2^step)
}
