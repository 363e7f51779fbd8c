package parallel

import (
	"slices"
	"strings"
	"testing"

	"github.com/halo-shell/halo-shell/engine/backend"
	"github.com/halo-shell/halo-shell/engine/mesh"
	"github.com/halo-shell/halo-shell/engine/models"
	"github.com/halo-shell/halo-shell/engine/optim"
)

var loraTest = models.LoRAConfig{R: 3, Alpha: 6, Dropout: 0.1, Targets: []string{models.AllLinear}, Seed: 5}

// loraModel is tinyModel with adapters attached (the same for the same seed).
func loraModel(t *testing.T, family string) *models.Model {
	t.Helper()
	m := tinyModel(t, family, 8)
	if err := m.AttachLoRA(loraTest); err != nil {
		t.Fatal(err)
	}
	return m
}

// loraReference trains the adapters of a single-device model as a plan does (AdamW over the
// adapters, global-norm clipping) and returns the losses and norms.
func loraReference(t *testing.T, family string, batches [][]models.Batch) (want, wantNorm []float64, ref *models.Model) {
	t.Helper()
	ref = loraModel(t, family)
	if err := ref.EnableGrads(); err != nil {
		t.Fatal(err)
	}
	ad := ref.LoRA()
	var params []optim.Param
	for i, s := range ad.Specs {
		params = append(params, optim.Param{Name: s.Name, Value: ad.Params.Views[i], Grad: ad.Grads.Views[i], NoDecay: !s.Decay})
	}
	opt, err := optim.NewAdamW(ref.Backend(), params, trainOpt)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(opt.Free)
	for _, rows := range batches {
		n := 0
		for _, b := range rows {
			for _, x := range b.Targets {
				if x != backend.IgnoreIndex {
					n++
				}
			}
		}
		if err := ref.ZeroGrads(); err != nil {
			t.Fatal(err)
		}
		if ref.IsMoE() {
			coef := ref.AuxLossScale()
			ref.SetAuxLossScale(coef / float64(len(rows)))
			defer ref.SetAuxLossScale(coef)
		}
		sum := 0.0
		for _, b := range rows {
			s, _, err := ref.ForwardBackward(b, float32(1/float64(n)))
			if err != nil {
				t.Fatal(err)
			}
			sum += s
		}
		if ref.IsMoE() {
			ref.SetAuxLossScale(ref.AuxLossScale() * float64(len(rows)))
		}
		norm, err := optim.GradNorm(ref.Backend(), []backend.T{ref.TrainableGrads()})
		if err != nil {
			t.Fatal(err)
		}
		if err := opt.Step(trainLR, optim.ClipCoef(norm, trainMaxNorm)); err != nil {
			t.Fatal(err)
		}
		want, wantNorm = append(want, sum/float64(n)), append(wantNorm, norm)
	}
	return want, wantNorm, ref
}

// TestLoRADataParallelTracksSingleDevice trains adapters (with dropout) under plain data
// parallelism on 2 and 4 devices, moving from one to the other half way: losses, gradient
// norms and the trained adapters follow the single-device run, the base stays as it was, and
// the optimizer state is the adapters' only.
func TestLoRADataParallelTracksSingleDevice(t *testing.T) {
	const steps = 4
	batches := trainBatches(steps)
	for _, fam := range []string{"qwen3", "mixtral"} {
		t.Run(fam, func(t *testing.T) {
			want, wantNorm, ref := loraReference(t, fam, batches)
			src := loraModel(t, fam)
			base, err := newPlan(t, src, 1, "", trainOpt).Params()
			if err != nil {
				t.Fatal(err)
			}
			p := newPlan(t, src, 2, "", trainOpt)
			trainSteps(t, p, batches[:2], 0, want, wantNorm)
			np, err := p.Relayout(cpuDevices(4), mesh.Layout{}, Options{Optimizer: trainOpt})
			if err != nil {
				t.Fatal(err)
			}
			defer np.Close()
			trainSteps(t, np, batches, 2, want, wantNorm)
			if np.DropoutKey() != uint64(steps*8) {
				t.Fatalf("dropout stream at %d after %d rows", np.DropoutKey(), steps*8)
			}
			got, err := np.AdapterParams()
			if err != nil {
				t.Fatal(err)
			}
			for _, s := range ref.LoRA().Specs {
				w, _ := ref.AdapterFloat32(s.Name)
				if err := closeTo(got[s.Name], w, 1e-4); err != nil {
					t.Fatalf("%s after training: %v", s.Name, err)
				}
			}
			after, err := np.Params()
			if err != nil {
				t.Fatal(err)
			}
			for name, v := range base {
				if !slices.Equal(after[name], v) {
					t.Fatalf("base weight %s moved under LoRA data parallelism", name)
				}
			}
			_, st, err := np.OptimizerState()
			if err != nil {
				t.Fatal(err)
			}
			for _, x := range st {
				if !strings.Contains(x.Name, ".lora_") {
					t.Fatalf("optimizer state %s is not an adapter's", x.Name)
				}
			}
			// Gather brings the adapters into a single model that has none yet.
			dst := tinyModel(t, fam, 1)
			if err := np.Gather(dst); err != nil {
				t.Fatal(err)
			}
			if dst.LoRA() == nil || dst.DropoutKey() != np.DropoutKey() {
				t.Fatal("Gather did not carry the adapters")
			}
		})
	}
}

func TestLoRARefusesShardedLayouts(t *testing.T) {
	for _, c := range []struct {
		fam, layout string
	}{{"qwen3", "fsdp"}, {"qwen3", "tp=2"}, {"qwen3", "cp=2"}, {"mixtral", "ep=2"}} {
		t.Run(c.fam+" "+c.layout, func(t *testing.T) {
			l, _ := mesh.ParseLayout(c.layout)
			_, err := New(loraModel(t, c.fam), cpuDevices(2), l, Options{Optimizer: trainOpt})
			if err == nil || !strings.Contains(err.Error(), "rule "+mesh.RuleAdapters) {
				t.Fatalf("got %v, want a refusal naming rule %s", err, mesh.RuleAdapters)
			}
		})
	}
}
