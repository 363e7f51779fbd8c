package optim

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/halo-shell/halo-shell/engine/backend"
	"github.com/halo-shell/halo-shell/engine/profile"
	"github.com/halo-shell/halo-shell/engine/tensor"
)

// TestAdamWUpdatesArenaRunsInOneCall: parameters that lie back to back in one arena, with
// their gradients back to back in another, are updated by one AdamW call per run of equal
// weight decay (2-D weights decay, 1-D gains do not), and the result equals updating every
// parameter on its own (separate allocations) bit for bit, over three steps, for fp32 weights
// and for bf16 weights with fp32 masters. Stochastic bf16 rounding keys its random stream on
// the parameter, so there every parameter keeps its own call.
func TestAdamWUpdatesArenaRunsInOneCall(t *testing.T) {
	shapes := []tensor.Shape{{4, 3}, {3}, {5, 3}, {2, 3}, {7, 3}, {6}, {6}}
	// Runs: [4,3] | [3] | [5,3] [2,3] [7,3] | [6] [6].
	const wantRuns = 4
	for _, tc := range []struct {
		name     string
		dt       tensor.DType
		cfg      Config
		wantRuns int
	}{
		{"fp32", tensor.F32, Config{WeightDecay: 0.1}, wantRuns},
		{"bf16 master", tensor.BF16, Config{WeightDecay: 0.1}, wantRuns},
		{"bf16 nearest", tensor.BF16, Config{Mode: BF16, Nearest: true, WeightDecay: 0.1}, wantRuns},
		{"bf16 stochastic", tensor.BF16, Config{Mode: BF16, Seed: 3, WeightDecay: 0.1}, len(shapes)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rng := rand.New(rand.NewPCG(4, 5))
			init := make([][]float32, len(shapes))
			grads := make([][][]float32, 3)
			for i, s := range shapes {
				init[i] = make([]float32, s.Numel())
				for j := range init[i] {
					init[i][j] = float32(rng.NormFloat64())
				}
			}
			for st := range grads {
				grads[st] = make([][]float32, len(shapes))
				for i, s := range shapes {
					grads[st][i] = make([]float32, s.Numel())
					for j := range grads[st][i] {
						grads[st][i][j] = float32(rng.NormFloat64())
					}
				}
			}
			// run trains the parameters laid out in one arena (arena) or allocated one by one.
			run := func(arena bool) (vals [][]float32, calls, launches int) {
				rec := profile.NewRecorder()
				b := profile.Wrap(newCPU(t), rec)
				total := 0
				for _, s := range shapes {
					total += s.Numel()
				}
				var pflat, gflat tensor.Tensor
				if arena {
					var err error
					pflat, err = b.Alloc(tc.dt, total)
					must(t, err)
					gflat, err = b.Alloc(tc.dt, total)
					must(t, err)
				}
				var params []Param
				off := 0
				for i, s := range shapes {
					var v, g tensor.Tensor
					if arena {
						var err error
						v, err = pflat.View(off, s...)
						must(t, err)
						g, err = gflat.View(off, s...)
						must(t, err)
						off += s.Numel()
					} else {
						var err error
						v, err = b.Alloc(tc.dt, s...)
						must(t, err)
						g, err = b.Alloc(tc.dt, s...)
						must(t, err)
					}
					raw, err := tensor.EncodeFloat32(tc.dt, init[i])
					must(t, err)
					must(t, b.Upload(v, raw))
					params = append(params, Param{Name: fmt.Sprintf("p%d", i), Value: v, Grad: g, NoDecay: NoDecayByShape(s)})
				}
				o, err := NewAdamW(b, params, tc.cfg)
				must(t, err)
				defer o.Free()
				rec.Enable(true, true)
				for st := range grads {
					for i, p := range params {
						raw, err := tensor.EncodeFloat32(tc.dt, grads[st][i])
						must(t, err)
						must(t, b.Upload(p.Grad, raw))
					}
					rec.BeginStep(st)
					must(t, o.Step(1e-2, 0.7))
					s, _ := rec.EndStep()
					for _, sp := range s.Spans {
						if sp.Name == "AdamW" {
							calls++
						}
					}
				}
				for _, p := range params {
					v, err := backend.ToFloat32(b, p.Value)
					must(t, err)
					vals = append(vals, v)
				}
				return vals, calls, o.Launches()
			}
			want, wantCalls, one := run(false)
			got, calls, launches := run(true)
			if one != len(shapes) || wantCalls != 3*len(shapes) {
				t.Fatalf("separate allocations: %d launches per step (%d calls), want one per parameter (%d)", one, wantCalls, len(shapes))
			}
			if launches != tc.wantRuns || calls != 3*tc.wantRuns {
				t.Fatalf("one arena: %d launches per step (%d calls in 3 steps), want %d", launches, calls, tc.wantRuns)
			}
			for i := range want {
				if !slices.Equal(got[i], want[i]) {
					t.Fatalf("parameter %d after 3 steps: %v in one arena, %v alone", i, got[i], want[i])
				}
			}
		})
	}
}
