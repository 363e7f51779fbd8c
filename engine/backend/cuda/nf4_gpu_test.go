package cuda

import (
	"math/rand/v2"
	"testing"

	"github.com/halo-shell/halo-shell/engine/backend"
	"github.com/halo-shell/halo-shell/engine/backend/cpu"
	"github.com/halo-shell/halo-shell/engine/quant"
	"github.com/halo-shell/halo-shell/engine/tensor"
)

// TestGPUDequantNF4 compares kernels/nf4.cu with the CPU backend: the same weight, quantised on
// the host, is uploaded to both and dequantised; every bf16 output must be identical (both
// round fp32 products one by one, without fused multiply-adds). Shapes cover an odd count, a
// partial block, plain and double-quantised scales, and more than one nested block of 256.
func TestGPUDequantNF4(t *testing.T) {
	g := gpu(t)
	c := cpu.New(cpu.Options{Workers: 2})
	defer c.Close()
	r := rand.New(rand.NewPCG(5, 6))
	for _, tc := range []struct {
		rows, cols int
		nested     bool
	}{
		{1, 7, false},
		{3, 43, true},
		{64, 64, false},
		{300, 65, true},
		{2048, 1536, true},
	} {
		n := tc.rows * tc.cols
		x := make([]float32, n)
		for i := range x {
			x[i] = float32(r.NormFloat64() * 0.02)
		}
		w, err := quant.QuantizeNF4(x, []int{tc.rows, tc.cols}, quant.Options{DoubleQuant: tc.nested})
		if err != nil {
			t.Fatal(err)
		}
		var outs [2][]byte
		for k, be := range []backend.Backend{c, g} {
			a, err := backend.UploadNF4(be, w)
			if err != nil {
				t.Fatal(err)
			}
			if a.Out, err = be.Alloc(tensor.BF16, tc.rows, tc.cols); err != nil {
				t.Fatal(err)
			}
			if err := be.Optional().DequantNF4(a); err != nil {
				t.Fatalf("%s %dx%d: %v", be.Name(), tc.rows, tc.cols, err)
			}
			outs[k] = make([]byte, 2*n)
			if err := be.Download(outs[k], a.Out); err != nil {
				t.Fatal(err)
			}
			backend.FreeNF4(be, a)
			_ = be.Free(a.Out)
		}
		for i := 0; i < n; i++ {
			if outs[0][2*i] != outs[1][2*i] || outs[0][2*i+1] != outs[1][2*i+1] {
				t.Fatalf("%dx%d nested=%v: element %d: gpu %02x%02x, cpu %02x%02x", tc.rows, tc.cols, tc.nested, i,
					outs[1][2*i+1], outs[1][2*i], outs[0][2*i+1], outs[0][2*i])
			}
		}
	}
}
