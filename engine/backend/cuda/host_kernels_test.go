package cuda

import (
	"testing"

	"github.com/halo-shell/halo-shell/engine/tensor"
)

// TestNormVecLayout checks which row widths the vectorised RMSNorm kernels take and how many rows
// a block covers: L = min(32, C/8) lanes per row, so C/8 must be 32 or more, or divide 32.
func TestNormVecLayout(t *testing.T) {
	tests := []struct {
		C       int
		rows    int
		bwdName string
	}{
		{8, 256, "rmsnorm_bwd_bf16x8_c1024"},
		{64, 32, "rmsnorm_bwd_bf16x8_c1024"},
		{128, 16, "rmsnorm_bwd_bf16x8_c1024"},
		{24, 0, "rmsnorm_bwd_bf16x8_c1024"}, // C/8 = 3 does not divide 32
		{100, 0, "rmsnorm_bwd_bf16x8_c1024"},
		{256, 8, "rmsnorm_bwd_bf16x8_c1024"},
		{1000, 8, "rmsnorm_bwd_bf16x8_c1024"},
		{1024, 8, "rmsnorm_bwd_bf16x8_c1024"},
		{2048, 8, "rmsnorm_bwd_bf16x8_c2048"},
		{2056, 8, ""},
		{0, 0, "rmsnorm_bwd_bf16x8_c1024"},
	}
	o := defaultNormBwdOptions()
	o.sharedDW = false // the table names the register forms
	for _, tc := range tests {
		if got := normVecRowsPerBlock(tc.C); got != tc.rows {
			t.Errorf("normVecRowsPerBlock(%d) = %d, want %d", tc.C, got, tc.rows)
		}
		if got := o.plan(tc.C).kernel; got != tc.bwdName {
			t.Errorf("plan(%d).kernel = %q, want %q", tc.C, got, tc.bwdName)
		}
	}
	// With the weight-gradient sums in shared memory, rows of 1024 < C <= 2048 take the other
	// kernel, twice the blocks per SM and every warp's 2048 sums.
	o.sharedDW = true
	for _, tc := range []struct {
		C    int
		want normBwdPlan
	}{
		{1024, normBwdPlan{"rmsnorm_bwd_bf16x8_c1024", o.blocksPerSM, 4 * 8 * 1024}},
		{1032, normBwdPlan{"rmsnorm_bwd_bf16x8_c2048s", 2 * o.blocksPerSMWide, 4 * 8 * 2048}},
		{2048, normBwdPlan{"rmsnorm_bwd_bf16x8_c2048s", 2 * o.blocksPerSMWide, 4 * 8 * 2048}},
		{2056, normBwdPlan{}},
	} {
		if got := o.plan(tc.C); got != tc.want {
			t.Errorf("plan(%d) = %+v, want %+v", tc.C, got, tc.want)
		}
	}
}

// TestVec8 checks the conditions for moving bf16 elements 8 at a time.
func TestVec8(t *testing.T) {
	bf, f32 := int32(tensor.BF16), int32(tensor.F32)
	tests := []struct {
		name  string
		n     int64
		codes []int32
		ptrs  []uintptr
		want  bool
	}{
		{"aligned bf16", 64, []int32{bf, bf}, []uintptr{0x1000, 0x2010}, true},
		{"count not a multiple of 8", 60, []int32{bf}, []uintptr{0x1000}, false},
		{"an f32 tensor", 64, []int32{bf, f32}, []uintptr{0x1000, 0x2000}, false},
		{"a pointer 8-byte aligned only", 64, []int32{bf, bf}, []uintptr{0x1000, 0x2008}, false},
	}
	for _, tc := range tests {
		if got := vec8(tc.n, tc.codes, tc.ptrs...); got != tc.want {
			t.Errorf("%s: vec8 = %v, want %v", tc.name, got, tc.want)
		}
	}
}
