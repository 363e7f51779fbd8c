package cuda

import (
	"errors"
	"fmt"
	"unsafe"
)

// Gemm describes C = Alpha·op(A)·op(B) + Beta·C (+ Bias on every row) in row-major terms:
// op(A) is M×K, op(B) is K×N, C is M×N. A and B hold bf16; C holds bf16, or fp32 when OutF32.
// Accumulation is fp32. With TransA, A is stored K×M; with TransB, B is stored N×K (the usual
// layout of a linear layer's weight, so y = x·Wᵀ is TransB). Batch > 1 runs Batch products with
// element strides StrideA, StrideB, StrideC between consecutive matrices.
type Gemm struct {
	M, N, K        int
	TransA, TransB bool
	A, B, C        *Buffer
	// Bias, optional, is a length-N vector of C's type added to every row.
	Bias        *Buffer
	Alpha, Beta float32
	OutF32      bool
	// InF32 says A and B hold fp32 instead of bf16.
	InF32                     bool
	Batch                     int
	StrideA, StrideB, StrideC int64
}

type gemmKey struct {
	m, n, k, batch            int
	align                     [3]uint32
	transA, transB, outF32    bool
	inF32                     bool
	bias                      bool
	strideA, strideB, strideC int64
}

// gemmPlan is the cuBLASLt descriptors and chosen algorithm for one shape.
type gemmPlan struct {
	desc, a, b, c uintptr
	algo          ltHeuristicResult
	// tune is how algo was chosen (gemm_tune.go).
	tune gemmTuneResult
}

type gemmState struct {
	handle    uintptr
	workspace *Buffer
	plans     map[gemmKey]*gemmPlan
	// tune says when a new key's algorithm is timed; events are reused by every tuning.
	tune   gemmTuneConfig
	events []uintptr
}

const gemmWorkspaceBytes = 32 << 20

func (g *gemmState) close(d *Device) error {
	lt := d.libs.lt
	var errs []error
	for _, p := range g.plans {
		errs = append(errs, p.destroy(lt))
	}
	for _, e := range g.events {
		errs = append(errs, d.drv.check("cuEventDestroy_v2", d.drv.cuEventDestroy(e)))
	}
	errs = append(errs, lt.check("cublasLtDestroy", lt.cublasLtDestroy(g.handle)))
	return errors.Join(errs...)
}

func (p *gemmPlan) destroy(lt *cublasLtAPI) error {
	var errs []error
	if p.desc != 0 {
		errs = append(errs, lt.check("cublasLtMatmulDescDestroy", lt.cublasLtMatmulDescDestroy(p.desc)))
	}
	for _, l := range []uintptr{p.a, p.b, p.c} {
		if l != 0 {
			errs = append(errs, lt.check("cublasLtMatrixLayoutDestroy", lt.cublasLtMatrixLayoutDestroy(l)))
		}
	}
	return errors.Join(errs...)
}

func (g *Gemm) validate() error {
	if g.M <= 0 || g.N <= 0 || g.K <= 0 {
		return fmt.Errorf("cuda: gemm: dimensions M=%d N=%d K=%d must be positive", g.M, g.N, g.K)
	}
	if g.A == nil || g.B == nil || g.C == nil {
		return errors.New("cuda: gemm: A, B and C are required")
	}
	batch := max(g.Batch, 1)
	outSize := uint64(2)
	if g.OutF32 {
		outSize = 4
	}
	need := func(name string, b *Buffer, elems, stride int64, size uint64) error {
		n := (int64(batch-1)*stride + elems) * int64(size)
		if uint64(n) > b.bytes {
			return fmt.Errorf("cuda: gemm %dx%dx%d (batch %d): %s needs %d bytes, buffer has %d", g.M, g.N, g.K, batch, name, n, b.bytes)
		}
		return nil
	}
	inSize := uint64(2)
	if g.InF32 {
		inSize = 4
	}
	if err := need("A", g.A, int64(g.M)*int64(g.K), g.StrideA, inSize); err != nil {
		return err
	}
	if err := need("B", g.B, int64(g.K)*int64(g.N), g.StrideB, inSize); err != nil {
		return err
	}
	if err := need("C", g.C, int64(g.M)*int64(g.N), g.StrideC, outSize); err != nil {
		return err
	}
	if g.Bias != nil {
		if err := need("Bias", g.Bias, int64(g.N), 0, outSize); err != nil {
			return err
		}
	}
	return nil
}

// Matmul runs g on the device's stream. The first call of a shape (plan key: dimensions,
// transposes, dtypes, bias, strides, operand alignments) chooses its algorithm, timing cuBLASLt's
// candidates on g's operands when the GEMM is large enough, and then waits once for the GPU
// (counted as "GEMMTune" in Syncs); later calls of the shape never wait (gemm_tune.go).
func (d *Device) Matmul(g Gemm) error {
	if err := g.validate(); err != nil {
		return err
	}
	return d.Post(func() error { return d.matmulOnThread(&g) })
}

func (d *Device) gemmStateOnThread() (*gemmState, error) {
	if d.gemm != nil {
		return d.gemm, nil
	}
	lt := d.libs.lt
	if lt == nil || lt.info.Err != "" {
		return nil, fmt.Errorf("cuda: GEMMs need cuBLASLt: %v", d.libs.opsErr)
	}
	tune, err := loadGemmTuneConfig()
	if err != nil {
		return nil, err
	}
	g := &gemmState{plans: map[gemmKey]*gemmPlan{}, tune: tune}
	if err := lt.check("cublasLtCreate", lt.cublasLtCreate(&g.handle)); err != nil {
		return nil, err
	}
	ws, err := d.allocOnThread(gemmWorkspaceBytes)
	if err != nil {
		lt.cublasLtDestroy(g.handle)
		return nil, err
	}
	g.workspace = ws
	d.gemm = g
	return g, nil
}

// planOnThread builds the descriptors for a shape and chooses its algorithm, once per key: the
// heuristic's candidates are timed on g's operands when the GEMM is large enough (gemm_tune.go),
// which makes the host wait once; later calls of the key find the plan and never wait.
func (d *Device) planOnThread(gs *gemmState, g *Gemm) (*gemmPlan, error) {
	batch := max(g.Batch, 1)
	key := gemmKey{g.M, g.N, g.K, batch, g.alignments(), g.TransA, g.TransB, g.OutF32, g.InF32, g.Bias != nil, g.StrideA, g.StrideB, g.StrideC}
	if p, ok := gs.plans[key]; ok {
		return p, nil
	}
	lt := d.libs.lt
	p := &gemmPlan{}
	fail := func(err error) (*gemmPlan, error) {
		p.destroy(lt)
		return nil, fmt.Errorf("cuda: gemm M=%d N=%d K=%d transA=%v transB=%v: %w", g.M, g.N, g.K, g.TransA, g.TransB, err)
	}
	// Row-major C = op(A)·op(B) is column-major Cᵀ = op(B)ᵀ·op(A)ᵀ: cuBLASLt's "A" is our B.
	if err := lt.check("cublasLtMatmulDescCreate", lt.cublasLtMatmulDescCreate(&p.desc, cublasCompute32F, cudaR32F)); err != nil {
		return fail(err)
	}
	setDesc := func(attr int32, v int32) error {
		return lt.check("cublasLtMatmulDescSetAttribute", lt.cublasLtMatmulDescSetAttribute(p.desc, attr, unsafe.Pointer(&v), 4))
	}
	opA, opB := int32(cublasOpN), int32(cublasOpN)
	// cuBLASLt A = our B, stored row-major K×N (col-major N×K, ld N) or, with TransB, N×K
	// (col-major K×N, ld K, transposed).
	aRows, aCols, lda := g.N, g.K, g.N
	if g.TransB {
		opA, aRows, aCols, lda = cublasOpT, g.K, g.N, g.K
	}
	// cuBLASLt B = our A, stored M×K (col-major K×M, ld K) or, with TransA, K×M.
	bRows, bCols, ldb := g.K, g.M, g.K
	if g.TransA {
		opB, bRows, bCols, ldb = cublasOpT, g.M, g.K, g.M
	}
	if err := setDesc(ltDescTransA, opA); err != nil {
		return fail(err)
	}
	if err := setDesc(ltDescTransB, opB); err != nil {
		return fail(err)
	}
	if g.Bias != nil {
		if err := setDesc(ltDescEpilogue, ltEpilogueBias); err != nil {
			return fail(err)
		}
		bp := g.Bias.ptr
		if err := lt.check("set bias pointer", lt.cublasLtMatmulDescSetAttribute(p.desc, ltDescBiasPointer, unsafe.Pointer(&bp), 8)); err != nil {
			return fail(err)
		}
	}
	outType := int32(cudaR16BF)
	if g.OutF32 {
		outType = cudaR32F
	}
	mk := func(l *uintptr, dt int32, rows, cols, ld int, stride int64) error {
		if err := lt.check("cublasLtMatrixLayoutCreate", lt.cublasLtMatrixLayoutCreate(l, dt, uint64(rows), uint64(cols), int64(ld))); err != nil {
			return err
		}
		if batch > 1 {
			b := int32(batch)
			if err := lt.check("set batch count", lt.cublasLtMatrixLayoutSetAttribute(*l, ltLayoutBatchCount, unsafe.Pointer(&b), 4)); err != nil {
				return err
			}
			if err := lt.check("set batch stride", lt.cublasLtMatrixLayoutSetAttribute(*l, ltLayoutBatchStride, unsafe.Pointer(&stride), 8)); err != nil {
				return err
			}
		}
		return nil
	}
	inType := int32(cudaR16BF)
	if g.InF32 {
		inType = cudaR32F
	}
	if err := mk(&p.a, inType, aRows, aCols, lda, g.StrideB); err != nil {
		return fail(err)
	}
	if err := mk(&p.b, inType, bRows, bCols, ldb, g.StrideA); err != nil {
		return fail(err)
	}
	if err := mk(&p.c, outType, g.N, g.M, g.N, g.StrideC); err != nil {
		return fail(err)
	}
	var pref uintptr
	if err := lt.check("cublasLtMatmulPreferenceCreate", lt.cublasLtMatmulPreferenceCreate(&pref)); err != nil {
		return fail(err)
	}
	defer lt.cublasLtMatmulPreferenceDestroy(pref)
	ws := uint64(gemmWorkspaceBytes)
	if err := lt.check("set max workspace", lt.cublasLtMatmulPreferenceSetAttribute(pref, ltPrefMaxWorkspace, unsafe.Pointer(&ws), 8)); err != nil {
		return fail(err)
	}
	// The heuristic cannot see the pointers: tell it how they are aligned (our B is its A).
	al := g.alignments()
	for i, attr := range []int32{ltPrefMinAlignB, ltPrefMinAlignA, ltPrefMinAlignC, ltPrefMinAlignD} {
		v := al[min(i, 2)]
		if err := lt.check("set min alignment", lt.cublasLtMatmulPreferenceSetAttribute(pref, attr, unsafe.Pointer(&v), 4)); err != nil {
			return fail(err)
		}
	}
	// Split-K reductions must accumulate in fp32, not in the (bf16) output: the contract rounds
	// results to the output dtype once.
	mask := uint32(ltReductionComputeType)
	if err := lt.check("set reduction scheme", lt.cublasLtMatmulPreferenceSetAttribute(pref, ltPrefReductionMask, unsafe.Pointer(&mask), 4)); err != nil {
		return fail(err)
	}
	// A GEMM too small to time needs only the heuristic's first choice.
	want := gs.tune.Candidates
	if gemmFLOPs(g) < gs.tune.MinFLOPs {
		want = 1
	}
	results, err := d.gemmCandidatesOnThread(gs, p, pref, want)
	if err != nil {
		return fail(err)
	}
	if len(results) == 0 {
		// No algorithm without an output-typed split-K: let cuBLASLt choose freely.
		mask = 7
		if err := lt.check("set reduction scheme", lt.cublasLtMatmulPreferenceSetAttribute(pref, ltPrefReductionMask, unsafe.Pointer(&mask), 4)); err != nil {
			return fail(err)
		}
		if results, err = d.gemmCandidatesOnThread(gs, p, pref, want); err != nil {
			return fail(err)
		}
	}
	if len(results) == 0 {
		return fail(errors.New("cuBLASLt has no algorithm for this shape and alignment"))
	}
	if err := d.tuneOnThread(gs, p, g, results); err != nil {
		return fail(err)
	}
	gs.plans[key] = p
	return p, nil
}

// alignments returns the byte alignment (a power of two, at most 256) of A, B and C.
func (g *Gemm) alignments() [3]uint32 {
	var out [3]uint32
	for i, b := range []*Buffer{g.A, g.B, g.C} {
		a := uint32(256)
		for a > 1 && b.ptr%uintptr(a) != 0 {
			a >>= 1
		}
		out[i] = a
	}
	return out
}

func (d *Device) matmulOnThread(g *Gemm) error {
	gs, err := d.gemmStateOnThread()
	if err != nil {
		return err
	}
	p, err := d.planOnThread(gs, g)
	if err != nil {
		return err
	}
	if g.Bias != nil {
		// The bias pointer lives in the descriptor; refresh it for this call.
		bp := g.Bias.ptr
		if err := d.libs.lt.check("set bias pointer", d.libs.lt.cublasLtMatmulDescSetAttribute(p.desc, ltDescBiasPointer, unsafe.Pointer(&bp), 8)); err != nil {
			return err
		}
	}
	alpha, beta := g.Alpha, g.Beta
	lt := d.libs.lt
	st := lt.cublasLtMatmul(gs.handle, p.desc, unsafe.Pointer(&alpha), g.B.ptr, p.a, g.A.ptr, p.b, unsafe.Pointer(&beta),
		g.C.ptr, p.c, g.C.ptr, p.c, unsafe.Pointer(&p.algo.Algo), gs.workspace.ptr, gemmWorkspaceBytes, d.stream)
	if err := lt.check("cublasLtMatmul", st); err != nil {
		return fmt.Errorf("cuda: gemm M=%d N=%d K=%d: %w", g.M, g.N, g.K, err)
	}
	return nil
}
