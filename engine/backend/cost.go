package backend

import "github.com/halo-shell/halo-shell/internal/profilekeys"

// The cost table: for each op, from the arguments of one call, the floating-point operations it
// performs, the bytes it must move and its op class. The profiler (engine/profile) records them
// on every span, the GPU benchmarks turn them into TFLOP/s and GB/s, and TrainingFLOPsPerToken,
// the model FLOPs behind MFU (engine/bench, the session's step metrics), is built from the same
// per-product counts, so that a figure means the same thing wherever it is quoted.
//
// Counting rules:
//
//   - FLOPs: a multiply-add is 2. A matrix product C[M,Nc] = A[M,K] @ B[K,Nc] is 2·M·Nc·K
//     (MatmulFLOPs). Attention counts 4·HD per visible (query, key) pair and query head forward
//     (QKᵀ and PV, AttentionPairFLOPs) and 2.5 times that backward (the scores are recomputed,
//     as the contract requires, then dV, dP, dQ and dK). Elementwise ops count the arithmetic of
//     their definition per element, stated at each function. Exponentials, square roots and
//     divisions of per-row statistics are not counted.
//   - Bytes: what the op must move at the least: each input read once, each "=" output written
//     once, each "+=" output (and each output updated in place) read and written, every operand
//     counted, small ones (weights of norms, rstd, positions, cu_seqlens) included. A backend
//     that reads an input twice moves more than Bytes; Bytes over time is the bandwidth an op
//     achieved against the least it needed.
//
// The functions read shapes and dtypes only: they never touch tensor contents, so they may be
// called on any goroutine, and on the host side of an asynchronous device without waiting.

// Cost is the work of one op call.
type Cost struct {
	FLOPs int64  // floating-point operations; 0 where not counted (attention without its pairs)
	Bytes int64  // bytes the op must read and write (see the counting rules above)
	Class string // op class, one of internal/profilekeys.Classes
}

// MatmulFLOPs is the cost of one matrix product C[m,n] = A[m,k] @ B[k,n]: 2·m·n·k.
func MatmulFLOPs(m, n, k int64) int64 { return 2 * m * n * k }

// AttentionPairFLOPs is the forward cost of one visible (query, key) pair for one query head of
// width hd: 2·hd for its score (QKᵀ) and 2·hd for its share of the output (PV).
func AttentionPairFLOPs(hd int64) int64 { return 4 * hd }

// AttentionBackwardRatio is AttentionBackward's FLOPs over Attention's for the same pairs: five
// products (the recomputed scores, dV, dP, dQ, dK) against the forward's two.
const AttentionBackwardRatio = 2.5

// TrainingFLOPsPerToken is the model FLOPs of training on one token (forward and backward, the
// PaLM convention of MFU): 6·params + 6·layers·seqLen·heads·headDim. Each weight a token uses
// is one multiply-add in the forward's matrix products and two in the backward's (dX and dW),
// 3·MatmulFLOPs(1, 1, 1) per parameter; each layer's causal attention sees seqLen/2 keys per
// query on average, AttentionPairFLOPs(headDim) per pair and head forward and twice that
// backward (model FLOPs count no recomputation). params is what one token uses: for a mixture
// of experts the active parameters.
func TrainingFLOPsPerToken(params int64, layers, seqLen, heads, headDim int) float64 {
	perParam := 3 * MatmulFLOPs(1, 1, 1)
	attn := 3 * float64(layers) * float64(heads) * float64(seqLen) / 2 * float64(AttentionPairFLOPs(int64(headDim)))
	return float64(perParam)*float64(params) + attn
}

// CausalPairs returns the visible (query, key) pairs of causal attention over packed documents
// with boundaries cu ([D+1], as AttentionShape.CuSeqlens): a document of n tokens has
// n(n+1)/2, or, with a sliding window w > 0, each query sees at most w keys. Multiply by the
// query heads for a call's pairs (AttentionCost takes them per head).
func CausalPairs(cu []int32, window int) int64 {
	var p int64
	for d := 0; d+1 < len(cu); d++ {
		n := int64(cu[d+1] - cu[d])
		w := int64(window)
		if w <= 0 || w >= n {
			p += n * (n + 1) / 2
			continue
		}
		// Queries 0..w-1 see i+1 keys, the other n-w see w.
		p += w*(w+1)/2 + (n-w)*w
	}
	return p
}

// elems is t's element count, 0 for the zero tensor.
func elems(t T) int64 {
	if t.IsNil() {
		return 0
	}
	return int64(t.Numel())
}

// size is t's bytes, 0 for the zero tensor.
func size(t T) int64 {
	if t.IsNil() {
		return 0
	}
	return t.Bytes()
}

// sizes sums the bytes of ts.
func sizes(ts ...T) int64 {
	var n int64
	for _, t := range ts {
		n += size(t)
	}
	return n
}

// dim is t's dimension i (negative counts from the end), 0 when t has none.
func dim(t T, i int) int64 {
	if t.IsNil() {
		return 0
	}
	if i < 0 {
		i += t.Rank()
	}
	if i < 0 || i >= t.Rank() {
		return 0
	}
	return int64(t.Dim(i))
}

// TransferCost is an Upload or Download of n bytes (class other, no FLOPs).
func TransferCost(n int) Cost { return Cost{Bytes: int64(n), Class: profilekeys.ClassOther} }

// CopyCost is Memory.Copy: src read, dst written.
func CopyCost(dst, src T) Cost { return Cost{Bytes: sizes(dst, src), Class: profilekeys.ClassOther} }

// CopyColumnsCost is Ops.CopyColumns: the blocks' elements read from Src, and written to Dst
// (read as well when accumulating or summing groups); one addition per summed or accumulated
// element.
func CopyColumnsCost(a ColumnCopyArgs) Cost {
	rows := int64(0)
	if !a.Dst.IsNil() && a.Dst.Rank() > 0 {
		rows = int64(a.Dst.Dim(0))
	}
	moved := rows * int64(a.Groups) * int64(a.Width)
	written := moved
	if a.DstStride == 0 && a.Groups > 1 {
		written = rows * int64(a.Width)
	}
	c := Cost{Bytes: moved*int64(a.Src.DType().Size()) + written*int64(a.Dst.DType().Size()), Class: profilekeys.ClassOther}
	if a.Accumulate {
		c.Bytes += written * int64(a.Dst.DType().Size())
		c.FLOPs = written
	}
	if written < moved {
		c.FLOPs += moved - written
	}
	return c
}

// FillCost is Ops.Fill: t written.
func FillCost(t T) Cost { return Cost{Bytes: size(t), Class: profilekeys.ClassOther} }

// AddCost is Ops.Add: one addition per element; a and b read, out written.
func AddCost(out, a, b T) Cost {
	return Cost{FLOPs: elems(out), Bytes: sizes(out, a, b), Class: profilekeys.ClassOther}
}

// AxpyCost is Ops.Axpy: a multiply-add per element; x read, y read and written.
func AxpyCost(y, x T) Cost {
	return Cost{FLOPs: 2 * elems(y), Bytes: 2*size(y) + size(x), Class: profilekeys.ClassOther}
}

// ScaleCost is Ops.Scale: one multiplication per element, t read and written.
func ScaleCost(t T) Cost {
	return Cost{FLOPs: elems(t), Bytes: 2 * size(t), Class: profilekeys.ClassOther}
}

// ScaleRowsCost is Ops.ScaleRows: one multiplication per element; t read and written, w read.
func ScaleRowsCost(t, w T) Cost {
	return Cost{FLOPs: elems(t), Bytes: 2*size(t) + size(w), Class: profilekeys.ClassOther}
}

// RowDotCost is Ops.RowDot: a multiply-add per element of a; a and b read, out written.
func RowDotCost(out, a, b T) Cost {
	return Cost{FLOPs: 2 * elems(a), Bytes: sizes(out, a, b), Class: profilekeys.ClassOther}
}

// SumSquaresCost is Ops.SumSquares, the gradient-norm reduction (class optimizer): a
// multiply-add per element, every tensor read.
func SumSquaresCost(ts []T) Cost {
	c := Cost{Class: profilekeys.ClassOptimizer}
	for _, t := range ts {
		c.FLOPs += 2 * elems(t)
		c.Bytes += size(t)
	}
	return c
}

// EmbeddingCost is Ops.Embedding: ids read, one weight row per token read, out written.
func EmbeddingCost(out, weight, ids T) Cost {
	rows := elems(out) * int64(weight.DType().Size())
	return Cost{Bytes: size(ids) + rows + size(out), Class: profilekeys.ClassEmbedding}
}

// EmbeddingBackwardCost is Ops.EmbeddingBackward: one addition per element of dOut; dOut and
// ids read, one row of dWeight per token read and written.
func EmbeddingBackwardCost(dWeight, dOut, ids T) Cost {
	rows := elems(dOut) * int64(dWeight.DType().Size())
	return Cost{FLOPs: elems(dOut), Bytes: size(dOut) + size(ids) + 2*rows, Class: profilekeys.ClassEmbedding}
}

// GEMMCost is Ops.GEMM: MatmulFLOPs of op(A) [M,K] @ op(B) [K,Nc]; A and B read, C written
// (and read when Beta != 0).
func GEMMCost(a GEMMArgs) Cost {
	k := dim(a.A, 1)
	if a.TransA {
		k = dim(a.A, 0)
	}
	c := Cost{FLOPs: MatmulFLOPs(dim(a.C, 0), dim(a.C, 1), k), Bytes: sizes(a.A, a.B, a.C), Class: profilekeys.ClassMatmul}
	if a.Beta != 0 {
		c.Bytes += size(a.C)
	}
	return c
}

// LinearCost is Ops.Linear: MatmulFLOPs of x [M,I] @ wᵀ [I,O] plus the bias additions; x, w and
// bias read, out written.
func LinearCost(out, x, w, bias T) Cost {
	m := elems(x) / max(dim(w, 1), 1)
	fl := MatmulFLOPs(m, dim(w, 0), dim(w, 1))
	if !bias.IsNil() {
		fl += elems(out)
	}
	return Cost{FLOPs: fl, Bytes: sizes(out, x, w, bias), Class: profilekeys.ClassMatmul}
}

// LinearBackwardCost is Ops.LinearBackward: MatmulFLOPs [M,O]x[O,I] for DX and for DW, M·O
// additions for DB; DY read, W read for DX, X read for DX; DX written (and read with
// AccumulateDX), DW and DB read and written.
func LinearBackwardCost(a LinearBackwardArgs) Cost {
	o := dim(a.DY, -1)
	m := elems(a.DY) / max(o, 1)
	c := Cost{Bytes: size(a.DY), Class: profilekeys.ClassMatmul}
	if !a.DX.IsNil() {
		c.FLOPs += MatmulFLOPs(m, dim(a.DX, -1), o)
		c.Bytes += size(a.W) + size(a.DX)
		if a.AccumulateDX {
			c.Bytes += size(a.DX)
		}
	}
	if !a.DW.IsNil() {
		c.FLOPs += MatmulFLOPs(o, dim(a.DW, -1), m)
		c.Bytes += size(a.X) + 2*size(a.DW)
	}
	if !a.DB.IsNil() {
		c.FLOPs += m * o
		c.Bytes += 2 * size(a.DB)
	}
	return c
}

// RMSNormCost is Ops.RMSNorm: 4 FLOPs per element (square, sum, the two scalings); x and w read,
// out and rstd written.
func RMSNormCost(out, rstd, x, w T) Cost {
	return Cost{FLOPs: 4 * elems(x), Bytes: sizes(out, rstd, x, w), Class: profilekeys.ClassNorm}
}

// RMSNormBackwardCost is Ops.RMSNormBackward: 8 FLOPs per element; DY, X, W and RStd read, DX
// written (and read with AccumulateDX), DW read and written.
func RMSNormBackwardCost(a RMSNormBackwardArgs) Cost {
	c := Cost{FLOPs: 8 * elems(a.X), Bytes: sizes(a.DY, a.X, a.W, a.RStd, a.DX) + 2*size(a.DW), Class: profilekeys.ClassNorm}
	if a.AccumulateDX {
		c.Bytes += size(a.DX)
	}
	return c
}

// AddRMSNormCost is Optional.AddRMSNorm: the addition and RMSNorm's 4, 5 FLOPs per element;
// x, residual and w read, residualOut, out and rstd written (residualOut counts as written even
// where it aliases residual).
func AddRMSNormCost(residualOut, out, rstd, x, residual, w T) Cost {
	return Cost{FLOPs: 5 * elems(x), Bytes: sizes(residualOut, out, rstd, x, residual, w), Class: profilekeys.ClassNorm}
}

// RoPECost is Ops.RoPE: 3 FLOPs per element (two products and a sum per rotated value; the
// pass-through dims counted alike); x, positions and inverse frequencies read, out written.
func RoPECost(out, x T, a RoPEArgs) Cost {
	return Cost{FLOPs: 3 * elems(x), Bytes: sizes(out, x, a.Positions, a.InvFreq), Class: profilekeys.ClassRoPE}
}

// RoPEBackwardCost is Ops.RoPEBackward, the same rotation: as RoPECost for dY in and dX out.
func RoPEBackwardCost(dX, dY T, a RoPEArgs) Cost {
	return Cost{FLOPs: 3 * elems(dY), Bytes: sizes(dX, dY, a.Positions, a.InvFreq), Class: profilekeys.ClassRoPE}
}

// AttentionCost is Ops.Attention: AttentionPairFLOPs(HD) per visible pair and query head, for
// pairs visible (query, key) pairs per head (CausalPairs of the call's documents; 0 when they
// are not known on the host, and FLOPs are then not counted); Q, K, V and the boundaries read,
// Out and LSE written.
func AttentionCost(a AttentionArgs, pairs int64) Cost {
	return Cost{FLOPs: pairs * int64(a.NH) * AttentionPairFLOPs(int64(a.HD)),
		Bytes: sizes(a.Out, a.LSE, a.Q, a.K, a.V, a.CuSeqlens, a.CuSeqlensK), Class: profilekeys.ClassAttention}
}

// AttentionBackwardCost is Ops.AttentionBackward: AttentionBackwardRatio times the forward's
// FLOPs for the same pairs (0 when pairs is 0); DOut, Q, K, V, Out, LSE and the boundaries read,
// DQ, DK and DV written.
func AttentionBackwardCost(a AttentionBackwardArgs, pairs int64) Cost {
	fwd := pairs * int64(a.NH) * AttentionPairFLOPs(int64(a.HD))
	return Cost{FLOPs: int64(AttentionBackwardRatio * float64(fwd)),
		Bytes: sizes(a.DQ, a.DK, a.DV, a.DOut, a.Q, a.K, a.V, a.Out, a.LSE, a.CuSeqlens, a.CuSeqlensK), Class: profilekeys.ClassAttention}
}

// SwiGLUCost is Ops.SwiGLU: 5 FLOPs per element (the sigmoid's exponential, addition and
// division, two products); gate and up read, out written.
func SwiGLUCost(out, gate, up T) Cost {
	return Cost{FLOPs: 5 * elems(out), Bytes: sizes(out, gate, up), Class: profilekeys.ClassMLPActivation}
}

// SwiGLUBackwardCost is Ops.SwiGLUBackward: 10 FLOPs per element; dOut, gate and up read,
// dGate and dUp written.
func SwiGLUBackwardCost(dGate, dUp, dOut, gate, up T) Cost {
	return Cost{FLOPs: 10 * elems(dOut), Bytes: sizes(dGate, dUp, dOut, gate, up), Class: profilekeys.ClassMLPActivation}
}

// AttentionSinksCost is Ops.AttentionSinks: per token and head a log-add-exp and HD
// products; Out read and written, LSE read and written, the sinks read.
func AttentionSinksCost(out, lse, sinks T) Cost {
	return Cost{FLOPs: elems(out) + 4*elems(lse), Bytes: 2*size(out) + 2*size(lse) + size(sinks), Class: profilekeys.ClassAttention}
}

// AttentionSinksBackwardCost is Ops.AttentionSinksBackward: a dot product of HD per token and
// head and one exponential; dOut, Out and LSE read, dSinks read and written.
func AttentionSinksBackwardCost(dSinks, dOut, out, lse T) Cost {
	return Cost{FLOPs: 2*elems(out) + 3*elems(lse), Bytes: sizes(dOut, out, lse) + 2*size(dSinks), Class: profilekeys.ClassAttention}
}

// SwiGLUClampedCost is Ops.SwiGLUClamped: 8 FLOPs per output (two clamps, the sigmoid, three
// products and an addition); gateUp read, out written.
func SwiGLUClampedCost(out, gateUp T) Cost {
	return Cost{FLOPs: 8 * elems(out), Bytes: sizes(out, gateUp), Class: profilekeys.ClassMLPActivation}
}

// SwiGLUClampedBackwardCost is Ops.SwiGLUClampedBackward: 14 FLOPs per output; dOut and gateUp
// read, dGateUp written.
func SwiGLUClampedBackwardCost(dGateUp, dOut, gateUp T) Cost {
	return Cost{FLOPs: 14 * elems(dOut), Bytes: sizes(dGateUp, dOut, gateUp), Class: profilekeys.ClassMLPActivation}
}

// GeGLUCost is Ops.GeGLU: 12 FLOPs per element (the cubic, the tanh counted as an exponential,
// addition and division, three products); gate and up read, out written.
func GeGLUCost(out, gate, up T) Cost {
	return Cost{FLOPs: 12 * elems(out), Bytes: sizes(out, gate, up), Class: profilekeys.ClassMLPActivation}
}

// GeGLUBackwardCost is Ops.GeGLUBackward: 20 FLOPs per element; dOut, gate and up read, dGate
// and dUp written.
func GeGLUBackwardCost(dGate, dUp, dOut, gate, up T) Cost {
	return Cost{FLOPs: 20 * elems(dOut), Bytes: sizes(dGate, dUp, dOut, gate, up), Class: profilekeys.ClassMLPActivation}
}

// CrossEntropyCost is Ops.CrossEntropy, the fused LM head and loss (class loss): MatmulFLOPs
// [N,C]x[C,V] for the logits, and again for DHidden and for DWeight when set (the softmax is not
// counted); Hidden, Weight and Targets read, Loss, LogProb and DHidden written, DWeight read
// and written. The fp32 logits of each chunk never leave the op and are not counted.
func CrossEntropyCost(a CrossEntropyArgs) Cost {
	n, v, c := dim(a.Hidden, 0), dim(a.Weight, 0), dim(a.Weight, 1)
	gemm := MatmulFLOPs(n, v, c)
	cost := Cost{FLOPs: gemm, Bytes: sizes(a.Hidden, a.Weight, a.Targets, a.Loss, a.LogProb, a.DHidden) + 2*size(a.DWeight), Class: profilekeys.ClassLoss}
	if !a.DHidden.IsNil() {
		cost.FLOPs += gemm
	}
	if !a.DWeight.IsNil() {
		cost.FLOPs += gemm
	}
	return cost
}

// AdamWCost is Optional.AdamW (class optimizer): 12 FLOPs per element, a round count of the
// update's arithmetic (AdamWArgs); Grad read, Param, M and V read and written, Shadow written.
func AdamWCost(a AdamWArgs) Cost {
	return Cost{FLOPs: 12 * elems(a.Param), Bytes: 2*sizes(a.Param, a.M, a.V) + sizes(a.Grad, a.Shadow), Class: profilekeys.ClassOptimizer}
}

// ---- mixture of experts (moe.go, moe_route.go) ----

// GroupedGEMMCost is Optional.GroupedGEMM (class expert_gemm): GroupedDims.FLOPs, 2·S·N_·K_ for
// every kind (0 when the shapes are invalid); A, B and Offsets read, Out written (and read with
// Accumulate).
func GroupedGEMMCost(a GroupedGEMMArgs) Cost {
	c := Cost{Bytes: sizes(a.A, a.B, a.Offsets, a.Out), Class: profilekeys.ClassExpertGEMM}
	if d, err := a.Dims(); err == nil {
		c.FLOPs = d.FLOPs()
	}
	if a.Accumulate {
		c.Bytes += size(a.Out)
	}
	return c
}

// MoERouteCost is Optional.MoERoute (class router): 8 FLOPs per logit (the score function, the
// bias and the top-k comparisons); Logits, Bias and ExpertScale read, Probs, Sel, Weights and
// ProbSum written, Counts read and written.
func MoERouteCost(a MoERouteArgs) Cost {
	return Cost{FLOPs: 8 * elems(a.Logits), Bytes: sizes(a.Logits, a.Bias, a.Probs, a.Sel, a.Weights, a.ProbSum, a.ExpertScale) + 2*size(a.Counts),
		Class: profilekeys.ClassRouter}
}

// MoERouteBackwardCost is Optional.MoERouteBackward (class router): 4 FLOPs per probability;
// Probs, Sel, Weights, DWeights, AuxGrad and ExpertScale read, DLogits and DExpertScale written.
func MoERouteBackwardCost(a MoERouteBackwardArgs) Cost {
	return Cost{FLOPs: 4 * elems(a.Probs), Bytes: sizes(a.Probs, a.Sel, a.Weights, a.DWeights, a.AuxGrad, a.DLogits, a.ExpertScale, a.DExpertScale), Class: profilekeys.ClassRouter}
}

// MoEPermuteCost is Optional.MoEPermute (class permute), a sort and a gather, no FLOPs: Sel read,
// one row of X read per slot, Offsets, Order, Slot and Xs written.
func MoEPermuteCost(a MoEPermuteArgs) Cost {
	rows := elems(a.Xs) * int64(a.X.DType().Size())
	return Cost{Bytes: size(a.Sel) + rows + sizes(a.Offsets, a.Order, a.Slot, a.Xs), Class: profilekeys.ClassPermute}
}

// MoEPermuteBackwardCost is Optional.MoEPermuteBackward (class permute): one addition per
// element of DXs; DXs and Slot read, DX written (and read with Accumulate).
func MoEPermuteBackwardCost(a MoEPermuteBackwardArgs) Cost {
	c := Cost{FLOPs: elems(a.DXs), Bytes: sizes(a.DXs, a.Slot, a.DX), Class: profilekeys.ClassPermute}
	if a.Accumulate {
		c.Bytes += size(a.DX)
	}
	return c
}

// MoECombineCost is Optional.MoECombine (class combine): a multiply-add per element of Ys; Ys,
// Slot and Weights read, Out written (and read with Accumulate).
func MoECombineCost(a MoECombineArgs) Cost {
	c := Cost{FLOPs: 2 * elems(a.Ys), Bytes: sizes(a.Ys, a.Slot, a.Weights, a.Out), Class: profilekeys.ClassCombine}
	if a.Accumulate {
		c.Bytes += size(a.Out)
	}
	return c
}

// MoECombineBackwardCost is Optional.MoECombineBackward (class combine): 3 FLOPs per element of
// Ys (the weighted dYs, a multiply-add of the dWeights dot product); DOut, Ys, Slot and Weights
// read, DYs and DWeights written.
func MoECombineBackwardCost(a MoECombineBackwardArgs) Cost {
	return Cost{FLOPs: 3 * elems(a.Ys), Bytes: sizes(a.DOut, a.Ys, a.Slot, a.Weights, a.DYs, a.DWeights), Class: profilekeys.ClassCombine}
}

// SwiGLUPackedCost is Optional.SwiGLUPacked, SwiGLU over packed gate|up rows: SwiGLUCost's
// 5 FLOPs per output element; gateUp read, out written.
func SwiGLUPackedCost(out, gateUp T) Cost {
	return Cost{FLOPs: 5 * elems(out), Bytes: sizes(out, gateUp), Class: profilekeys.ClassMLPActivation}
}

// SwiGLUPackedBackwardCost is Optional.SwiGLUPackedBackward: SwiGLUBackwardCost's 10 FLOPs per
// element of dOut; dOut and gateUp read, dGateUp written (counted apart even where it is gateUp).
func SwiGLUPackedBackwardCost(dGateUp, dOut, gateUp T) Cost {
	return Cost{FLOPs: 10 * elems(dOut), Bytes: sizes(dGateUp, dOut, gateUp), Class: profilekeys.ClassMLPActivation}
}

// GeGLUPackedCost is Optional.GeGLUPacked, GeGLU over packed gate|up rows: GeGLUCost's 12
// FLOPs per output element; gateUp read, out written.
func GeGLUPackedCost(out, gateUp T) Cost {
	return Cost{FLOPs: 12 * elems(out), Bytes: sizes(out, gateUp), Class: profilekeys.ClassMLPActivation}
}

// GeGLUPackedBackwardCost is Optional.GeGLUPackedBackward: GeGLUBackwardCost's 20 FLOPs per
// element of dOut; dOut and gateUp read, dGateUp written (counted apart even where it is gateUp).
func GeGLUPackedBackwardCost(dGateUp, dOut, gateUp T) Cost {
	return Cost{FLOPs: 20 * elems(dOut), Bytes: sizes(dGateUp, dOut, gateUp), Class: profilekeys.ClassMLPActivation}
}

// DequantNF4Cost is Optional.DequantNF4 (class other: it feeds the product that reads the
// weight but is no part of it): one multiply per element, two more per block under double
// quantisation; the packed codes and scales read, the bf16 weight written.
func DequantNF4Cost(a DequantNF4Args) Cost {
	n := elems(a.Out)
	blocks := elems(a.Absmax)
	c := Cost{FLOPs: n, Bytes: sizes(a.Out, a.Packed, a.Absmax), Class: profilekeys.ClassOther}
	if a.Nested() {
		c.FLOPs += 2 * blocks
		c.Bytes += sizes(a.NestedAbsmax, a.NestedMap)
	}
	return c
}

// DropoutCost is Optional.Dropout (class other): one multiply per element (the hash that draws
// the mask is not counted); X read, Out written.
func DropoutCost(a DropoutArgs) Cost {
	return Cost{FLOPs: elems(a.X), Bytes: sizes(a.X, a.Out), Class: profilekeys.ClassOther}
}

// DecodeAttentionCost is Optional.DecodeAttention (class attention): AttentionPairFLOPs(HD) per
// (row, key) pair and query head, for pairs visible pairs in all (the sum over rows of the keys
// each attends; 0 when the positions are not known on the host); Q, K, V, the positions and the
// keys and values read (2*pairs*NKV*HD elements of the caches at Q's element size), Out, LSE and
// the appended cache rows written.
func DecodeAttentionCost(a DecodeAttentionArgs, pairs int64) Cost {
	el := int64(0)
	if n := a.Q.Numel(); n > 0 {
		el = a.Q.Bytes() / int64(n)
	}
	return Cost{FLOPs: pairs * int64(a.NH) * AttentionPairFLOPs(int64(a.HD)),
		Bytes: sizes(a.Out, a.LSE, a.Q, a.Positions) + 2*sizes(a.K, a.V) + 2*pairs*int64(a.NKV*a.HD)*el,
		Class: profilekeys.ClassAttention}
}

// SampleTokensCost is Optional.SampleTokens (class other): the logits read once (the passes of
// the top-k and top-p bisections re-read them from cache and are not counted), the ids written.
func SampleTokensCost(a SampleArgs) Cost {
	return Cost{FLOPs: elems(a.Logits), Bytes: sizes(a.Logits, a.Out, a.Bad), Class: profilekeys.ClassOther}
}

// ShortConvCost is Optional.ShortConv (class other): 2 FLOPs per tap and 2 for the gates per
// element of Conv; BCX, W, Bias and the positions read, Conv and Gated written.
func ShortConvCost(a ShortConvArgs) Cost {
	l := int64(0)
	if n := elems(a.Conv); n > 0 && a.Conv.Rank() == 2 {
		l = elems(a.W) / int64(max(a.Conv.Dim(1), 1))
	}
	return Cost{FLOPs: elems(a.Conv) * (2*l + 2), Bytes: sizes(a.BCX, a.W, a.Bias, a.Positions, a.Conv, a.Gated),
		Class: profilekeys.ClassOther}
}

// ShortConvBackwardCost is Optional.ShortConvBackward (class other): 6 FLOPs per tap (the
// input, filter and recomputed-input products) and 4 for the gates per element of DGated;
// DGated, BCX, W, the positions and Conv read, DBCX written, GW and GBias read and written.
func ShortConvBackwardCost(a ShortConvBackwardArgs) Cost {
	l := int64(0)
	if n := elems(a.DGated); n > 0 && a.DGated.Rank() == 2 {
		l = elems(a.W) / int64(max(a.DGated.Dim(1), 1))
	}
	return Cost{FLOPs: elems(a.DGated) * (6*l + 4),
		Bytes: sizes(a.DGated, a.BCX, a.W, a.Positions, a.Conv, a.DBCX) + 2*sizes(a.GW, a.GBias),
		Class: profilekeys.ClassOther}
}

// GatedDeltaCost is Optional.GatedDelta (class attention): 6·KD FLOPs per value element and
// token (the decay, the memory read, the update and the output); the inputs read, Out and
// States written.
func GatedDeltaCost(a GatedDeltaArgs) Cost {
	return Cost{FLOPs: 6 * int64(a.KD) * elems(a.Out), Bytes: sizes(a.Q, a.K, a.V, a.Beta, a.G, a.Out, a.States),
		Class: profilekeys.ClassAttention}
}

// GatedDeltaBackwardCost is Optional.GatedDeltaBackward (class attention): the recomputed
// states of each stretch (Chunk/2 steps per token on average) and 14·KD FLOPs per value element
// and token for the step's gradients; the inputs, States and DOut read, the gradients written.
func GatedDeltaBackwardCost(a GatedDeltaBackwardArgs) Cost {
	per := int64(14+3*max(a.Chunk, 1)) * int64(a.KD)
	return Cost{FLOPs: per * elems(a.DOut),
		Bytes: sizes(a.Q, a.K, a.V, a.Beta, a.G, a.States, a.DOut, a.DQ, a.DK, a.DV, a.DBeta, a.DG),
		Class: profilekeys.ClassAttention}
}

// GatedDeltaPrepCost is Optional.GatedDeltaPrep (class other): 2 FLOPs per tap and about 8 for
// the SiLU and the norm per element of Mixed, 10 per gate; the inputs read, Q, K, V, Beta and G
// written.
func GatedDeltaPrepCost(a GatedDeltaPrepArgs) Cost {
	l := elems(a.Conv) / int64(max(2*a.KH*a.KD+a.VH*a.VD, 1))
	return Cost{FLOPs: elems(a.Mixed)*(2*l+8) + 10*elems(a.Beta),
		Bytes: sizes(a.Mixed, a.B, a.A, a.Conv, a.DtBias, a.ALog, a.CuSeqlens, a.Q, a.K, a.V, a.Beta, a.G),
		Class: profilekeys.ClassOther}
}

// GatedDeltaPrepBackwardCost is Optional.GatedDeltaPrepBackward (class other): the recomputed
// conv and the input and filter products (6 FLOPs per tap) and about 16 for the SiLU and the
// norm per element of Mixed, 12 per gate; the inputs and the forward's operands read, DMixed,
// DB and DA written, the gradients read and written.
func GatedDeltaPrepBackwardCost(a GatedDeltaPrepBackwardArgs) Cost {
	l := elems(a.Conv) / int64(max(2*a.KH*a.KD+a.VH*a.VD, 1))
	return Cost{FLOPs: elems(a.Mixed)*(6*l+16) + 12*elems(a.DBeta),
		Bytes: sizes(a.Mixed, a.B, a.A, a.Conv, a.DtBias, a.ALog, a.CuSeqlens, a.DQ, a.DK, a.DV, a.DBeta, a.DG,
			a.DMixed, a.DB, a.DA) + 2*sizes(a.GConv, a.GDtBias, a.GALog),
		Class: profilekeys.ClassOther}
}

// GatedRMSNormCost is Optional.GatedRMSNorm (class norm): 8 FLOPs per element (the square, the
// scale, the weight and the SiLU gate); X, Z and Weight read, Out and RStd written.
func GatedRMSNormCost(a GatedRMSNormArgs) Cost {
	return Cost{FLOPs: 8 * elems(a.X), Bytes: sizes(a.X, a.Z, a.Weight, a.Out, a.RStd), Class: profilekeys.ClassNorm}
}

// GatedRMSNormBackwardCost is Optional.GatedRMSNormBackward (class norm): 16 FLOPs per element;
// DOut, X, Z, Weight and RStd read, DX and DZ written, GWeight read and written.
func GatedRMSNormBackwardCost(a GatedRMSNormBackwardArgs) Cost {
	return Cost{FLOPs: 16 * elems(a.X), Bytes: sizes(a.DOut, a.X, a.Z, a.Weight, a.RStd, a.DX, a.DZ) + 2*sizes(a.GWeight),
		Class: profilekeys.ClassNorm}
}
