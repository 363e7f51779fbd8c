package cuda

import (
	"slices"
	"testing"
)

func TestAttnBlockOrder(t *testing.T) {
	for _, c := range []struct {
		name   string
		cu     []int32
		rows   int
		window int
		keys   bool
		want   []int32
	}{
		// One document of 4 blocks: query block 3 sees the most keys, key block 0 the most
		// queries.
		{"queries one doc", []int32{0, 256}, 64, 0, false, []int32{3, 2, 1, 0}},
		{"keys one doc", []int32{0, 256}, 64, 0, true, []int32{0, 1, 2, 3}},
		// Two documents of 2 blocks: the heavy block of each first, ties in row order.
		{"queries two docs", []int32{0, 128, 256}, 64, 0, false, []int32{1, 3, 0, 2}},
		{"keys two docs", []int32{0, 128, 256}, 64, 0, true, []int32{0, 2, 1, 3}},
		// A window of 64 makes every full block alike; the partial last block of 40 rows and
		// the first (no rows before it) weigh less.
		{"queries window", []int32{0, 232}, 64, 64, false, []int32{1, 2, 3, 0}},
		{"keys window", []int32{0, 232}, 64, 64, true, []int32{0, 1, 2, 3}},
		// Uneven documents: block 2 ends the long document, block 3 is the short one.
		{"queries uneven", []int32{0, 192, 256}, 64, 0, false, []int32{2, 1, 0, 3}},
	} {
		t.Run(c.name, func(t *testing.T) {
			got := attnBlockOrder(c.cu, c.rows, c.window, c.keys)
			if !slices.Equal(got, c.want) {
				t.Fatalf("attnBlockOrder(%v, rows %d, window %d, keys %v) = %v, want %v", c.cu, c.rows, c.window, c.keys, got, c.want)
			}
		})
	}
}

func TestAttnBlockOrderIsPermutation(t *testing.T) {
	cu := []int32{0, 17, 17, 900, 1000, 4097}
	for _, keys := range []bool{false, true} {
		for _, w := range []int{0, 100} {
			got := attnBlockOrder(cu, 64, w, keys)
			if len(got) != (4097+63)/64 {
				t.Fatalf("keys=%v window=%d: %d blocks, want %d", keys, w, len(got), (4097+63)/64)
			}
			s := slices.Clone(got)
			slices.Sort(s)
			for i, v := range s {
				if int(v) != i {
					t.Fatalf("keys=%v window=%d: order %v is not a permutation", keys, w, got)
				}
			}
		}
	}
	if attnOrderKey(cu, 0, false) == attnOrderKey(cu, 0, true) || attnOrderKey(cu, 0, false) == attnOrderKey(cu, 1, false) {
		t.Fatal("orders of different estimates or windows share a cache key")
	}
}
