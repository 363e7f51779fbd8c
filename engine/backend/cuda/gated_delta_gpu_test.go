package cuda

import (
	"testing"

	"github.com/halo-shell/halo-shell/engine/backend/cpu"
	"github.com/halo-shell/halo-shell/engine/tensor"
)

// TestGPUGatedDelta compares kernels/gated_delta.cu with the CPU backend's GatedDelta and
// GatedDeltaBackward: the host-emulation cases, then Qwen3-Next-sized heads (KD = VD = 128, two
// value heads per key head) over packed documents of a few hundred tokens restarted every 64,
// in f32 and bf16, with gatedDeltaTol's bounds on every output.
func TestGPUGatedDelta(t *testing.T) {
	g := gpu(t)
	c := cpu.New(cpu.Options{})
	defer c.Close()
	cases := append([]gatedDeltaCase{}, gatedDeltaCases...)
	for _, dt := range []tensor.DType{tensor.F32, tensor.BF16} {
		cases = append(cases, gatedDeltaCase{lens: []int{200, 1, 57}, kh: 2, vh: 4, kd: 128, vd: 128, ch: 64, dt: dt})
	}
	cases = append(cases, gatedDeltaCase{lens: []int{130}, kh: 1, vh: 1, kd: 256, vd: 96, ch: 64, dt: tensor.F32})
	for _, gc := range cases {
		d := gc.data()
		want, err := runGatedDelta(c, gc, d)
		if err != nil {
			t.Fatalf("%v: CPU: %v", gc, err)
		}
		got, err := runGatedDelta(g, gc, d)
		if err != nil {
			t.Fatalf("%v: GPU: %v", gc, err)
		}
		compareGatedDelta(t, gc, got, want, "the GPU")
	}
	report.addCheck("gated delta rule kernels match the CPU", !t.Failed(), "f32 and bf16, head dims up to 256, 258 tokens")
}
