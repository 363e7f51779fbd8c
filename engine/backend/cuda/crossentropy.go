package cuda

import (
	"fmt"
	"math"

	"github.com/halo-shell/halo-shell/engine/backend"
	"github.com/halo-shell/halo-shell/engine/tensor"
)

// Host launchers of kernels/crossentropy.cu: the fused LM head and cross-entropy, chunked over
// tokens so that the full logits are never materialised.

// CrossEntropy is the fused LM head and cross-entropy, chunked over tokens
// (backend.CrossEntropyChunkRows under backend.CrossEntropyBudget: multiples of 256 rows, at
// most 2 GiB of fp32 logits when the head trains, 512 MiB when it is frozen, and 1/32 of the
// device's memory cap when one is set). Scratch memory while it runs
// (backend.CrossEntropyScratch): the chunk's logits, bf16 for a bf16 head with the dlogits
// written over them (the default), or fp32 with dlogits in the weight's dtype beside them
// (HALO_CE_LOGITS=f32); and under HALO_CE_DWEIGHT=f32 with a bf16 DWeight an fp32 [V, C]
// accumulator (0.6 GiB for a 152k x 1024 head) added to DWeight once at the end, where by
// default each chunk's product is added into DWeight directly.
func (b *Backend) CrossEntropy(a backend.CrossEntropyArgs) error {
	const op = "CrossEntropy"
	if a.Weight.Rank() != 2 {
		return fmt.Errorf("cuda: %s: Weight %v must be [V, C]", op, a.Weight)
	}
	V, C := a.Weight.Dim(0), a.Weight.Dim(1)
	if a.Hidden.Rank() == 0 || a.Hidden.Dim(-1) != C {
		return fmt.Errorf("cuda: %s: Hidden %v must end in C=%d", op, a.Hidden, C)
	}
	N := a.Hidden.Numel() / C
	if a.Targets.Numel() != N {
		return fmt.Errorf("cuda: %s: Targets %v must have N=%d elements", op, a.Targets, N)
	}
	if _, err := gemmDType(op, a.Hidden, a.Weight); err != nil {
		return err
	}
	if !a.Loss.IsNil() && (a.Loss.DType() != tensor.F32 || a.Loss.Numel() != N) {
		return fmt.Errorf("cuda: %s: Loss %v must be f32 [%d]", op, a.Loss, N)
	}
	if !a.LogProb.IsNil() && (a.LogProb.DType() != tensor.F32 || a.LogProb.Numel() != N) {
		return fmt.Errorf("cuda: %s: LogProb %v must be f32 [%d]", op, a.LogProb, N)
	}
	if !(a.Softcap >= 0) || math.IsInf(float64(a.Softcap), 0) {
		return fmt.Errorf("cuda: %s: Softcap %v must be a positive cap or 0 for none", op, a.Softcap)
	}
	arg := b.args(op)
	pt := arg.i32("Targets", a.Targets)
	pLoss := arg.opt("Loss", a.Loss)
	pLP := arg.opt("LogProb", a.LogProb)
	if !a.TokenScale.IsNil() && (a.TokenScale.DType() != tensor.F32 || a.TokenScale.Numel() != N) {
		return fmt.Errorf("cuda: %s: TokenScale %v must be f32 [%d]", op, a.TokenScale, N)
	}
	pTS := arg.opt("TokenScale", a.TokenScale)
	if err := arg.err(); err != nil {
		return err
	}
	if !a.DHidden.IsNil() && (a.DHidden.Numel() != N*C || a.DHidden.DType() != a.Hidden.DType()) {
		return fmt.Errorf("cuda: %s: DHidden %v must match Hidden %v", op, a.DHidden, a.Hidden)
	}
	if !a.DWeight.IsNil() && a.DWeight.Numel() != V*C {
		return fmt.Errorf("cuda: %s: DWeight %v must be [%d, %d]", op, a.DWeight, V, C)
	}
	backward := !a.DHidden.IsNil() || !a.DWeight.IsNil()
	if N == 0 {
		return nil
	}
	// Uploaded targets are checked on the host; only targets made on the device need the flag.
	check, at, v := b.i32.checkRange(pt, N, int32(min(V, math.MaxInt32)), true)
	if check == i32Bad {
		return fmt.Errorf("cuda: %s: Targets[%d] = %d is outside the vocabulary [0, %d) and is not the ignore index %d", op, at, v, V, backend.IgnoreIndex)
	}
	rows := a.ChunkRows
	if rows <= 0 {
		rows = backend.CrossEntropyChunkRows(N, V, backend.CrossEntropyBudget(!a.DWeight.IsNil(), int64(b.d.alloc.memLimit())))
	}
	rows = min(rows, N)
	hidden2D, err := a.Hidden.Reshape(N, C)
	if err != nil {
		return err
	}
	var dHidden2D T
	if !a.DHidden.IsNil() {
		if dHidden2D, err = a.DHidden.Reshape(N, C); err != nil {
			return err
		}
	}
	var dWeight2D, dWeightAcc T
	foldDWeight := false
	if !a.DWeight.IsNil() {
		if dWeight2D, err = a.DWeight.Reshape(V, C); err != nil {
			return err
		}
		dWeightAcc = dWeight2D
		if a.DWeight.DType() != tensor.F32 && !backend.CrossEntropyDirectDWeight() {
			// Chunks accumulate into an fp32 [V, C] buffer that is added to DWeight once at the
			// end: one rounding to DWeight's dtype, and no per-chunk conversion pass. The first
			// chunk's product overwrites it, so it needs no zero fill.
			if dWeightAcc, err = b.allocScratch(tensor.F32, V, C); err != nil {
				return err
			}
			defer b.Free(dWeightAcc)
			foldDWeight = true
		}
	}
	// Chunk buffers, overwritten by each chunk: the logits (fp32, or bf16 for a bf16 head under
	// HALO_CE_LOGITS=bf16), and (backward) dlogits in the weight's dtype, in place of logits of
	// that dtype.
	logitsDT := tensor.F32
	if a.Weight.DType() == tensor.BF16 && backend.CrossEntropyBF16Logits() {
		logitsDT = tensor.BF16
	}
	logits, err := b.allocScratch(logitsDT, rows, V)
	if err != nil {
		return err
	}
	defer b.Free(logits)
	dlogits := logits
	if backward && a.Weight.DType() != logitsDT {
		if dlogits, err = b.allocScratch(a.Weight.DType(), rows, V); err != nil {
			return err
		}
		defer b.Free(dlogits)
	}
	pLogits, cLogits := arg.float("logits", logits)
	pDL, cDL := arg.float("dlogits", dlogits)
	if err := arg.err(); err != nil {
		return err
	}
	if check == i32Unknown {
		if err := b.d.Do(func() error { return b.resetFlagOnThread(int64(N)) }); err != nil {
			return err
		}
	}
	for r0 := 0; r0 < N; r0 += rows {
		r := min(rows, N-r0)
		h, err := hidden2D.Rows(r0, r0+r)
		if err != nil {
			return err
		}
		lg, _ := logits.Rows(0, r)
		if err := b.gemm(op, gemmCall{A: h, B: a.Weight, C: lg, M: r, N: V, K: C, TransB: true, Alpha: 1}); err != nil {
			return err
		}
		var dlp uintptr
		if backward {
			dlp = pDL
		}
		args := packArgs(pLogits, cLogits, pt, pLoss, pLP, dlp, cDL, a.GradScale, pTS, int64(r0), int32(V), int32(backend.IgnoreIndex), b.flagPtr(), a.Softcap)
		if err := b.d.Post(func() error {
			return b.d.launchOnThread("crossentropy.cu", "ce_rows", [3]uint32{uint32(r), 1, 1}, [3]uint32{512, 1, 1}, 0, args...)
		}); err != nil {
			return err
		}
		if !backward {
			continue
		}
		dl, _ := dlogits.Rows(0, r)
		if !dHidden2D.IsNil() {
			dh, _ := dHidden2D.Rows(r0, r0+r)
			if err := b.gemm(op, gemmCall{A: dl, B: a.Weight, C: dh, M: r, N: C, K: V, Alpha: 1}); err != nil {
				return err
			}
		}
		if !dWeightAcc.IsNil() {
			beta := float32(1)
			if foldDWeight && r0 == 0 {
				beta = 0 // the scratch accumulator starts with the first chunk's product
			}
			if err := b.gemm(op, gemmCall{A: dl, B: h, C: dWeightAcc, M: V, N: C, K: r, TransA: true, Alpha: 1, Beta: beta}); err != nil {
				return err
			}
		}
	}
	if foldDWeight {
		pdw, cdw := arg.float("DWeight", dWeight2D)
		pacc := arg.ptr("dWeightAcc", dWeightAcc)
		if err := arg.err(); err != nil {
			return err
		}
		if err := b.foldF32(dWeight2D, pdw, cdw, 1, pacc, 1); err != nil {
			return err
		}
	}
	if check == i32Valid {
		return nil
	}
	var bad int32
	if err := b.d.Do(func() error {
		var err error
		bad, err = b.readFlagOnThread()
		return err
	}); err != nil {
		return err
	}
	if int(bad) < N {
		tg, _ := a.Targets.View(int(bad), 1)
		v, _ := backend.ToInt32(b, tg)
		got := int32(0)
		if len(v) == 1 {
			got = v[0]
		}
		return fmt.Errorf("cuda: %s: Targets[%d] = %d is outside the vocabulary [0, %d) and is not the ignore index %d", op, bad, got, V, backend.IgnoreIndex)
	}
	return nil
}
