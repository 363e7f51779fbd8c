package cuda

import (
	"math"
	"strings"
	"testing"

	"github.com/halo-shell/halo-shell/engine/backend"
	"github.com/halo-shell/halo-shell/engine/backend/cpu"
	"github.com/halo-shell/halo-shell/engine/tensor"
)

// TestGPUWindowPool compares kernels/dsv4_pool.cu's window pooling, forward and every
// gradient, with the CPU backend's: the host-emulation cases, then DeepSeek-V4's compressors
// at a training chunk's size (4096 rows pooled 4 at a time over overlapping windows of 2·512
// channels, and 128 at a time over 512), in f32 and bf16. It also checks that GAPE comes out
// with the same bits run to run.
func TestGPUWindowPool(t *testing.T) {
	g := gpu(t)
	c := cpu.New(cpu.Options{})
	defer c.Close()
	cases := append([]windowPoolCase{}, windowPoolCases...)
	for _, dt := range []tensor.DType{tensor.F32, tensor.BF16} {
		cases = append(cases,
			windowPoolCase{n: 4096, w: 1024, rate: 4, overlap: true, dt: dt},
			windowPoolCase{n: 4096, w: 512, rate: 128, dt: dt},
			windowPoolCase{n: 4099, w: 1024, rate: 4, dt: dt})
	}
	for _, pc := range cases {
		d := pc.data()
		want, err := runWindowPool(c, pc, d)
		if err != nil {
			t.Fatalf("%v: CPU: %v", pc, err)
		}
		got, err := runWindowPool(g, pc, d)
		if err != nil {
			t.Fatalf("%v: GPU: %v", pc, err)
		}
		compareWindowPool(t, pc, got, want, "the GPU")
		if pc.n >= 4096 {
			again, err := runWindowPool(g, pc, d)
			if err != nil {
				t.Fatalf("%v: GPU, second run: %v", pc, err)
			}
			for i, v := range got["gape"] {
				if math.Float32bits(v) != math.Float32bits(again["gape"][i]) {
					t.Errorf("%v: GAPE[%d] = %v, then %v on a second run", pc, i, v, again["gape"][i])
					break
				}
			}
		}
	}
	report.addCheck("window-pool kernels match the CPU", !t.Failed(), "f32 and bf16, up to 4096 rows of 1024 channels")
}

// TestGPUIndexScores compares kernels/dsv4_pool.cu's index scores with the CPU backend's: the
// host-emulation cases, then the lightning indexer at a training chunk's size (4096 queries
// of 64 heads of 128 against 1024 entries at rate 4) in bf16, and a smaller one in f32.
func TestGPUIndexScores(t *testing.T) {
	g := gpu(t)
	c := cpu.New(cpu.Options{})
	defer c.Close()
	cases := append([]indexScoresCase{}, indexScoresCases...)
	cases = append(cases,
		indexScoresCase{n: 4096, keys: 1024, hi: 64, di: 128, rate: 4, dt: tensor.BF16},
		indexScoresCase{n: 1000, keys: 250, hi: 16, di: 64, rate: 4, dt: tensor.F32},
		indexScoresCase{n: 777, keys: 100, hi: 8, di: 72, rate: 7, dt: tensor.BF16})
	for _, ic := range cases {
		d := ic.data()
		want, err := runIndexScores(c, ic, d)
		if err != nil {
			t.Fatalf("%v: CPU: %v", ic, err)
		}
		got, err := runIndexScores(g, ic, d)
		if err != nil {
			t.Fatalf("%v: GPU: %v", ic, err)
		}
		compareIndexScores(t, ic, got, want, "the GPU")
	}
	report.addCheck("index-score kernel matches the CPU", !t.Failed(), "up to 4096 queries of 64x128 against 1024 entries")
}

// TestGPUDSV4PoolRefuses: the launchers refuse bad operands with an error from this backend
// naming the operand, before launching anything.
func TestGPUDSV4PoolRefuses(t *testing.T) {
	g := gpu(t)
	u := &dsv4Tensors{be: g}
	defer u.free()
	f := func(r, c int) backend.T { return u.alloc(tensor.F32, r, c) }
	fa := backend.WindowPoolArgs{KV: f(8, 6), Gate: f(8, 6), APE: f(3, 6), Rate: 4, Overlap: true, Out: f(2, 3)}
	if err := g.WindowPool(fa); err == nil || !strings.Contains(err.Error(), "cuda: ") || !strings.Contains(err.Error(), "APE") {
		t.Errorf("WindowPool with a bad APE: error %v", err)
	}
	fa.APE = f(4, 6)
	ba := backend.WindowPoolBackwardArgs{WindowPoolArgs: fa, DOut: f(2, 3), GAPE: f(4, 5)}
	if err := g.WindowPoolBackward(ba); err == nil || !strings.Contains(err.Error(), "cuda: ") || !strings.Contains(err.Error(), "GAPE") {
		t.Errorf("WindowPoolBackward with a bad GAPE: error %v", err)
	}
	ia := backend.IndexScoresArgs{Q: f(8, 6), Keys: f(2, 3), Weights: f(8, 2), Heads: 2, Rate: 4, Out: u.alloc(tensor.BF16, 8, 2)}
	if err := g.IndexScores(ia); err == nil || !strings.Contains(err.Error(), "cuda: ") || !strings.Contains(err.Error(), "Out") {
		t.Errorf("IndexScores with a bf16 Out: error %v", err)
	}
}
