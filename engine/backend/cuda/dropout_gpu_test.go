package cuda

import (
	"math"
	"testing"

	"github.com/halo-shell/halo-shell/engine/backend"
	"github.com/halo-shell/halo-shell/engine/backend/cpu"
	"github.com/halo-shell/halo-shell/engine/tensor"
)

// TestGPUDropout compares kernels/dropout.cu with the CPU backend: the same input, seed and key
// give the same output bits (the mask is drawn from one stream on both), in f32 and bf16, in
// place and out of place, at several drop probabilities and an element count that is not a
// multiple of the block.
func TestGPUDropout(t *testing.T) {
	g := gpu(t)
	c := cpu.New(cpu.Options{Workers: 2})
	defer c.Close()
	const n = 1<<20 + 3
	xs := make([]float32, n)
	for i := range xs {
		xs[i] = float32(math.Sin(float64(i)*0.37)) * 2
	}
	for _, dt := range []tensor.DType{tensor.F32, tensor.BF16} {
		for _, p := range []float32{0.05, 0.5} {
			for _, inPlace := range []bool{false, true} {
				var outs [2][]float32
				for k, be := range []backend.Backend{c, g} {
					x, err := backend.FromFloat32(be, xs, dt, n)
					if err != nil {
						t.Fatal(err)
					}
					out := x
					if !inPlace {
						if out, err = be.Alloc(dt, n); err != nil {
							t.Fatal(err)
						}
					}
					if err := be.Optional().Dropout(backend.DropoutArgs{Out: out, X: x, P: p, Seed: 99, Key: 12345}); err != nil {
						t.Fatalf("%s: %v", be.Name(), err)
					}
					if outs[k], err = backend.ToFloat32(be, out); err != nil {
						t.Fatal(err)
					}
					_ = be.Free(x)
					if !inPlace {
						_ = be.Free(out)
					}
				}
				for i := range outs[0] {
					if math.Float32bits(outs[0][i]) != math.Float32bits(outs[1][i]) {
						t.Fatalf("%s P=%v in place %v: element %d: GPU %v, CPU %v", dt, p, inPlace, i, outs[1][i], outs[0][i])
					}
				}
			}
		}
	}
	report.addCheck("dropout kernel equals the CPU bit for bit", !t.Failed(), "f32 and bf16, P 0.05 and 0.5")
}
