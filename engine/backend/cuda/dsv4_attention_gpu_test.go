package cuda

import (
	"math"
	"testing"

	"github.com/halo-shell/halo-shell/engine/backend/cpu"
	"github.com/halo-shell/halo-shell/engine/tensor"
)

// TestGPUSinkAttention compares kernels/dsv4_attention.cu with the CPU backend's SinkAttention
// and SinkAttentionBackward: the host-emulation cases, then layer-sized ones (DeepSeek-V4's
// head dim 512 with 16 heads over 512 tokens, rate 4 and a 128-token window, with and without
// the indexer's mask; 128 heads; a few thousand keys), in f32 and bf16, with the cases' bounds
// on every output. The backward is also run twice on one input and must give the same bits.
func TestGPUSinkAttention(t *testing.T) {
	g := gpu(t)
	c := cpu.New(cpu.Options{})
	defer c.Close()
	cases := append([]sinkAttnCase{}, sinkAttnCases...)
	for _, dt := range []tensor.DType{tensor.F32, tensor.BF16} {
		cases = append(cases,
			sinkAttnCase{n: 512, c: 128, h: 16, d: 512, window: 128, rate: 4, mask: "pattern", dt: dt, big: true},
			sinkAttnCase{n: 512, c: 128, h: 16, d: 512, window: 128, rate: 4, dt: dt, big: true},
			sinkAttnCase{n: 64, c: 16, h: 128, d: 512, window: 32, rate: 4, mask: "pattern", dt: dt, big: true},
			sinkAttnCase{n: 2048, c: 512, h: 2, d: 64, window: 128, rate: 4, mask: "pattern", dt: dt, big: true})
	}
	for _, sc := range cases {
		d := sc.data()
		want, err := runSinkAttn(c, sc, d)
		if err != nil {
			t.Fatalf("%v: CPU: %v", sc, err)
		}
		got, err := runSinkAttn(g, sc, d)
		if err != nil {
			t.Fatalf("%v: GPU: %v", sc, err)
		}
		compareSinkAttn(t, sc, got, want, "the GPU")
	}
	sc := cases[len(sinkAttnCases)]
	d := sc.data()
	first, err := runSinkAttn(g, sc, d)
	if err != nil {
		t.Fatal(err)
	}
	again, err := runSinkAttn(g, sc, d)
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range sinkAttnOutputs {
		for i := range first[name] {
			if math.Float32bits(first[name][i]) != math.Float32bits(again[name][i]) {
				t.Fatalf("%v: %s[%d] = %g, then %g: the kernels are not deterministic", sc, name, i, first[name][i], again[name][i])
			}
		}
	}
	report.addCheck("sink-attention kernels match the CPU", !t.Failed(), "f32 and bf16, up to D 512, 128 heads and 2560 keys")
}
