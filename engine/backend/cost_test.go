package backend

import (
	"go/ast"
	"go/parser"
	"go/token"
	"reflect"
	"testing"

	"github.com/halo-shell/halo-shell/engine/tensor"
	"github.com/halo-shell/halo-shell/internal/profilekeys"
)

// shapeOnly is a buffer with room for any tensor and no memory: the cost table reads shapes and
// dtypes only. Each tensor gets its own (id), so that no two overlap.
type shapeOnly struct{ id int }

func (shapeOnly) Len() int64     { return 1 << 62 }
func (shapeOnly) Device() string { return "none" }

var shapeOnlyIDs int

func sh(t *testing.T, dt tensor.DType, shape ...int) T {
	t.Helper()
	shapeOnlyIDs++
	x, err := tensor.New(shapeOnly{shapeOnlyIDs}, 0, dt, shape...)
	if err != nil {
		t.Fatal(err)
	}
	return x
}

// TestCostTable checks the table on the shapes it is quoted at (Qwen3-0.6B: 16384 tokens,
// C=1024, 16 query heads of 128, F=3072, V=151936, bf16) and on small ones, against numbers
// worked out by hand in the comments.
func TestCostTable(t *testing.T) {
	const (
		bf, f32, i32 = tensor.BF16, tensor.F32, tensor.I32
		N, C, F, V   = 16384, 1024, 3072, 151936
		NC           = N * C * 2 // bytes of a bf16 [N,C]: 33554432
	)
	x, out, res, dx := sh(t, bf, N, C), sh(t, bf, N, C), sh(t, bf, N, C), sh(t, bf, N, C)
	q, dy := sh(t, bf, N, 2048), sh(t, bf, N, 2048)
	wq, dwq, bq := sh(t, bf, 2048, C), sh(t, bf, 2048, C), sh(t, bf, 2048)
	nw, dnw, rstd := sh(t, bf, C), sh(t, bf, C), sh(t, f32, N)
	gate, up, act, dg, du := sh(t, bf, N, F), sh(t, bf, N, F), sh(t, bf, N, F), sh(t, bf, N, F), sh(t, bf, N, F)
	ids, pos, inv := sh(t, i32, N), sh(t, i32, N), sh(t, f32, 64)
	emb, demb := sh(t, bf, V, C), sh(t, f32, V, C)
	cu := sh(t, i32, 5)
	lse := sh(t, f32, N, 16)
	k, v, dk, dv := sh(t, bf, N, 1024), sh(t, bf, N, 1024), sh(t, bf, N, 1024), sh(t, bf, N, 1024)
	small := func(dt tensor.DType, shape ...int) T { return sh(t, dt, shape...) }
	attnShape := AttentionShape{CuSeqlens: cu, NH: 16, NKV: 8, HD: 128}
	pairs := CausalPairs([]int32{0, 4096, 8192, 12288, 16384}, 0) // 4 * 4096*4097/2 = 33562624
	p, g, m, vv, shadow := small(f32, 1000), small(bf, 1000), small(f32, 1000), small(f32, 1000), small(bf, 1000)
	ga, gb, gc := small(f32, 32, 128), small(f32, 32, 64), small(f32, 128, 64)
	for _, tc := range []struct {
		name string
		got  Cost
		want Cost
	}{
		// 2*16384*2048*1024 = 2^36; bytes 2*(16384*2048 + 16384*1024 + 2048*1024).
		{"Linear q_proj", LinearCost(q, x, wq, T{}), Cost{68719476736, 104857600, profilekeys.ClassMatmul}},
		// plus 16384*2048 bias additions and the 4096-byte bias.
		{"Linear q_proj with bias", LinearCost(q, x, wq, bq), Cost{68719476736 + 33554432, 104857600 + 4096, profilekeys.ClassMatmul}},
		// dX and dW 2^36 each; DY 2^26 + W 2^22 + DX 2^25 + X 2^25 + DW read and written 2*2^22.
		{"LinearBackward dX dW", LinearBackwardCost(LinearBackwardArgs{DX: dx, DW: dwq, DY: dy, X: x, W: wq}), Cost{137438953472, 146800640, profilekeys.ClassMatmul}},
		// AccumulateDX reads DX too (+2^25); DB adds 16384*2048 additions and reads and writes 4096 bytes.
		{"LinearBackward dX+= dW dB", LinearBackwardCost(LinearBackwardArgs{DX: dx, DW: dwq, DB: bq, DY: dy, X: x, W: wq, AccumulateDX: true}),
			Cost{137438953472 + 33554432, 146800640 + 33554432 + 8192, profilekeys.ClassMatmul}},
		// dW only: neither W nor DX is touched.
		{"LinearBackward dW only", LinearBackwardCost(LinearBackwardArgs{DW: dwq, DY: dy, X: x}), Cost{68719476736, 67108864 + 33554432 + 8388608, profilekeys.ClassMatmul}},
		// op(A) = A^T [128,32], B [32,64], C [128,64]: 2*128*64*32; (4096+2048+8192)*4, C read again (Beta 1).
		{"GEMM TransA Beta=1", GEMMCost(GEMMArgs{A: ga, B: gb, C: gc, TransA: true, Alpha: 1, Beta: 1}), Cost{524288, 57344 + 32768, profilekeys.ClassMatmul}},
		// 4 FLOPs per element; x and out 2*2^25, w 2048, rstd 65536.
		{"RMSNorm", RMSNormCost(out, rstd, x, nw), Cost{67108864, 67176448, profilekeys.ClassNorm}},
		// 8 per element; DY, X, DX 3*2^25 + W 2048 + RStd 65536 + DW read and written 4096.
		{"RMSNormBackward", RMSNormBackwardCost(RMSNormBackwardArgs{DX: dx, DW: dnw, DY: out, X: x, W: nw, RStd: rstd}), Cost{134217728, 100734976, profilekeys.ClassNorm}},
		{"RMSNormBackward dX+=", RMSNormBackwardCost(RMSNormBackwardArgs{DX: dx, DW: dnw, DY: out, X: x, W: nw, RStd: rstd, AccumulateDX: true}), Cost{134217728, 100734976 + NC, profilekeys.ClassNorm}},
		// 5 per element; x, residual read, residual and out written: 4*2^25, + w 2048 + rstd 65536.
		{"AddRMSNorm in place", AddRMSNormCost(res, out, rstd, x, res, nw), Cost{83886080, 134285312, profilekeys.ClassNorm}},
		// 3 per element of [16384, 2048]; x and out 2*2^26, positions 65536, inv_freq 256.
		{"RoPE q", RoPECost(q, q, RoPEArgs{Positions: pos, InvFreq: inv, Heads: 16, HeadDim: 128}), Cost{100663296, 134283520, profilekeys.ClassRoPE}},
		{"RoPEBackward q", RoPEBackwardCost(dy, q, RoPEArgs{Positions: pos, InvFreq: inv, Heads: 16, HeadDim: 128}), Cost{100663296, 134283520, profilekeys.ClassRoPE}},
		// 33562624 pairs * 16 heads * 4*128; Q, Out 2*2^26, K, V 2*2^25, LSE 2^20, cu 20.
		{"Attention 4x4096", AttentionCost(AttentionArgs{AttentionShape: attnShape, Out: q, LSE: lse, Q: q, K: k, V: v}, pairs), Cost{274945015808, 202375188, profilekeys.ClassAttention}},
		// 2.5x the forward; dQ, dOut, Q, Out 4*2^26, dK, dV, K, V 4*2^25, LSE 2^20, cu 20.
		{"AttentionBackward 4x4096", AttentionBackwardCost(AttentionBackwardArgs{AttentionShape: attnShape, DQ: dy, DK: dk, DV: dv, DOut: dy, Q: q, K: k, V: v, Out: q, LSE: lse}, pairs),
			Cost{687362539520, 403701780, profilekeys.ClassAttention}},
		{"Attention, pairs unknown", AttentionCost(AttentionArgs{AttentionShape: attnShape, Out: q, LSE: lse, Q: q, K: k, V: v}, 0), Cost{0, 202375188, profilekeys.ClassAttention}},
		// 5 and 10 per element of [16384, 3072] (50331648); 3 and 5 tensors of 100663296 bytes.
		{"SwiGLU", SwiGLUCost(act, gate, up), Cost{251658240, 301989888, profilekeys.ClassMLPActivation}},
		{"SwiGLUBackward", SwiGLUBackwardCost(dg, du, act, gate, up), Cost{503316480, 503316480, profilekeys.ClassMLPActivation}},
		// 3 GEMMs of 2*16384*151936*1024; hidden 2^25 + weight 311164928 + targets, loss 65536 each
		// + dHidden 2^25 + dWeight read and written 2*311164928.
		{"CrossEntropy fwd+bwd", CrossEntropyCost(CrossEntropyArgs{Hidden: x, Weight: emb, Targets: ids, Loss: rstd, DHidden: dx, DWeight: emb}), Cost{15294378541056, 1000734720, profilekeys.ClassLoss}},
		{"CrossEntropy fwd", CrossEntropyCost(CrossEntropyArgs{Hidden: x, Weight: emb, Targets: ids, Loss: rstd}), Cost{5098126180352, 33554432 + 311164928 + 2*65536, profilekeys.ClassLoss}},
		// ids 65536, 16384 bf16 rows of 1024 read 2^25, out 2^25.
		{"Embedding", EmbeddingCost(out, emb, ids), Cost{0, 67174400, profilekeys.ClassEmbedding}},
		// an addition per element of dOut; dOut 2^25 + ids 65536 + f32 rows read and written 2*2^26.
		{"EmbeddingBackward", EmbeddingBackwardCost(demb, out, ids), Cost{16777216, 167837696, profilekeys.ClassEmbedding}},
		// 12 per element; param, m, v f32 read and written 2*3*4000, grad and shadow bf16 2000 each.
		{"AdamW master", AdamWCost(AdamWArgs{Param: p, Grad: g, M: m, V: vv, Shadow: shadow}), Cost{12000, 28000, profilekeys.ClassOptimizer}},
		{"SumSquares", SumSquaresCost([]T{small(f32, 10), small(bf, 4, 8)}), Cost{84, 104, profilekeys.ClassOptimizer}},
		{"Add", AddCost(small(f32, 10), small(f32, 10), small(f32, 10)), Cost{10, 120, profilekeys.ClassOther}},
		{"Axpy", AxpyCost(small(f32, 10), small(bf, 10)), Cost{20, 100, profilekeys.ClassOther}},
		{"Scale", ScaleCost(small(f32, 10)), Cost{10, 80, profilekeys.ClassOther}},
		{"ScaleRows", ScaleRowsCost(small(f32, 4, 8), small(f32, 4)), Cost{32, 272, profilekeys.ClassOther}},
		{"RowDot", RowDotCost(small(f32, 4), small(f32, 4, 8), small(f32, 4, 8)), Cost{64, 272, profilekeys.ClassOther}},
		{"Fill", FillCost(small(f32, 10)), Cost{0, 40, profilekeys.ClassOther}},
		{"Copy", CopyCost(small(bf, 10), small(f32, 10)), Cost{0, 60, profilekeys.ClassOther}},
		{"Transfer", TransferCost(100), Cost{0, 100, profilekeys.ClassOther}},
		// 4096x4096 NF4: a multiply per element (2^24); out 2^25, packed 2^23, f32 absmax 4*2^18.
		{"DequantNF4", DequantNF4Cost(DequantNF4Args{Out: small(bf, 4096, 4096), Packed: small(tensor.U8, 1<<23), Absmax: small(f32, 1<<18)}),
			Cost{16777216, 42991616, profilekeys.ClassOther}},
		// nested: 2 more per block (2^18); u8 codes 2^18, nested absmax 4*1024, map 4*256.
		{"DequantNF4 nested", DequantNF4Cost(DequantNF4Args{Out: small(bf, 4096, 4096), Packed: small(tensor.U8, 1<<23),
			Absmax: small(tensor.U8, 1<<18), NestedAbsmax: small(f32, 1024), NestedMap: small(f32, 256)}),
			Cost{17301504, 42210304, profilekeys.ClassOther}},
		// a bf16 [4096, 2560] input and output: 2^20*10 elements, 2 bytes each, read and written.
		{"Dropout", DropoutCost(DropoutArgs{Out: small(bf, 4096, 2560), X: small(bf, 4096, 2560), P: 0.1}),
			Cost{10485760, 41943040, profilekeys.ClassOther}},
	} {
		if tc.got != tc.want {
			t.Errorf("%s: %+v, want %+v", tc.name, tc.got, tc.want)
		}
	}
}

// TestMoECostTable checks the mixture-of-experts rows at a Qwen3-30B-A3B-like layer: N=4096
// tokens, C=2048, E=128 experts, top-8 (S=32768 slots), expert width I=768, bf16 activations.
func TestMoECostTable(t *testing.T) {
	const (
		bf, f32, i32        = tensor.BF16, tensor.F32, tensor.I32
		N, C, E, K, I, S, G = 4096, 2048, 128, 8, 768, 4096 * 8, 128
	)
	xs, x, gu, act := sh(t, bf, S, C), sh(t, bf, N, C), sh(t, bf, S, 2*I), sh(t, bf, S, I)
	wgu, dwgu := sh(t, bf, E, 2*I, C), sh(t, f32, E, 2*I, C)
	off := sh(t, i32, G+1)
	logits, probs, dlogits := sh(t, bf, N, E), sh(t, f32, N, E), sh(t, bf, N, E)
	sel, wts, dwts, slot := sh(t, i32, N, K), sh(t, f32, N, K), sh(t, f32, N, K), sh(t, i32, N, K)
	bias, counts, psum, aux := sh(t, f32, E), sh(t, i32, E), sh(t, f32, E), sh(t, f32, E)
	order, dx, out := sh(t, i32, S), sh(t, f32, N, C), sh(t, bf, N, C)
	for _, tc := range []struct {
		name string
		got  Cost
		want Cost
	}{
		// 2*S*2I*C; A 2^28/2 + B 128*1536*2048*2 + Out S*1536*2 + offsets 129*4.
		{"GroupedGEMM gate_up forward", GroupedGEMMCost(GroupedGEMMArgs{Kind: GroupedForward, A: xs, B: wgu, Out: gu, Offsets: off}),
			Cost{206158430208, 1040187908, profilekeys.ClassExpertGEMM}},
		// The same FLOPs; dY and X read, the f32 [E,2I,C] gradient read and written, offsets.
		{"GroupedGEMM gate_up weight grad +=", GroupedGEMMCost(GroupedGEMMArgs{Kind: GroupedWeightGrad, A: gu, B: xs, Out: dwgu, Offsets: off, Accumulate: true}),
			Cost{206158430208, 3456107012, profilekeys.ClassExpertGEMM}},
		// Invalid shapes count no FLOPs but keep their bytes.
		{"GroupedGEMM bad shapes", GroupedGEMMCost(GroupedGEMMArgs{Kind: GroupedForward, A: x, B: wgu, Out: gu}), Cost{0, 16777216 + 805306368 + 100663296, profilekeys.ClassExpertGEMM}},
		// 8 per logit of [4096,128]; logits 2^20, bias, probs 2^21, sel, weights 2^17 each,
		// counts read and written 2*512, probsum 512.
		{"MoERoute", MoERouteCost(MoERouteArgs{Logits: logits, Bias: bias, Probs: probs, Sel: sel, Weights: wts, Counts: counts, ProbSum: psum}),
			Cost{4194304, 3409920, profilekeys.ClassRouter}},
		// 4 per probability; probs 2^21, sel, weights, dweights 2^17 each, aux 512, dlogits 2^20.
		{"MoERouteBackward", MoERouteBackwardCost(MoERouteBackwardArgs{Probs: probs, Sel: sel, Weights: wts, DWeights: dwts, AuxGrad: aux, DLogits: dlogits}),
			Cost{2097152, 3539456, profilekeys.ClassRouter}},
		// sel 2^17, one bf16 row of X per slot 2^27, offsets 516, order and slot 2^17 each, Xs 2^27.
		{"MoEPermute", MoEPermuteCost(MoEPermuteArgs{E: E, Sel: sel, X: x, Offsets: off, Order: order, Slot: slot, Xs: xs}),
			Cost{0, 268829188, profilekeys.ClassPermute}},
		// an addition per element of dXs (2^26); dXs 2^27, slot 2^17, f32 dX read and written 2*2^25.
		{"MoEPermuteBackward +=", MoEPermuteBackwardCost(MoEPermuteBackwardArgs{DXs: xs, Slot: slot, DX: dx, Accumulate: true}),
			Cost{67108864, 201457664, profilekeys.ClassPermute}},
		// a multiply-add per element of Ys; Ys 2^27, slot and weights 2^17 each, out 2^24.
		{"MoECombine", MoECombineCost(MoECombineArgs{Ys: xs, Slot: slot, Weights: wts, Out: out}), Cost{134217728, 151257088, profilekeys.ClassCombine}},
		// 3 per element of Ys; dOut 2^24, Ys and dYs 2^27 each, slot, weights, dweights 2^17 each.
		{"MoECombineBackward", MoECombineBackwardCost(MoECombineBackwardArgs{DOut: out, Ys: xs, Slot: slot, Weights: wts, DYs: xs, DWeights: dwts}),
			Cost{201326592, 285605888, profilekeys.ClassCombine}},
		// 5 and 10 per element of [S, I] (25165824); out S*I*2 + gateUp S*2I*2.
		{"SwiGLUPacked", SwiGLUPackedCost(act, gu), Cost{125829120, 150994944, profilekeys.ClassMLPActivation}},
		{"SwiGLUPackedBackward in place", SwiGLUPackedBackwardCost(gu, act, gu), Cost{251658240, 251658240, profilekeys.ClassMLPActivation}},
		// GeGLU's 12 and 20 per element of [S, I], the same bytes.
		{"GeGLUPacked", GeGLUPackedCost(act, gu), Cost{301989888, 150994944, profilekeys.ClassMLPActivation}},
		{"GeGLUPackedBackward in place", GeGLUPackedBackwardCost(gu, act, gu), Cost{503316480, 251658240, profilekeys.ClassMLPActivation}},
	} {
		if tc.got != tc.want {
			t.Errorf("%s: %+v, want %+v", tc.name, tc.got, tc.want)
		}
	}
}

func TestCausalPairs(t *testing.T) {
	for _, tc := range []struct {
		cu     []int32
		window int
		want   int64
	}{
		{[]int32{0, 10}, 0, 55},
		// Window 3: queries 0, 1, 2 see 1+2+3 keys, queries 3..9 see 3 each: 6 + 21.
		{[]int32{0, 10}, 3, 27},
		// A second document of 2 tokens, shorter than the window: 3 more.
		{[]int32{0, 10, 12}, 3, 30},
		{[]int32{0, 10, 12}, 0, 58},
		{[]int32{0}, 0, 0},
		{nil, 0, 0},
	} {
		if got := CausalPairs(tc.cu, tc.window); got != tc.want {
			t.Errorf("CausalPairs(%v, %d) = %d, want %d", tc.cu, tc.window, got, tc.want)
		}
	}
}

func TestTrainingFLOPsPerToken(t *testing.T) {
	// 6*1000 + 6*2*16*(4*8) = 6000 + 6144.
	if got := TrainingFLOPsPerToken(1000, 2, 16, 4, 8); got != 12144 {
		t.Errorf("TrainingFLOPsPerToken = %v, want 12144", got)
	}
	// The Qwen3-0.6B shape (28 layers, 16 query heads of 128) at 4096 tokens, 596049920
	// parameters: 6*596049920 + 6*28*4096*2048.
	if got, want := TrainingFLOPsPerToken(596049920, 28, 4096, 16, 128), 6*596049920.0+6*28*4096*2048.0; got != want {
		t.Errorf("TrainingFLOPsPerToken(Qwen3-0.6B) = %v, want %v", got, want)
	}
}

// TestEveryOpHasACost: each method of Ops and each fused op of Optional has its function
// <Op>Cost in cost.go, so that a new op cannot reach the profiler without a row of the table.
func TestEveryOpHasACost(t *testing.T) {
	f, err := parser.ParseFile(token.NewFileSet(), "cost.go", nil, parser.SkipObjectResolution)
	if err != nil {
		t.Fatal(err)
	}
	have := map[string]bool{}
	for _, d := range f.Decls {
		if fd, ok := d.(*ast.FuncDecl); ok && fd.Recv == nil {
			have[fd.Name.Name] = true
		}
	}
	var ops []string
	for ot, i := reflect.TypeFor[Ops](), 0; i < ot.NumMethod(); i++ {
		ops = append(ops, ot.Method(i).Name)
	}
	for ot, i := reflect.TypeFor[Optional](), 0; i < ot.NumField(); i++ {
		if f := ot.Field(i); f.Type.Kind() == reflect.Func {
			ops = append(ops, f.Name)
		}
	}
	for _, op := range ops {
		if !have[op+"Cost"] {
			t.Errorf("cost.go has no %sCost for the op %s", op, op)
		}
	}
}
