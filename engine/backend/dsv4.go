package backend

import (
	"fmt"

	"github.com/halo-shell/halo-shell/engine/tensor"
)

// DeepSeek-V4's ops (Optional.DSV4): the pieces of its decoder that no other family has, for
// engine/nn's device decoder of deepseek_v4 (the float64 host tape, nn.HostTape, is their
// reference: each op below is one of its ops, or a fusion of several, with the same
// arithmetic in fp32). Letters: N rows (tokens of one document), n hyper-connection streams,
// C hidden size, H heads, D head dimension, S keys (the N own rows, then the compressed
// entries), M the columns of a mix.
//
// "float" is F32 or BF16, each tensor its own dtype; arithmetic is fp32. Gradients of inputs
// and parameters are accumulated (+=) unless a field says "="; results are written (=).
//
// Hyper-connection weights (HyperWeights, from one RMS-normalised stream row's mix logits Z):
//
//	zz[r,j]  = Z[r,j]·Scale[g(j)] + Base[j]       g(j) = 0 for j < n, 1 for j < 2n, else 2
//	Pre[r,k] = sigmoid(zz[r,k]) + Eps             k < n
//	Post[r,k] = 2·sigmoid(zz[r,n+k])              k < n
//	Comb[r]  = Sinkhorn(softmax_rows(zz[r, 2n:]) + Eps)   an n×n matrix, row j column k at j·n+k
//
// softmax_rows takes the softmax of each row (n consecutive values) of the matrix; Sinkhorn
// divides each column by its sum + Eps, then Iters-1 times each row by its sum + Eps and each
// column by its sum + Eps (nn.HostTape.Normalize). With Head set (the final collapse of the
// streams) M = n and only Pre is computed, with Scale [1].
//
// Stream collapse and expand (the block input from the streams, and the block output written
// back into them):
//
//	StreamCollapse: Out[r,c]     = Σ_j W[r,j]·X[r, j·C+c]
//	StreamExpand:   Out[r, k·C+c] = Post[r,k]·F[r,c] + Σ_j Comb[r, j·n+k]·X[r, j·C+c]
//
// Sink attention (one document; the keys are also the values, one head shared by all H query
// heads): query t sees own key s < N iff s ≤ t and t - s < Window (Window 0: no limit), and
// compressed entry w = s - N iff w < (t+1)/Rate and, with Mask set, Mask[t,w] != 0. Each
// head h's softmax also holds the sink logit Sinks[h], which takes no value:
//
//	p[t,h,s] = exp(Scale·Q[t,h]·KV[s] - LSE[t,h]) over the visible s
//	LSE[t,h] = log(exp(Sinks[h]) + Σ_visible exp(Scale·Q[t,h]·KV[s]))
//	Out[t,h] = Σ_s p[t,h,s]·KV[s]
//
// Sink softmax (SinkSoftmax, SinkSoftmaxBackward): sink attention's softmax alone, for a
// composition of sink attention from matrix products (the scores X = Scale·Q·KVᵀ and the
// output P·KV, with the query heads as rows: row r = t·H + h of Q viewed as [N·H, D]). Over
// the visible s of row r (SinkAttention's rule for query t = r / H):
//
//	LSE[r]  = log(exp(Sinks[h]) + Σ_visible exp(X[r,s]))   (=, or read with UseLSE)
//	P[r,s]  = exp(X[r,s] - LSE[r]) where visible, 0 elsewhere   (=)
//
// and back, with DP the gradient of P:
//
//	Δ[r]      = Σ_s P[r,s]·DP[r,s]
//	DS[r,s]   = P[r,s]·(DP[r,s] - Δ[r])     (=; the gradient of X; DS may be P itself)
//	GSinks[h] += -Σ_t exp(Sinks[h] - LSE[t·H+h])·Δ[t·H+h]
//
// Window pooling (the compressors, nn.HostTape.WindowPool): window w of Rate rows holds, per
// channel d < D, the softmax over its slots of Gate + APE[slot] weighting KV; without Overlap
// (W = D) the slots are the window's own rows (APE row i for row w·Rate+i); with Overlap
// (W = 2D) they are channel d of the previous window's rows (none for window 0) then channel
// D+d of its own rows, APE row i and the slot's column. Out has N/Rate rows (a trailing
// partial window is dropped).
//
// Index scores (the lightning indexer, which only chooses, so it has no backward):
//
//	Out[t,w] = Σ_h relu(Q[t,h]·Keys[w]) / sqrt(Di) · Weights[t,h] / sqrt(Hi)   w < (t+1)/Rate
//	Out[t,w] = -Inf                                                                otherwise
//
// with Hi heads of Di in Q [N, Hi·Di] and Keys [n, Di].
//
// Elementwise: SqrtSoftplus: Out = sqrt(softplus(X)) (softplus(x) = log(1+exp(x)), x for x >
// 20 as torch's threshold), its derivative sigmoid(x) / (2·Out) (0 where Out is 0).
// SwiGLUClampedSplit: Out = silu(min(Gate, Limit)) · clamp(Up, -Limit, Limit), the clamps
// passing no gradient outside their range (torch.clamp's).
//
// Fallback (Optional.DSV4 nil): the host tape over downloaded parameters (nn.DSV4).

// DSV4Ops are the members of Optional.DSV4; a backend that has it has every one.
type DSV4Ops struct {
	HyperWeights           func(a HyperWeightsArgs) error
	HyperWeightsBackward   func(a HyperWeightsBackwardArgs) error
	StreamCollapse         func(out, w, x T) error
	StreamCollapseBackward func(dW, dX, dOut, w, x T) error
	StreamExpand           func(a StreamExpandArgs) error
	StreamExpandBackward   func(a StreamExpandBackwardArgs) error
	SinkAttention          func(a SinkAttentionArgs) error
	SinkAttentionBackward  func(a SinkAttentionBackwardArgs) error
	SinkSoftmax            func(a SinkSoftmaxArgs) error
	SinkSoftmaxBackward    func(a SinkSoftmaxBackwardArgs) error
	WindowPool             func(a WindowPoolArgs) error
	WindowPoolBackward     func(a WindowPoolBackwardArgs) error
	IndexScores            func(a IndexScoresArgs) error
	SqrtSoftplus           func(out, x T) error
	// SqrtSoftplusBackward: dX += dOut · sigmoid(x) / (2·out).
	SqrtSoftplusBackward func(dX, dOut, x, out T) error
	SwiGLUClampedSplit   func(out, gate, up T, limit float32) error
	// SwiGLUClampedSplitBackward: dGate += ..., dUp += ... (either may be nil).
	SwiGLUClampedSplitBackward func(dGate, dUp, dOut, gate, up T, limit float32) error
}

// HyperWeightsArgs are the operands of DSV4Ops.HyperWeights.
type HyperWeightsArgs struct {
	Z       T // [N,M] float: the mix logits (M = (2+n)·n; n with Head)
	Scale   T // [3] float ([1] with Head)
	Base    T // [M] float
	Streams int
	Iters   int // Sinkhorn iterations, at least 1 (ignored with Head)
	Eps     float32
	Head    bool
	Pre     T // [N,n] F32 (=)
	Post    T // [N,n] F32 (=); nil with Head
	Comb    T // [N,n·n] F32 (=); nil with Head
}

// HyperWeightsBackwardArgs are the operands of DSV4Ops.HyperWeightsBackward: the forward's
// operands (its outputs are not read: the backward recomputes the iterations) and the
// gradients of Pre, Post and Comb.
type HyperWeightsBackwardArgs struct {
	HyperWeightsArgs
	DPre, DPost, DComb T // F32, shapes of Pre, Post and Comb (DPost, DComb nil with Head)
	DZ                 T // [N,M] float (+=)
	GScale, GBase      T // float (+=), shapes of Scale and Base
}

// M is the number of mix columns.
func (a HyperWeightsArgs) M() int {
	if a.Head {
		return a.Streams
	}
	return (2 + a.Streams) * a.Streams
}

// Validate checks the shapes and returns N.
func (a HyperWeightsArgs) Validate() (int, error) {
	const op = "hyper-weights"
	n, m := a.Streams, a.M()
	if n < 1 {
		return 0, fmt.Errorf("%s: %d streams", op, n)
	}
	if !a.Head && a.Iters < 1 {
		return 0, fmt.Errorf("%s: %d Sinkhorn iterations, need at least 1", op, a.Iters)
	}
	if err := need2(op, "Z", a.Z, -1, m); err != nil {
		return 0, err
	}
	N := a.Z.Dim(0)
	scales := 3
	if a.Head {
		scales = 1
	}
	if err := needLen(op, "Scale", a.Scale, scales); err != nil {
		return 0, err
	}
	if err := needLen(op, "Base", a.Base, m); err != nil {
		return 0, err
	}
	if err := needF32(op, "Pre", a.Pre, N, n); err != nil {
		return 0, err
	}
	if a.Head {
		if !a.Post.IsNil() || !a.Comb.IsNil() {
			return 0, fmt.Errorf("%s: the head's mix has no Post or Comb", op)
		}
		return N, nil
	}
	if err := needF32(op, "Post", a.Post, N, n); err != nil {
		return 0, err
	}
	return N, needF32(op, "Comb", a.Comb, N, n*n)
}

// Validate checks the shapes and returns N.
func (a HyperWeightsBackwardArgs) Validate() (int, error) {
	const op = "hyper-weights-backward"
	f := a.HyperWeightsArgs
	f.Pre, f.Post, f.Comb = a.DPre, a.DPost, a.DComb
	N, err := f.Validate()
	if err != nil {
		return 0, fmt.Errorf("%s (DPre, DPost, DComb in the places of Pre, Post, Comb): %w", op, err)
	}
	if err := need2(op, "DZ", a.DZ, N, a.M()); err != nil {
		return 0, err
	}
	if err := needLen(op, "GScale", a.GScale, a.Scale.Numel()); err != nil {
		return 0, err
	}
	return N, needLen(op, "GBase", a.GBase, a.M())
}

// StreamExpandArgs are the operands of DSV4Ops.StreamExpand.
type StreamExpandArgs struct {
	Out  T // [N,n·C] float (=)
	Post T // [N,n] F32
	F    T // [N,C] float: the block's output
	Comb T // [N,n·n] F32
	X    T // [N,n·C] float: the streams before the block
}

// StreamExpandBackwardArgs are the operands of DSV4Ops.StreamExpandBackward.
type StreamExpandBackwardArgs struct {
	StreamExpandArgs   // Out is not read
	DOut             T // [N,n·C] float
	DPost, DComb     T // F32 (+=)
	DF, DX           T // float (+=)
}

// StreamDims checks the operands of a collapse (w [N,n], x [N,n·C], y [N,C]) and returns N,
// n and C.
func StreamDims(op string, w, x, y T) (N, n, C int, err error) {
	if w.Rank() != 2 || w.DType() != tensor.F32 {
		return 0, 0, 0, fmt.Errorf("%s: the stream weights %v must be [N,n] F32", op, w)
	}
	N, n = w.Dim(0), w.Dim(1)
	if err := need2(op, "Y", y, N, -1); err != nil {
		return 0, 0, 0, err
	}
	C = y.Dim(1)
	return N, n, C, need2(op, "X", x, N, n*C)
}

// Validate checks the shapes and returns N, n and C.
func (a StreamExpandArgs) Validate() (N, n, C int, err error) {
	const op = "stream-expand"
	if N, n, C, err = StreamDims(op, a.Post, a.X, a.F); err != nil {
		return
	}
	if err = needF32(op, "Comb", a.Comb, N, n*n); err != nil {
		return
	}
	err = need2(op, "Out", a.Out, N, n*C)
	return
}

// Validate checks the shapes and returns N, n and C.
func (a StreamExpandBackwardArgs) Validate() (N, n, C int, err error) {
	const op = "stream-expand-backward"
	f := a.StreamExpandArgs
	f.Out = a.DOut
	if N, n, C, err = f.Validate(); err != nil {
		return
	}
	for _, g := range []struct {
		name  string
		t, of T
	}{{"DPost", a.DPost, a.Post}, {"DComb", a.DComb, a.Comb}, {"DF", a.DF, a.F}, {"DX", a.DX, a.X}} {
		if !g.t.IsNil() && !sameShape(g.t, g.of) {
			return 0, 0, 0, fmt.Errorf("%s: %s %v must have the shape of %v", op, g.name, g.t, g.of)
		}
	}
	return
}

// SinkAttentionArgs are the operands of DSV4Ops.SinkAttention.
type SinkAttentionArgs struct {
	Q      T // [N,H·D] float
	KV     T // [S,D] float: the N own rows, then S-N compressed entries
	Sinks  T // [H] float
	Mask   T // [N,S-N] I32, optional: nonzero where the indexer chose the entry
	Heads  int
	Window int // 0: no limit
	Rate   int // rows per compressed entry; at least 1 when S > N
	Scale  float32
	Out    T // [N,H·D] float (=)
	LSE    T // [N,H] F32 (=)
}

// SinkAttentionBackwardArgs are the operands of DSV4Ops.SinkAttentionBackward: the forward's
// (Out and LSE as it wrote them) and the output's gradient.
type SinkAttentionBackwardArgs struct {
	SinkAttentionArgs
	DOut   T // [N,H·D] float
	DQ     T // [N,H·D] float (+=)
	DKV    T // [S,D] float (+=)
	GSinks T // [H] float (+=), optional
}

// SinkAttentionDims are the sizes of a sink attention.
type SinkAttentionDims struct{ N, S, H, D int }

// Validate checks the operands.
func (a SinkAttentionArgs) Validate() (SinkAttentionDims, error) {
	const op = "sink-attention"
	var d SinkAttentionDims
	if a.KV.Rank() != 2 {
		return d, fmt.Errorf("%s: KV %v must be [S,D]", op, a.KV)
	}
	d.S, d.D, d.H = a.KV.Dim(0), a.KV.Dim(1), a.Heads
	if d.H < 1 || d.D < 1 {
		return d, fmt.Errorf("%s: %d heads of %d", op, d.H, d.D)
	}
	if err := need2(op, "Q", a.Q, -1, d.H*d.D); err != nil {
		return d, err
	}
	d.N = a.Q.Dim(0)
	if d.S < d.N {
		return d, fmt.Errorf("%s: KV has %d rows, fewer than the %d queries' own keys", op, d.S, d.N)
	}
	if d.S > d.N && a.Rate < 1 {
		return d, fmt.Errorf("%s: %d compressed entries need a Rate of at least 1, not %d", op, d.S-d.N, a.Rate)
	}
	if a.Window < 0 {
		return d, fmt.Errorf("%s: window %d", op, a.Window)
	}
	if err := needLen(op, "Sinks", a.Sinks, d.H); err != nil {
		return d, err
	}
	if err := needMask(op, a.Mask, d.N, d.S-d.N); err != nil {
		return d, err
	}
	if err := need2(op, "Out", a.Out, d.N, d.H*d.D); err != nil {
		return d, err
	}
	return d, needF32(op, "LSE", a.LSE, d.N, d.H)
}

// Validate checks the operands.
func (a SinkAttentionBackwardArgs) Validate() (SinkAttentionDims, error) {
	const op = "sink-attention-backward"
	d, err := a.SinkAttentionArgs.Validate()
	if err != nil {
		return d, err
	}
	if err := need2(op, "DOut", a.DOut, d.N, d.H*d.D); err != nil {
		return d, err
	}
	if err := need2(op, "DQ", a.DQ, d.N, d.H*d.D); err != nil {
		return d, err
	}
	if err := need2(op, "DKV", a.DKV, d.S, d.D); err != nil {
		return d, err
	}
	if !a.GSinks.IsNil() {
		return d, needLen(op, "GSinks", a.GSinks, d.H)
	}
	return d, nil
}

// SinkSoftmaxArgs are the operands of DSV4Ops.SinkSoftmax.
type SinkSoftmaxArgs struct {
	X      T // [N·H,S] F32: the scaled scores
	Sinks  T // [H] float
	Mask   T // [N,S-N] I32, optional (as SinkAttentionArgs.Mask)
	Heads  int
	Window int
	Rate   int
	UseLSE bool // read LSE (the forward's) instead of writing it
	P      T    // [N·H,S] float (=)
	LSE    T    // [N,H] F32 (= or read)
}

// SinkSoftmaxBackwardArgs are the operands of DSV4Ops.SinkSoftmaxBackward.
type SinkSoftmaxBackwardArgs struct {
	P      T // [N·H,S] float: the forward's
	DP     T // [N·H,S] F32
	Sinks  T // [H] float
	LSE    T // [N,H] F32: the forward's
	Heads  int
	DS     T // [N·H,S] float (=), may be P
	GSinks T // [H] float (+=), optional
}

// SinkSoftmaxDims are the sizes of a sink softmax: N queries, H heads, S keys.
type SinkSoftmaxDims struct{ N, H, S int }

// Validate checks the operands.
func (a SinkSoftmaxArgs) Validate() (SinkSoftmaxDims, error) {
	const op = "sink-softmax"
	var d SinkSoftmaxDims
	if a.Heads < 1 {
		return d, fmt.Errorf("%s: %d heads", op, a.Heads)
	}
	if a.X.IsNil() || a.X.Rank() != 2 || a.X.DType() != tensor.F32 || a.X.Dim(0)%a.Heads != 0 {
		return d, fmt.Errorf("%s: X %v must be [N·%d,S] F32", op, a.X, a.Heads)
	}
	d.H, d.N, d.S = a.Heads, a.X.Dim(0)/a.Heads, a.X.Dim(1)
	if d.S < d.N {
		return d, fmt.Errorf("%s: %d keys, fewer than the %d queries' own", op, d.S, d.N)
	}
	if d.S > d.N && a.Rate < 1 {
		return d, fmt.Errorf("%s: %d compressed entries need a Rate of at least 1, not %d", op, d.S-d.N, a.Rate)
	}
	if a.Window < 0 {
		return d, fmt.Errorf("%s: window %d", op, a.Window)
	}
	if err := needLen(op, "Sinks", a.Sinks, d.H); err != nil {
		return d, err
	}
	if err := needMask(op, a.Mask, d.N, d.S-d.N); err != nil {
		return d, err
	}
	if err := need2(op, "P", a.P, d.N*d.H, d.S); err != nil {
		return d, err
	}
	return d, needF32(op, "LSE", a.LSE, d.N, d.H)
}

// Validate checks the operands.
func (a SinkSoftmaxBackwardArgs) Validate() (SinkSoftmaxDims, error) {
	const op = "sink-softmax-backward"
	var d SinkSoftmaxDims
	if a.Heads < 1 {
		return d, fmt.Errorf("%s: %d heads", op, a.Heads)
	}
	if err := need2(op, "P", a.P, -1, -1); err != nil {
		return d, err
	}
	if a.P.Dim(0)%a.Heads != 0 {
		return d, fmt.Errorf("%s: P %v must have N·%d rows", op, a.P, a.Heads)
	}
	d.H, d.N, d.S = a.Heads, a.P.Dim(0)/a.Heads, a.P.Dim(1)
	if err := needF32(op, "DP", a.DP, d.N*d.H, d.S); err != nil {
		return d, err
	}
	if err := need2(op, "DS", a.DS, d.N*d.H, d.S); err != nil {
		return d, err
	}
	if err := needLen(op, "Sinks", a.Sinks, d.H); err != nil {
		return d, err
	}
	if err := needF32(op, "LSE", a.LSE, d.N, d.H); err != nil {
		return d, err
	}
	if !a.GSinks.IsNil() {
		return d, needLen(op, "GSinks", a.GSinks, d.H)
	}
	return d, nil
}

// WindowPoolArgs are the operands of DSV4Ops.WindowPool.
type WindowPoolArgs struct {
	KV, Gate T // [N,W] float
	APE      T // [Rate,W] float
	Rate     int
	Overlap  bool // W = 2D
	Out      T    // [N/Rate,D] float (=)
}

// WindowPoolBackwardArgs are the operands of DSV4Ops.WindowPoolBackward (Out as the forward
// wrote it).
type WindowPoolBackwardArgs struct {
	WindowPoolArgs
	DOut       T // [N/Rate,D] float
	DKV, DGate T // [N,W] float (+=)
	GAPE       T // [Rate,W] float (+=)
}

// WindowPoolDims are the sizes of a window pooling: N rows of W channels, D pooled channels,
// Windows windows.
type WindowPoolDims struct{ N, W, D, Windows int }

// Validate checks the operands.
func (a WindowPoolArgs) Validate() (WindowPoolDims, error) {
	const op = "window-pool"
	var d WindowPoolDims
	if a.Rate < 1 {
		return d, fmt.Errorf("%s: rate %d", op, a.Rate)
	}
	if err := need2(op, "KV", a.KV, -1, -1); err != nil {
		return d, err
	}
	d.N, d.W = a.KV.Dim(0), a.KV.Dim(1)
	d.D = d.W
	if a.Overlap {
		if d.W%2 != 0 {
			return d, fmt.Errorf("%s: overlapping windows need an even width, not %d", op, d.W)
		}
		d.D = d.W / 2
	}
	d.Windows = d.N / a.Rate
	if err := need2(op, "Gate", a.Gate, d.N, d.W); err != nil {
		return d, err
	}
	if err := need2(op, "APE", a.APE, a.Rate, d.W); err != nil {
		return d, err
	}
	return d, need2(op, "Out", a.Out, d.Windows, d.D)
}

// Validate checks the operands.
func (a WindowPoolBackwardArgs) Validate() (WindowPoolDims, error) {
	const op = "window-pool-backward"
	d, err := a.WindowPoolArgs.Validate()
	if err != nil {
		return d, err
	}
	if err := need2(op, "DOut", a.DOut, d.Windows, d.D); err != nil {
		return d, err
	}
	for _, g := range []struct {
		name string
		t    T
		r, c int
	}{{"DKV", a.DKV, d.N, d.W}, {"DGate", a.DGate, d.N, d.W}, {"GAPE", a.GAPE, a.Rate, d.W}} {
		if !g.t.IsNil() {
			if err := need2(op, g.name, g.t, g.r, g.c); err != nil {
				return d, err
			}
		}
	}
	return d, nil
}

// IndexScoresArgs are the operands of DSV4Ops.IndexScores.
type IndexScoresArgs struct {
	Q       T // [N,Hi·Di] float
	Keys    T // [n,Di] float
	Weights T // [N,Hi] float
	Heads   int
	Rate    int
	Out     T // [N,n] F32 (=)
}

// Validate checks the operands and returns N, n, Hi and Di.
func (a IndexScoresArgs) Validate() (N, n, Hi, Di int, err error) {
	const op = "index-scores"
	if a.Rate < 1 || a.Heads < 1 {
		return 0, 0, 0, 0, fmt.Errorf("%s: rate %d, %d heads", op, a.Rate, a.Heads)
	}
	if err = need2(op, "Keys", a.Keys, -1, -1); err != nil {
		return
	}
	n, Di, Hi = a.Keys.Dim(0), a.Keys.Dim(1), a.Heads
	if err = need2(op, "Q", a.Q, -1, Hi*Di); err != nil {
		return
	}
	N = a.Q.Dim(0)
	if err = need2(op, "Weights", a.Weights, N, Hi); err != nil {
		return
	}
	err = needF32(op, "Out", a.Out, N, n)
	return
}

// need2 checks that t is a 2-D float tensor of [r, c] (-1: any).
func need2(op, name string, t T, r, c int) error {
	if t.IsNil() || t.Rank() != 2 || (r >= 0 && t.Dim(0) != r) || (c >= 0 && t.Dim(1) != c) ||
		(t.DType() != tensor.F32 && t.DType() != tensor.BF16) {
		return fmt.Errorf("%s: %s %v must be a [%s,%s] float tensor", op, name, t, dimName(r), dimName(c))
	}
	return nil
}

// needF32 checks that t is [r, c] F32.
func needF32(op, name string, t T, r, c int) error {
	if t.IsNil() || t.Rank() != 2 || t.Dim(0) != r || t.Dim(1) != c || t.DType() != tensor.F32 {
		return fmt.Errorf("%s: %s %v must be [%d,%d] F32", op, name, t, r, c)
	}
	return nil
}

// needLen checks that t is a float tensor of n elements (any shape).
func needLen(op, name string, t T, n int) error {
	if t.IsNil() || t.Numel() != n || (t.DType() != tensor.F32 && t.DType() != tensor.BF16) {
		return fmt.Errorf("%s: %s %v must be a float tensor of %d elements", op, name, t, n)
	}
	return nil
}

func dimName(d int) string {
	if d < 0 {
		return "*"
	}
	return fmt.Sprint(d)
}

func sameShape(a, b T) bool {
	if a.Rank() != b.Rank() {
		return false
	}
	for i := 0; i < a.Rank(); i++ {
		if a.Dim(i) != b.Dim(i) {
			return false
		}
	}
	return true
}

// Complete reports whether every member of o is set (a backend hands out Optional.DSV4 only
// then) and otherwise names the first missing one.
func (o *DSV4Ops) Complete() (bool, string) {
	for _, m := range []struct {
		name string
		set  bool
	}{
		{"HyperWeights", o.HyperWeights != nil}, {"HyperWeightsBackward", o.HyperWeightsBackward != nil},
		{"StreamCollapse", o.StreamCollapse != nil}, {"StreamCollapseBackward", o.StreamCollapseBackward != nil},
		{"StreamExpand", o.StreamExpand != nil}, {"StreamExpandBackward", o.StreamExpandBackward != nil},
		{"SinkAttention", o.SinkAttention != nil}, {"SinkAttentionBackward", o.SinkAttentionBackward != nil},
		{"SinkSoftmax", o.SinkSoftmax != nil}, {"SinkSoftmaxBackward", o.SinkSoftmaxBackward != nil},
		{"WindowPool", o.WindowPool != nil}, {"WindowPoolBackward", o.WindowPoolBackward != nil},
		{"IndexScores", o.IndexScores != nil},
		{"SqrtSoftplus", o.SqrtSoftplus != nil}, {"SqrtSoftplusBackward", o.SqrtSoftplusBackward != nil},
		{"SwiGLUClampedSplit", o.SwiGLUClampedSplit != nil}, {"SwiGLUClampedSplitBackward", o.SwiGLUClampedSplitBackward != nil},
	} {
		if !m.set {
			return false, m.name
		}
	}
	return true, ""
}

// needMask checks an optional indexer mask: [n, c] I32.
func needMask(op string, m T, n, c int) error {
	if !m.IsNil() && (m.DType() != tensor.I32 || m.Rank() != 2 || m.Dim(0) != n || m.Dim(1) != c) {
		return fmt.Errorf("%s: Mask %v must be [%d,%d] I32", op, m, n, c)
	}
	return nil
}

// ElementwiseCount checks the operands of an elementwise DeepSeek-V4 op (SqrtSoftplus,
// SwiGLUClampedSplit and their backwards): each present, with the element count of the first,
// which it returns. names name them in errors.
func ElementwiseCount(op string, names []string, ts ...T) (int, error) {
	if ts[0].IsNil() {
		return 0, fmt.Errorf("%s: %s is required", op, names[0])
	}
	n := ts[0].Numel()
	for i := 1; i < len(ts); i++ {
		if ts[i].IsNil() || ts[i].Numel() != n {
			return 0, fmt.Errorf("%s: %s %v must have the %d elements of %s %v", op, names[i], ts[i], n, names[0], ts[0])
		}
	}
	return n, nil
}

// SwiGLUClampedSplitBackwardCount is ElementwiseCount over SwiGLUClampedSplitBackward's
// operands, an absent gradient (nil: not wanted) left out.
func SwiGLUClampedSplitBackwardCount(op string, dGate, dUp, dOut, gate, up T) (int, error) {
	names, ts := []string{"gate", "up", "dOut"}, []T{gate, up, dOut}
	if !dGate.IsNil() {
		names, ts = append(names, "dGate"), append(ts, dGate)
	}
	if !dUp.IsNil() {
		names, ts = append(names, "dUp"), append(ts, dUp)
	}
	return ElementwiseCount(op, names, ts...)
}
