package cpu

import (
	"testing"

	"github.com/halo-shell/halo-shell/engine/backend"
	"github.com/halo-shell/halo-shell/engine/tensor"
)

// FuzzOpArguments: ops given tensors of arbitrary (small) shapes, dtypes and index values
// either succeed or return an error; they never panic.
func FuzzOpArguments(f *testing.F) {
	f.Add(uint8(4), uint8(2), uint8(2), uint8(1), uint8(3), int8(0), int8(2), int8(4), uint8(0), []byte{0, 1, 2, 3})
	f.Add(uint8(3), uint8(0), uint8(1), uint8(0), uint8(0), int8(-1), int8(9), int8(3), uint8(5), []byte{9, 200})
	f.Add(uint8(7), uint8(3), uint8(2), uint8(4), uint8(2), int8(3), int8(1), int8(7), uint8(1), []byte{})
	b := New(Options{Workers: 2})
	f.Cleanup(func() { b.Close() })
	f.Fuzz(func(t *testing.T, n, nh, nkv, hd, c uint8, cu0, cu1, cu2 int8, window uint8, idx []byte) {
		dims := []int{int(n % 9), int(nh % 5), int(nkv % 5), int(hd % 6), int(c % 7)}
		N, NH, NKV, HD, C := dims[0], dims[1], dims[2], dims[3], dims[4]
		var live []tensor.Tensor
		defer func() {
			for _, x := range live {
				_ = b.Free(x)
			}
		}()
		alloc := func(dt tensor.DType, shape ...int) tensor.Tensor {
			x, err := b.Alloc(dt, shape...)
			if err != nil {
				t.Fatal(err)
			}
			live = append(live, x)
			return x
		}
		ints := make([]int32, len(idx))
		for i, v := range idx {
			ints[i] = int32(int8(v))
		}
		if len(ints) == 0 {
			ints = []int32{0}
		}
		ids, err := backend.FromInt32(b, ints, len(ints))
		if err != nil {
			t.Fatal(err)
		}
		cu, _ := backend.FromInt32(b, []int32{int32(cu0), int32(cu1), int32(cu2)}, 3)
		live = append(live, ids, cu)
		q := alloc(tensor.F32, N, NH*HD)
		k := alloc(tensor.BF16, N, NKV*HD)
		out := alloc(tensor.F32, N, NH*HD)
		lse := alloc(tensor.F32, N, NH)
		sh := backend.AttentionShape{CuSeqlens: cu, NH: NH, NKV: NKV, HD: HD, Window: int(window) - 2}
		_ = b.Attention(backend.AttentionArgs{AttentionShape: sh, Out: out, LSE: lse, Q: q, K: k, V: k})
		_ = b.AttentionBackward(backend.AttentionBackwardArgs{AttentionShape: sh, DQ: out, DK: k, DV: alloc(tensor.F32, N, NKV*HD), DOut: q, Q: q, K: k, V: k, Out: out, LSE: lse})
		w := alloc(tensor.F32, C, HD)
		x := alloc(tensor.F32, N, HD)
		_ = b.Linear(alloc(tensor.F32, N, C), x, w, alloc(tensor.F32, NH))
		_ = b.LinearBackward(backend.LinearBackwardArgs{DX: x, DW: w, DY: alloc(tensor.F32, N, C), X: x, W: w})
		_ = b.GEMM(backend.GEMMArgs{A: x, B: w, C: alloc(tensor.F32, N, C), TransB: true, Alpha: 1})
		_ = b.RMSNorm(x, alloc(tensor.F32, N), x, alloc(tensor.F32, C), 1e-6)
		_ = b.Embedding(alloc(tensor.F32, len(ints), HD), w, ids)
		_ = b.EmbeddingBackward(w, alloc(tensor.F32, len(ints), HD), ids)
		_ = b.CrossEntropy(backend.CrossEntropyArgs{Hidden: x, Weight: w, Targets: ids, Loss: alloc(tensor.F32, len(ints)), DHidden: alloc(tensor.F32, N, HD), DWeight: w, GradScale: 1})
		inv := alloc(tensor.F32, HD/2)
		_ = b.RoPE(q, q, backend.RoPEArgs{Positions: ids, InvFreq: inv, Heads: NH, HeadDim: HD, RotaryDim: int(c % 9)})
		_ = b.SwiGLU(out, q, alloc(tensor.F32, N*NH*HD))
		_ = b.Copy(alloc(tensor.I32, N), q)
		for _, x := range live {
			must(t, b.Free(x))
		}
		live = nil
		if a := b.MemStats().Allocated; a != 0 {
			t.Fatalf("%d bytes still allocated after freeing every tensor", a)
		}
	})
}
