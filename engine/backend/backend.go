// Package backend defines the contract between model code and the devices that run it: the
// Backend interface (memory, synchronisation and the fused ops with explicit forward and
// backward), the optional fast paths every backend reports through Backend.Optional (fused.go),
// registration by device name, and the few pieces of math that every backend must compute
// identically (RoPE inverse frequencies and scaling, the stochastic-rounding random stream).
//
// It is not an implementation: engine/backend/cpu is the pure-Go reference (the oracle every
// other backend is tested against) and engine/backend/cuda the NVIDIA one. Model code (engine/nn,
// engine/models) talks only to this interface and never to a concrete backend.
//
// # Dimension letters
//
// Shapes in the doc comments use these letters, defined once here:
//
//	N    tokens in a packed micro-batch (all documents of all rows, concatenated); activations are [N, C]
//	B, T batch rows and sequence length when a micro-batch is unpacked (N = B*T then)
//	D    documents in a packed micro-batch; CuSeqlens is [D+1] with CuSeqlens[0]=0, CuSeqlens[D]=N
//	C    model (hidden) width
//	F    MLP intermediate width
//	V    vocabulary size
//	L    number of layers
//	NH   query heads; NKV key/value heads (NH % NKV == 0: grouped-query attention, GQA)
//	HD   head dimension; R rotary dimension (R <= HD, R even; R < HD is partial rotary)
//	M, K, Nc  the generic GEMM sizes: C[M,Nc] = A[M,K] @ B[K,Nc]
//
// # Gradient contract
//
// Every op comment marks each output "=" (overwritten) or "+=" (accumulated). Parameter
// gradients (weights, biases, norm gains, embedding tables) always accumulate (+=), so gradient
// accumulation over micro-batches and weight tying need no extra buffers; the caller zeroes them
// (Fill 0) at the start of an optimizer step. Activation gradients are "=" unless an
// Accumulate flag says otherwise (used where one activation feeds several ops, e.g. the residual
// stream or the input of the q, k and v projections).
//
// # Dtypes
//
// Float tensors may be stored as F32 or BF16 (F16 where stated); all arithmetic accumulates in
// at least fp32 and results are rounded to the output's dtype once (round-to-nearest-even).
// One exception: an accumulating ("+=") matrix product into a BF16 output may round the product
// to BF16 before adding it, as autograd does when it sums the separately rounded gradients of a
// tensor used by several ops (the CUDA backend does, unless HALO_CUDA_GEMM_BETA=fold).
// Per-row statistics that backward re-reads (RMSNorm rstd, attention log-sum-exp, CE loss and
// logprob) are always F32. Index tensors (ids, positions, targets, cu_seqlens) are I32. The CPU
// backend supports F32 everywhere and BF16 for every float input and output; other backends state
// what they support and fail with an error naming the op and dtype otherwise.
//
// # Goroutines
//
// A Backend value drives one device. All its methods are called from one goroutine at a time:
// the goroutine that owns the device (for CUDA, a goroutine that has called
// runtime.LockOSThread so that the device context stays current). Ops are enqueued in call order
// and may run asynchronously; Download and Sync wait for all preceding work. The CPU backend
// parallelises each op internally over a pool of GOMAXPROCS workers and returns when it is done.
// Tensor values are plain data and may be passed between goroutines, but their contents may only
// be touched through the owning backend.
//
// # Errors
//
// Ops check shapes, dtypes and devices before doing any work and return an error naming the
// op, the argument and what was expected; they never panic on bad arguments. A tensor argument
// marked optional may be the zero tensor.Tensor.
package backend

import "github.com/halo-shell/halo-shell/engine/tensor"

// T is shorthand used throughout this package's signatures.
type T = tensor.Tensor

// IgnoreIndex is the target id that cross-entropy skips (as in PyTorch).
const IgnoreIndex = -100

// MemStats reports device memory, in bytes.
type MemStats struct {
	Allocated int64 // bytes in live tensors handed out by Alloc
	Reserved  int64 // bytes held from the device by the allocator (>= Allocated)
	Peak      int64 // high-water mark of Allocated since creation or ResetPeak
	Total     int64 // device capacity if known, else 0
}

// Backend is the required interface every device implements.
type Backend interface {
	Memory
	Ops
	// Name is the device name, e.g. "cpu" or "cuda:0".
	Name() string
	// Sync waits until all work enqueued so far has finished and reports any deferred error.
	Sync() error
	// Close releases every resource of the backend; tensors it allocated become invalid.
	Close() error
	// Optional returns the backend's optional capabilities, nil where absent (fused.go). The
	// result is the same for the backend's whole life, and cheap: callers may ask before each
	// op. A wrapper forwards, wraps or drops each member; embedding forwards them all.
	Optional() Optional
}

// Memory is the allocation and copy part of Backend.
type Memory interface {
	// Alloc returns a new zero-filled tensor. It fails (without panicking) when the size is
	// invalid or the device is out of memory, saying how much was asked and how much is in use.
	Alloc(dt tensor.DType, shape ...int) (T, error)
	// Empty is Alloc without the zero fill: the contents are undefined until written (a backend
	// may still clear them). It is for outputs an op writes in full (contracts marked "="), so
	// that they do not cost a pass over memory first.
	Empty(dt tensor.DType, shape ...int) (T, error)
	// Free releases a tensor returned by Alloc (not a view of one). Freeing the zero tensor is a
	// no-op; freeing twice is an error.
	Free(t T) error
	// Upload copies raw host bytes into dst (host -> device). src is little-endian elements of
	// dst's dtype and len(src) must equal dst.Bytes().
	Upload(dst T, src []byte) error
	// Download copies src into raw host bytes (device -> host), after all preceding work.
	// len(dst) must equal src.Bytes().
	Download(dst []byte, src T) error
	// Copy copies src into dst on the device: dst = src. Shapes may differ but element counts
	// must match; when dtypes differ the float values are converted (F32, BF16, F16, rounding to
	// nearest even) or the integers widened/narrowed (I32, I64). The two may not overlap unless
	// they are identical.
	Copy(dst, src T) error
	// MemStats reports current memory use.
	MemStats() MemStats
	// ResetPeak sets Peak to the current Allocated.
	ResetPeak()
}

// Ops are the fused operations models are built from. Each has its forward and backward side by
// side; the comments give shapes, dtypes, which outputs are "=" or "+=", and what is cached.
type Ops interface {
	// ---- elementwise and reductions ----

	// Fill sets every element of t to v (t float or integer; v is converted). t =.
	Fill(t T, v float32) error
	// Add computes out = a + b elementwise; all three have the same element count. out may alias
	// a or b (in-place residual add).
	Add(out, a, b T) error
	// Axpy computes y += alpha * x elementwise (same element count). Used for gradient
	// accumulation and LoRA-style merges.
	Axpy(y T, alpha float32, x T) error
	// Scale computes t *= alpha elementwise in place.
	Scale(t T, alpha float32) error
	// ScaleRows computes t[r,:] *= w[r] in place: t float [R,C] (rows of its last dimension),
	// w [R] F32. It weights the rows of a mixture-of-experts expert's output by their routing
	// weights on the device.
	ScaleRows(t, w T) error
	// RowDot computes out[r] = sum_c a[r,c]*b[r,c] with fp32 accumulation: a and b float of the
	// same shape [R,C] (rows of the last dimension), out [R] F32 =. The backward of ScaleRows
	// with respect to the weights.
	RowDot(out, a, b T) error
	// SumSquares returns, for each tensor, the sum of the squares of its elements: partial sums
	// in at least fp32 over blocks, combined in fp64 (the CPU backend accumulates in fp64
	// throughout). The global gradient norm is the sqrt of the total. It synchronises.
	SumSquares(ts []T) ([]float64, error)

	// ---- embedding ----

	// Embedding gathers rows: out[n, :] = weight[ids[n], :].
	// out [N,C] =; weight [V,C]; ids [N] I32 with 0 <= id < V (checked; an error names the first
	// bad position). Nothing is cached.
	Embedding(out, weight, ids T) error
	// EmbeddingBackward scatter-adds: dWeight[ids[n], :] += dOut[n, :].
	// dWeight [V,C] +=; dOut [N,C]; ids [N] I32. Repeated ids accumulate deterministically
	// (in increasing n order per row of dWeight).
	EmbeddingBackward(dWeight, dOut, ids T) error

	// ---- matrix products ----

	// GEMM computes C = Alpha * op(A) @ op(B) + Beta * C for 2-D tensors, op(X) = X or X^T. With
	// Beta == 0, C is overwritten (its old contents, even NaN, are ignored).
	GEMM(a GEMMArgs) error
	// Linear is the HF nn.Linear forward: out = x @ w^T + bias.
	// out [M,O] =; x [M,I]; w [O,I] (HF weight layout [out_features, in_features]);
	// bias [O] optional. Nothing is cached: backward re-reads x and w.
	// For generation logits pass the last rows of the hidden states as x and the LM head as w.
	Linear(out, x, w, bias T) error
	// LinearBackward: dX (=, or += if AccumulateDX) = dY @ w; dW += dY^T @ x; dB += sum over
	// rows of dY. Any of DX, DW, DB may be the zero tensor to skip it (frozen weights, first
	// layer).
	LinearBackward(a LinearBackwardArgs) error

	// ---- normalisation ----

	// RMSNorm: rstd[n] = 1/sqrt(mean_c(x[n,c]^2) + eps); out[n,c] = x[n,c] * rstd[n] * w[c]
	// (HF Llama/Qwen convention: normalise in fp32, then scale by the weight).
	// out [N,C] =; rstd [N] F32 = (cached for backward); x [N,C]; w [C].
	// Per-head q/k norm (Qwen3) is this op on x viewed as [N*NH, HD] with w [HD].
	RMSNorm(out, rstd, x, w T, eps float32) error
	// RMSNormBackward: dX (=, or += if AccumulateDX); dW +=. Uses x, w and the cached rstd.
	RMSNormBackward(a RMSNormBackwardArgs) error

	// ---- rotary position embedding ----

	// RoPE rotates the first R dims of each head by the angle pos*inv_freq using the HF
	// rotate-half convention: for i < R/2, with c = cos(p*f_i)*s, sn = sin(p*f_i)*s
	// (s = AttentionScaling), out[i] = x[i]*c - x[i+R/2]*sn and out[i+R/2] = x[i+R/2]*c + x[i]*sn;
	// dims R..HD-1 pass through. With Interleaved the pair is (2i, 2i+1) instead of (i, i+R/2).
	// The angle is computed in fp32 as float32(pos)*inv_freq[i], exactly as HF does.
	// out [N, H*HD] =; x [N, H*HD] (out may alias x: in place). Nothing is cached.
	RoPE(out, x T, a RoPEArgs) error
	// RoPEBackward: dX = R(-angle) dY (the transpose rotation, same scaling). dX may alias dY.
	RoPEBackward(dX, dY T, a RoPEArgs) error

	// ---- attention ----

	// Attention is causal scaled-dot-product attention with GQA over packed variable-length
	// documents: query token i of document d attends to key tokens j of the same document with
	// j <= i (and i - j < Window when Window > 0); never across documents.
	// Query head h uses key/value head h / (NH/NKV).
	// Out [N, NH*HD] =; LSE [N, NH] F32 = (log-sum-exp of the scaled scores per token and head,
	// cached for backward; optional when no backward follows); Q [N, NH*HD]; K, V [Nk, NKV*HD].
	// No [N, N] score matrix is stored: backward recomputes scores from Q, K and LSE.
	Attention(a AttentionArgs) error
	// AttentionBackward: dQ =, dK =, dV = (all three overwritten). Needs Q, K, V, Out, LSE of the
	// forward and dOut. Backends need only support CuSeqlensK unset (training); the CPU backend
	// also accepts a separate CuSeqlensK. None of dQ, dK, dV may overlap an input.
	AttentionBackward(a AttentionBackwardArgs) error
	// AttentionSinks folds learned per-head sink logits (gpt-oss) into a finished attention:
	// each head's softmax also runs over one extra logit sinks[h] whose value is zero, so for
	// every token n and head h lse' = log(exp(LSE[n,h]) + exp(sinks[h])), Out[n,h,:] *=
	// exp(LSE[n,h] - lse') and LSE[n,h] = lse'. Out [N, NH*HD] (in place); LSE [N, NH] F32 (in
	// place); sinks [NH]. AttentionBackward then takes the updated Out and LSE unchanged: the
	// sink holds no value, so the query, key and value gradients need nothing more.
	AttentionSinks(out, lse, sinks T) error
	// AttentionSinksBackward accumulates the sinks' gradient: dSinks[h] += -sum_n
	// exp(sinks[h] - LSE[n,h]) * sum_d dOut[n,h,d] * Out[n,h,d], with Out and LSE as
	// AttentionSinks left them. dSinks [NH] +=; dOut, Out [N, NH*HD]; LSE [N, NH] F32.
	AttentionSinksBackward(dSinks, dOut, out, lse, sinks T) error

	// ---- column blocks ----

	// CopyColumns copies blocks of columns between two matrices with the same rows, with
	// per-group strides, broadcasting or summing groups (ColumnCopyArgs in columns.go).
	// Dst = or += as Accumulate says; only the blocks are written. Nothing is cached.
	CopyColumns(a ColumnCopyArgs) error

	// ---- MLP ----

	// SwiGLU: out = silu(gate) * up, silu(g) = g * sigmoid(g).
	// out [N,F] =; gate [N,F]; up [N,F]. Nothing is cached.
	SwiGLU(out, gate, up T) error
	// SwiGLUBackward: dGate =, dUp = from dOut, gate and up (dGate may alias gate, dUp may alias up).
	SwiGLUBackward(dGate, dUp, dOut, gate, up T) error
	// SwiGLUClamped is gpt-oss's expert activation over interleaved gate|up columns: gateUp
	// [R, 2I] holds gate_i at column 2i and up_i at 2i+1; with g = min(gate, limit), u =
	// clamp(up, -limit, limit), out[r,i] = (u + 1) * g * sigmoid(alpha * g). out [R, I] =.
	// Nothing is cached.
	SwiGLUClamped(out, gateUp T, alpha, limit float32) error
	// SwiGLUClampedBackward writes dGateUp [R, 2I] (=) from dOut [R, I] and the forward's
	// gateUp; a clamped input gets no gradient (the clamps pass it where gate <= limit and
	// -limit <= up <= limit, as torch.clamp does). dGateUp may be gateUp itself.
	SwiGLUClampedBackward(dGateUp, dOut, gateUp T, alpha, limit float32) error
	// GeGLU: out = gelu_tanh(gate) * up, the tanh approximation of GELU (transformers'
	// gelu_pytorch_tanh): gelu_tanh(g) = g/2 * (1 + tanh(sqrt(2/pi) * (g + 0.044715 g^3))).
	// out [N,F] =; gate [N,F]; up [N,F]. Nothing is cached.
	GeGLU(out, gate, up T) error
	// GeGLUBackward: dGate =, dUp = from dOut, gate and up (dGate may alias gate, dUp may alias up).
	GeGLUBackward(dGate, dUp, dOut, gate, up T) error

	// ---- LM head + loss ----

	// CrossEntropy is the fused LM head and causal-LM cross-entropy. For each token n with
	// target t = Targets[n] != IgnoreIndex: logits = Hidden[n] @ Weight^T (fp32), logprob[n] =
	// logits[t] - logsumexp(logits), loss[n] = -logprob[n]; ignored tokens get loss = logprob = 0
	// and no gradient. With DHidden and/or DWeight set it also runs backward for
	// dL/dloss[n] = s[n] = GradScale (times TokenScale[n] when TokenScale is set):
	// dHidden[n] = s[n] * (softmax - onehot(t)) @ Weight (=), and
	// dWeight += sum_n s[n] * (softmax - onehot)^T Hidden[n] (+=). A per-token scale is how
	// sequence-level losses (DPO, KTO, ...) reach the tokens: s[n] = -dL/dlogprob[n].
	// With Softcap > 0 the logits are capped first, logits = Softcap * tanh(logits / Softcap)
	// (final_logit_softcapping), and the gradient passes through the cap's derivative.
	// Tokens are processed ChunkRows at a time so full [N, V] fp32 logits never exist at once.
	// DHidden may not overlap Hidden.
	CrossEntropy(a CrossEntropyArgs) error
}

// GEMMArgs are the operands of Ops.GEMM. op(A) is [M,K], op(B) is [K,Nc], C is [M,Nc].
type GEMMArgs struct {
	A, B, C        T // 2-D; A and B F32 or BF16; C F32 or BF16 (read when Beta != 0, then =)
	TransA, TransB bool
	Alpha, Beta    float32
}

// LinearBackwardArgs are the operands of Ops.LinearBackward (shapes as in Ops.Linear).
type LinearBackwardArgs struct {
	DX           T    // [M,I] = (or += with AccumulateDX); optional
	DW           T    // [O,I] +=; optional
	DB           T    // [O] +=; optional
	DY           T    // [M,O]
	X            T    // [M,I] (needed for DW)
	W            T    // [O,I] (needed for DX)
	AccumulateDX bool // DX += dY @ w instead of =
}

// RMSNormBackwardArgs are the operands of Ops.RMSNormBackward (shapes as in Ops.RMSNorm).
type RMSNormBackwardArgs struct {
	DX           T // [N,C] = (or += with AccumulateDX); DX may not alias DY
	DW           T // [C] +=; optional
	DY           T // [N,C]
	X            T // [N,C] the forward input
	W            T // [C]
	RStd         T // [N] F32 from the forward
	AccumulateDX bool
}

// RoPEArgs describe the rotation shared by RoPE and RoPEBackward.
type RoPEArgs struct {
	Positions        T       // [N] I32: each token's position in its document (restarts at 0 per packed document)
	InvFreq          T       // [R/2] F32 from RoPEConfig.Compute (uploaded once per sequence length regime)
	Heads            int     // H: heads in x (NH for queries, NKV for keys)
	HeadDim          int     // HD
	RotaryDim        int     // R: rotated dims per head; 0 means HD
	AttentionScaling float32 // multiplies cos and sin (yarn/longrope); 0 means 1
	// Interleaved rotates the pairs (2i, 2i+1) of the first R dims by the angle of frequency i
	// instead of the pairs (i, i+R/2) (GLM's convention); the arithmetic is the same.
	Interleaved bool
}

// AttentionShape is the geometry shared by Attention and AttentionBackward.
type AttentionShape struct {
	CuSeqlens  T       // [D+1] I32 document boundaries of the queries (and keys, unless CuSeqlensK is set)
	CuSeqlensK T       // [D+1] I32 key boundaries, optional: for decoding with a KV cache, the queries of document d are the last (lenQ_d) positions of its lenK_d keys (bottom-right aligned causal mask)
	MaxSeqLen  int     // longest document (hint; 0 = backend computes it)
	NH, NKV    int     // query and key/value heads
	HD         int     // head dimension
	Scale      float32 // score scale; 0 means 1/sqrt(HD)
	Window     int     // sliding window: key j is visible to query i only if i - j < Window; 0 = unlimited
}

// AttentionArgs are the operands of Ops.Attention.
type AttentionArgs struct {
	AttentionShape
	Out T // [N, NH*HD] =
	LSE T // [N, NH] F32 =; optional
	Q   T // [N, NH*HD]
	K   T // [Nk, NKV*HD]
	V   T // [Nk, NKV*HD]
}

// AttentionBackwardArgs are the operands of Ops.AttentionBackward.
type AttentionBackwardArgs struct {
	AttentionShape
	DQ, DK, DV T // =; shapes of Q, K, V
	DOut       T // [N, NH*HD]
	Q, K, V    T // forward inputs
	Out        T // forward output
	LSE        T // [N, NH] F32 from the forward
}

// CrossEntropyArgs are the operands of Ops.CrossEntropy.
type CrossEntropyArgs struct {
	Hidden     T       // [N,C] final hidden states (after the final norm)
	Weight     T       // [V,C] LM head (the embedding table when tied)
	Targets    T       // [N] I32 target ids; IgnoreIndex skips; any other value outside [0,V) is an error
	Loss       T       // [N] F32 =; optional
	LogProb    T       // [N] F32 =; optional
	DHidden    T       // [N,C] =; optional (backward when set)
	DWeight    T       // [V,C] +=; optional (backward when set)
	GradScale  float32 // dL/dloss per non-ignored token (e.g. 1 / non-ignored tokens of the whole optimizer step)
	TokenScale T       // [N] F32; optional: multiplies GradScale token by token (backward only)
	ChunkRows  int     // tokens per chunk; 0 = backend default
	Softcap    float32 // tanh cap of the logits (Softcap * tanh(logit / Softcap)); 0 = none
}
