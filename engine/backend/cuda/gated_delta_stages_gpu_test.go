package cuda

import (
	"testing"

	"github.com/halo-shell/halo-shell/engine/backend/cpu"
	"github.com/halo-shell/halo-shell/engine/tensor"
)

// TestGPUGatedDeltaStages compares kernels/gated_delta_stages.cu with the CPU backend's
// GatedDeltaPrep, GatedDeltaPrepBackward, GatedRMSNorm and GatedRMSNormBackward: the
// host-emulation cases, then Qwen3-Next-sized heads (KD = VD = 128, two value heads per key
// head, 4 taps) over packed documents of up to a few hundred tokens, so that the per-channel
// gradients fold several partials of gatedDeltaStagesRows tokens, in f32 and bf16, with
// gatedDeltaStagesTol's bounds on every output.
func TestGPUGatedDeltaStages(t *testing.T) {
	g := gpu(t)
	c := cpu.New(cpu.Options{})
	defer c.Close()
	cases := append([]gatedDeltaStagesCase{}, gatedDeltaStagesCases...)
	for _, dt := range []tensor.DType{tensor.F32, tensor.BF16} {
		cases = append(cases, gatedDeltaStagesCase{lens: []int{300, 1, 3, 211, 2}, kh: 2, vh: 4, kd: 128, vd: 128, l: 4, dt: dt})
	}
	for _, sc := range cases {
		d := sc.data()
		want, err := runGatedDeltaStages(c, sc, d)
		if err != nil {
			t.Fatalf("%v: CPU: %v", sc, err)
		}
		got, err := runGatedDeltaStages(g, sc, d)
		if err != nil {
			t.Fatalf("%v: GPU: %v", sc, err)
		}
		compareGatedDeltaStages(t, sc, got, want, "the GPU")
	}
	report.addCheck("gated delta-net stage kernels match the CPU", !t.Failed(), "f32 and bf16, head dims 128, 517 tokens")
}
