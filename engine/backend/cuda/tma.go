package cuda

import (
	"fmt"
	"unsafe"

	"github.com/halo-shell/halo-shell/engine/backend"
)

// TMA descriptors (CUtensorMap) for the Hopper grouped GEMM's TMA variant
// (kernels/grouped_gemm_wg.cu, gw_tma_body).

// CUtensorMap enum values of cuda.h.
const (
	tmaBFloat16    = 9 // CU_TENSOR_MAP_DATA_TYPE_BFLOAT16
	tmaNoInterleav = 0 // CU_TENSOR_MAP_INTERLEAVE_NONE
	tmaSwizzle128  = 3 // CU_TENSOR_MAP_SWIZZLE_128B
	tmaL2Promo256  = 3 // CU_TENSOR_MAP_L2_PROMOTION_L2_256B
	tmaOOBZero     = 0 // CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE: out-of-bounds elements read as zero
)

// tmaSpec describes one bf16 tensor map: rank 2 or 3, the sizes innermost first, the byte
// strides of the outer dimensions, and the box one copy moves (its innermost side 64 elements,
// the 128-byte swizzle's row).
type tmaSpec struct {
	rank    int
	dims    [3]uint64
	strides [2]uint64
	box     [3]uint32
}

func rowMajor2D(rows, cols int, boxRows uint32) tmaSpec {
	return tmaSpec{rank: 2, dims: [3]uint64{uint64(cols), uint64(rows)}, strides: [2]uint64{2 * uint64(cols)}, box: [3]uint32{64, boxRows}}
}

func experts3D(g, n, k int, boxRows uint32) tmaSpec {
	return tmaSpec{rank: 3, dims: [3]uint64{uint64(k), uint64(n), uint64(g)},
		strides: [2]uint64{2 * uint64(k), 2 * uint64(n) * uint64(k)}, box: [3]uint32{64, boxRows, 1}}
}

// groupedTMAMaps are the maps of the A and B operands of a grouped product of kind and sizes d,
// as gw_tma_body reads them: the row-stacked operands as 2-D maps over all S rows, the experts'
// weights [G, N_, K_] as a 3-D map, so that a box never crosses into another expert.
func groupedTMAMaps(kind backend.GroupedKind, d backend.GroupedDims) (a, b tmaSpec) {
	switch kind {
	case backend.GroupedForward: // A = X [S, K_] (128-row boxes), B = W (256 rows of N_)
		return rowMajor2D(d.S, d.K, 128), experts3D(d.G, d.N, d.K, 256)
	case backend.GroupedInputGrad: // A = dY [S, N_], B = W read as 64 x 64 panels
		return rowMajor2D(d.S, d.N, 128), experts3D(d.G, d.N, d.K, 64)
	default: // A = dY [S, N_], B = X [S, K_], both as 64 x 64 panels
		return rowMajor2D(d.S, d.N, 64), rowMajor2D(d.S, d.K, 64)
	}
}

// tensorMap is a CUtensorMap: 128 opaque bytes the driver wants 64-byte aligned. Go aligns an
// allocation to 8 bytes only, so the map lives at the first 64-byte boundary of a larger array.
type tensorMap struct{ raw [24]uint64 }

func (m *tensorMap) ptr() unsafe.Pointer {
	p := uintptr(unsafe.Pointer(&m.raw[0]))
	return unsafe.Pointer(&m.raw[(64-p%64)%64/8])
}

// encodeTMA encodes spec over the bf16 tensor at addr (16-byte aligned, as the strides are
// multiples of 16: the launcher's N_ and K_ are multiples of 8).
func (d *driverAPI) encodeTMA(spec tmaSpec, addr uintptr) (*tensorMap, error) {
	if d.cuTensorMapEncodeTiled == nil {
		return nil, fmt.Errorf("the CUDA driver has no cuTensorMapEncodeTiled (CUDA 12.0 or newer has it); use HALO_CUDA_GROUPED_GEMM=wg")
	}
	m := new(tensorMap)
	elem := [3]uint32{1, 1, 1}
	res := d.cuTensorMapEncodeTiled(m.ptr(), tmaBFloat16, uint32(spec.rank), addr, &spec.dims[0], &spec.strides[0],
		&spec.box[0], &elem[0], tmaNoInterleav, tmaSwizzle128, tmaL2Promo256, tmaOOBZero)
	if err := d.check("cuTensorMapEncodeTiled", res); err != nil {
		return nil, fmt.Errorf("cuda: tensor map of dims %v box %v: %w", spec.dims[:spec.rank], spec.box[:spec.rank], err)
	}
	return m, nil
}
