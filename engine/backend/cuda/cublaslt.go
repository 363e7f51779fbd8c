package cuda

import (
	"fmt"
	"unsafe"
)

// cublasLtAPI holds the cuBLASLt entry points used for GEMMs.
type cublasLtAPI struct {
	info LibraryInfo

	cublasLtCreate                       func(h *uintptr) int32
	cublasLtDestroy                      func(h uintptr) int32
	cublasLtGetVersion                   func() uint64
	cublasLtGetStatusString              func(s int32) string
	cublasLtMatmulDescCreate             func(d *uintptr, computeType int32, scaleType int32) int32
	cublasLtMatmulDescDestroy            func(d uintptr) int32
	cublasLtMatmulDescSetAttribute       func(d uintptr, attr int32, buf unsafe.Pointer, size uint64) int32
	cublasLtMatrixLayoutCreate           func(l *uintptr, dtype int32, rows, cols uint64, ld int64) int32
	cublasLtMatrixLayoutDestroy          func(l uintptr) int32
	cublasLtMatrixLayoutSetAttribute     func(l uintptr, attr int32, buf unsafe.Pointer, size uint64) int32
	cublasLtMatmulPreferenceCreate       func(p *uintptr) int32
	cublasLtMatmulPreferenceDestroy      func(p uintptr) int32
	cublasLtMatmulPreferenceSetAttribute func(p uintptr, attr int32, buf unsafe.Pointer, size uint64) int32
	cublasLtMatmulAlgoGetHeuristic       func(h, op, a, b, c, d, pref uintptr, requested int32, results unsafe.Pointer, returned *int32) int32
	cublasLtMatmul                       func(h, op uintptr, alpha unsafe.Pointer, a, adesc, b, bdesc uintptr, beta unsafe.Pointer, c, cdesc, d, ddesc uintptr, algo unsafe.Pointer, ws uintptr, wsSize uint64, stream uintptr) int32
}

// cuBLAS and CUDA data-type constants.
const (
	cudaR32F  = 0  // CUDA_R_32F
	cudaR16BF = 14 // CUDA_R_16BF

	cublasCompute32F = 68 // CUBLAS_COMPUTE_32F

	cublasOpN = 0
	cublasOpT = 1

	ltDescTransA      = 3 // CUBLASLT_MATMUL_DESC_TRANSA
	ltDescTransB      = 4 // CUBLASLT_MATMUL_DESC_TRANSB
	ltDescEpilogue    = 7 // CUBLASLT_MATMUL_DESC_EPILOGUE
	ltDescBiasPointer = 8 // CUBLASLT_MATMUL_DESC_BIAS_POINTER

	ltEpilogueDefault = 1 // CUBLASLT_EPILOGUE_DEFAULT
	ltEpilogueBias    = 4 // CUBLASLT_EPILOGUE_BIAS

	ltLayoutBatchCount  = 5 // CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT
	ltLayoutBatchStride = 6 // CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET
	ltPrefMaxWorkspace  = 1 // CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES
	ltPrefReductionMask = 3 // CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK
	ltPrefMinAlignA     = 5 // CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES (B, C, D follow)
	ltPrefMinAlignB     = 6
	ltPrefMinAlignC     = 7
	ltPrefMinAlignD     = 8

	ltReductionComputeType = 2 // CUBLASLT_REDUCTION_SCHEME_COMPUTE_TYPE
	ltHeuristicResultLen   = 96
)

// ltHeuristicResult mirrors cublasLtMatmulHeuristicResult_t (96 bytes).
type ltHeuristicResult struct {
	Algo          [8]uint64
	WorkspaceSize uint64
	State         int32
	WavesCount    float32
	Reserved      [4]int32
}

func loadCublasLt(env searchEnv) (*cublasLtAPI, error) {
	h, info, err := openLibrary(specCublasLt, env)
	c := &cublasLtAPI{info: info}
	if err != nil {
		return c, err
	}
	s := symbolTable{lib: h, what: "cuBLASLt " + info.Path}
	s.bind(&c.cublasLtCreate, "cublasLtCreate")
	s.bind(&c.cublasLtDestroy, "cublasLtDestroy")
	s.bind(&c.cublasLtGetVersion, "cublasLtGetVersion")
	s.bind(&c.cublasLtGetStatusString, "cublasLtGetStatusString")
	s.bind(&c.cublasLtMatmulDescCreate, "cublasLtMatmulDescCreate")
	s.bind(&c.cublasLtMatmulDescDestroy, "cublasLtMatmulDescDestroy")
	s.bind(&c.cublasLtMatmulDescSetAttribute, "cublasLtMatmulDescSetAttribute")
	s.bind(&c.cublasLtMatrixLayoutCreate, "cublasLtMatrixLayoutCreate")
	s.bind(&c.cublasLtMatrixLayoutDestroy, "cublasLtMatrixLayoutDestroy")
	s.bind(&c.cublasLtMatrixLayoutSetAttribute, "cublasLtMatrixLayoutSetAttribute")
	s.bind(&c.cublasLtMatmulPreferenceCreate, "cublasLtMatmulPreferenceCreate")
	s.bind(&c.cublasLtMatmulPreferenceDestroy, "cublasLtMatmulPreferenceDestroy")
	s.bind(&c.cublasLtMatmulPreferenceSetAttribute, "cublasLtMatmulPreferenceSetAttribute")
	s.bind(&c.cublasLtMatmulAlgoGetHeuristic, "cublasLtMatmulAlgoGetHeuristic")
	s.bind(&c.cublasLtMatmul, "cublasLtMatmul")
	if err := s.err(); err != nil {
		c.info.Err = err.Error()
		return c, err
	}
	return c, nil
}

func (c *cublasLtAPI) check(call string, st int32) error {
	if st == 0 {
		return nil
	}
	msg := fmt.Sprintf("status %d", st)
	if s := c.cublasLtGetStatusString(st); s != "" {
		msg = s + fmt.Sprintf(" (%d)", st)
	}
	return fmt.Errorf("cuda: cublasLt: %s: %s", call, msg)
}
