package cuda

import "testing"

// TestNormRowPerBlock covers when the bf16 RMSNorm forward spreads each row over a block: few
// rows of 1024 to 16384 elements on 132 SMs, and never rows the warp kernels serve well (many
// of them) or that do not fit a block's registers.
func TestNormRowPerBlock(t *testing.T) {
	const sms = 132
	for _, c := range []struct {
		N, C int
		want bool
	}{
		{1, 8192, true},      // decoding one sequence: one warp would make 32 round trips
		{64, 8192, true},     // 8 warp blocks for 132 SMs
		{2104, 1024, true},   // 263 warp blocks: fewer than two per SM
		{2105, 1024, false},  // 264 warp blocks: two per SM, the warp kernels fill them
		{65536, 8192, false}, // training: many rows
		{1, 16384, true},     // 2048 vectors: 8 per thread of 256
		{1, 16392, false},    // 2049 vectors do not fit
		{1, 512, false},      // a row of 512 is 64 vectors: a block would be mostly idle
		{1, 1024, true},      // 128 vectors
	} {
		rpb := normVecRowsPerBlock(c.C)
		if got := normRowPerBlock(c.N, c.C, rpb, sms); got != c.want {
			t.Errorf("N=%d C=%d (%d rows per warp block): got %v, want %v", c.N, c.C, rpb, got, c.want)
		}
	}
	if normRowPerBlock(1, 8192, 0, sms) {
		t.Error("rows the vectorised kernels do not cover (rpb 0) must not take the row kernels")
	}
}
