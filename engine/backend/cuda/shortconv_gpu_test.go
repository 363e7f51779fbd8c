package cuda

import (
	"testing"

	"github.com/halo-shell/halo-shell/engine/backend/cpu"
	"github.com/halo-shell/halo-shell/engine/tensor"
)

// TestGPUShortConv compares kernels/shortconv.cu with the CPU backend's ShortConv and
// ShortConvBackward: the host-emulation cases, then layer-sized ones (LFM2's 3 taps over
// thousands of channels and packed documents of several hundred tokens, one cut before the
// chunk), in f32 and bf16, with shortConvTol's bounds on every output.
func TestGPUShortConv(t *testing.T) {
	g := gpu(t)
	c := cpu.New(cpu.Options{})
	defer c.Close()
	cases := append([]shortConvCase{}, shortConvCases...)
	for _, dt := range []tensor.DType{tensor.F32, tensor.BF16} {
		cases = append(cases,
			shortConvCase{lens: []int{300, 1, 211, 500}, first: 7, c: 1024, l: 3, bias: true, dt: dt},
			shortConvCase{lens: []int{64, 64}, c: 2048, l: 4, dt: dt})
	}
	for _, sc := range cases {
		d := sc.data()
		want, err := runShortConv(c, sc, d)
		if err != nil {
			t.Fatalf("%v: CPU: %v", sc, err)
		}
		got, err := runShortConv(g, sc, d)
		if err != nil {
			t.Fatalf("%v: GPU: %v", sc, err)
		}
		compareShortConv(t, sc, got, want, "the GPU")
	}
	report.addCheck("short-convolution kernels match the CPU", !t.Failed(), "f32 and bf16, up to 2048 channels and 1012 tokens")
}
