package nn

import (
	"math"
	"slices"
	"testing"
)

// TestAttentionRemakesQK: with HALO_ATTN_QK=recompute a kept forward of attention with q/k
// norms holds (NH + NKV) x HD activation elements per token fewer than with keep, and its
// backward makes them again bit for bit: the output, dx and every gradient equal keep's, with
// the norms before RoPE and after it.
func TestAttentionRemakesQK(t *testing.T) {
	const C, NH, NKV, HD = 12, 4, 2, 6
	lens := []int{5, 1, 7}
	for _, after := range []bool{false, true} {
		run := func(mode string) (held int64, outs [][]float32) {
			t.Setenv("HALO_ATTN_QK", mode)
			e := newEnv(t)
			p := e.pass(lens, HD)
			x := e.randn(1, p.N, C)
			a := newAttention(e, C, NH, NKV, HD, 3, true)
			a.NormAfterRoPE = after
			dy := e.randn(1, p.N, C)
			before := e.b.MemStats().Allocated
			y, err := a.Forward(p, x, true)
			if err != nil {
				t.Fatal(err)
			}
			held = e.b.MemStats().Allocated - before - y.Bytes()
			dx, err := a.Backward(p, dy)
			if err != nil {
				t.Fatal(err)
			}
			outs = [][]float32{e.get(y), e.get(dx)}
			for _, g := range attnLayer(a).grad {
				outs = append(outs, e.get(g))
			}
			return held, outs
		}
		keepHeld, keep := run("keep")
		remakeHeld, remake := run("recompute")
		n := int64(5 + 1 + 7) // the tokens of lens
		if want := n * (NH + NKV) * HD * 4; keepHeld-remakeHeld != want {
			t.Errorf("norm after RoPE %v: recompute holds %d bytes fewer than keep, want (NH+NKV)*HD*4 per token = %d", after, keepHeld-remakeHeld, want)
		}
		for i := range keep {
			if !slices.EqualFunc(keep[i], remake[i], func(a, b float32) bool { return math.Float32bits(a) == math.Float32bits(b) }) {
				t.Errorf("norm after RoPE %v: output %d (y, dx, then the gradients) differs between keep and recompute", after, i)
			}
		}
	}
}
