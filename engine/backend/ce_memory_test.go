package backend

import "testing"

func TestCrossEntropyChunkRows(t *testing.T) {
	const big = CrossEntropyChunkBytes
	tests := []struct {
		N, V   int
		budget int64
		want   int
	}{
		{16384, 151936, big, 3328}, // 5 chunks: 4 x 3328 + 3072
		{100, 151936, big, 100},    // all rows in one chunk
		{3533, 151936, big, 1792},  // just over one chunk's limit: two even chunks
		{40, 1000, big, 40},
		{1 << 20, 32000, big, 16384},                            // 64 even chunks under the 16640-row limit
		{10, 1 << 30, big, 1},                                   // a vocabulary too large for 256 rows still makes progress
		{4096, 151936, CrossEntropyFrozenChunkBytes, 768},       // a frozen head: 6 chunks (5 x 768 + 256)
		{4096, 151936, (22 << 30) / CrossEntropyCapShare, 1024}, // under a 22 GiB cap: 4 chunks
		{0, 151936, big, 1},
	}
	for _, tc := range tests {
		got := CrossEntropyChunkRows(tc.N, tc.V, tc.budget)
		if got != tc.want {
			t.Errorf("CrossEntropyChunkRows(%d, %d, %d) = %d, want %d", tc.N, tc.V, tc.budget, got, tc.want)
		}
		if tc.N > 0 && (got > tc.N || got < 1) {
			t.Errorf("CrossEntropyChunkRows(%d, %d) = %d is outside [1, N]", tc.N, tc.V, got)
		}
		if int64(got)*4*int64(tc.V) > tc.budget && got > 1 {
			t.Errorf("CrossEntropyChunkRows(%d, %d) = %d exceeds %d bytes of logits", tc.N, tc.V, got, tc.budget)
		}
	}
}

func TestCrossEntropyBudget(t *testing.T) {
	for _, c := range []struct {
		trains bool
		cap    int64
		want   int64
	}{
		{true, 0, CrossEntropyChunkBytes},
		{false, 0, CrossEntropyFrozenChunkBytes},
		{true, 22 << 30, (22 << 30) / 32},
		{false, 22 << 30, CrossEntropyFrozenChunkBytes}, // the frozen budget is already below 1/32
		{false, 8 << 30, 256 << 20},
	} {
		if got := CrossEntropyBudget(c.trains, c.cap); got != c.want {
			t.Errorf("CrossEntropyBudget(%v, %d) = %d, want %d", c.trains, c.cap, got, c.want)
		}
	}
}

// TestCrossEntropyScratch checks the per-chunk figures the package doc states for Qwen3's
// vocabulary: by default 0.22 GiB for a frozen bf16 head in 768-row chunks and 0.94 GiB for a
// trained bf16 [151936, 1024] head in 3328-row chunks, without an accumulator; with fp32 logits
// and the fp32 accumulator 0.65 GiB, 2.83 GiB plus the 0.58 GiB accumulator; and fp32 dlogits
// sharing the logits' buffer.
func TestCrossEntropyScratch(t *testing.T) {
	const V, C = 151936, 1024
	gib := func(n int64) float64 { return float64(n) / (1 << 30) }
	if got := gib(CrossEntropyScratch(768, V, C, true, 2, false)); got < 0.21 || got > 0.22 {
		t.Errorf("frozen bf16 head, 768 rows, default logits: %.3f GiB, want 0.22", got)
	}
	if got := gib(CrossEntropyScratch(3328, V, C, true, 2, true)); got < 0.94 || got > 0.95 {
		t.Errorf("trained bf16 head, 3328 rows, default logits and dWeight: %.3f GiB, want 0.94", got)
	}
	t.Setenv("HALO_CE_LOGITS", "f32")
	t.Setenv("HALO_CE_DWEIGHT", "f32")
	if got := gib(CrossEntropyScratch(768, V, C, true, 2, false)); got < 0.65 || got > 0.66 {
		t.Errorf("frozen bf16 head, 768 rows: %.3f GiB, want 0.65", got)
	}
	if got := gib(CrossEntropyScratch(3328, V, C, true, 2, false)); got < 2.82 || got > 2.83 {
		t.Errorf("trained bf16 head, 3328 rows: %.3f GiB without the accumulator, want 2.83", got)
	}
	if d := CrossEntropyScratch(3328, V, C, true, 2, true) - CrossEntropyScratch(3328, V, C, true, 2, false); d != V*C*4 {
		t.Errorf("the bf16 DWeight accumulator counts %d bytes, want %d", d, V*C*4)
	}
	if a, b := CrossEntropyScratch(100, V, C, true, 4, false), CrossEntropyScratch(100, V, C, false, 4, false); a != b {
		t.Errorf("fp32 dlogits add %d bytes; they overwrite the logits", a-b)
	}
}

// TestCrossEntropyScratchLayouts: HALO_CE_LOGITS=bf16 holds a bf16 head's chunk logits in bf16
// with the dlogits over them (rows x V x 2 bytes instead of x 6), and HALO_CE_DWEIGHT=direct
// drops the fp32 [V, C] accumulator of a bf16 DWeight; an fp32 head keeps fp32 logits under both.
func TestCrossEntropyScratchLayouts(t *testing.T) {
	const rows, V, C = 2816, 151936, 2048
	for _, tc := range []struct {
		logits, dweight string
		el              int
		want            int64
	}{
		{"f32", "f32", 2, rows*V*6 + V*C*4},
		{"bf16", "f32", 2, rows*V*2 + V*C*4},
		{"f32", "direct", 2, rows * V * 6},
		{"bf16", "direct", 2, rows * V * 2},
		{"bf16", "direct", 4, rows * V * 4},
	} {
		t.Setenv("HALO_CE_LOGITS", tc.logits)
		t.Setenv("HALO_CE_DWEIGHT", tc.dweight)
		if got := CrossEntropyScratch(rows, V, C, true, tc.el, tc.el < 4); got != tc.want {
			t.Errorf("logits %s, dweight %s, %d-byte head: %d bytes, want %d", tc.logits, tc.dweight, tc.el, got, tc.want)
		}
	}
}
