package models

import (
	"fmt"
	"math"
	"testing"

	"github.com/halo-shell/halo-shell/engine/hf/config"
)

// TestMoEDevicePathMatchesComposition trains the tiny MoE families on the CPU backend, whose
// MoE ops and grouped GEMM make every sparse layer take the device path, and again with the
// layers forced to the host composition (the reference): the loss, the aux loss, every
// gradient by name and the expert loads agree within fp32 rounding, also with aux-loss-free
// balancing (a selection bias) after a few balancing updates.
func TestMoEDevicePathMatchesComposition(t *testing.T) {
	cases := append(moeCases[:len(moeCases):len(moeCases)], struct {
		name string
		fam  string
		mod  func(*config.Config)
	}{"qwen3_moe_balanced", "qwen3_moe", nil})
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			m := tinyMoE(t, tc.fam, tc.mod)
			m.SetAuxLossScale(0.1)
			if tc.name == "qwen3_moe_balanced" {
				if err := m.SetExpertBalancing(0.02); err != nil {
					t.Fatal(err)
				}
				bias := m.ExpertBias()
				for j := range bias {
					for e := range bias[j] {
						bias[j][e] = 0.02 * float32((e*7+j*3)%5-2)
					}
				}
				if err := m.SetExpertBias(bias); err != nil {
					t.Fatal(err)
				}
			}
			batch := packedBatch(m.Arch.Vocab, []int{9, 6, 4}, 11)
			type result struct {
				loss, aux float64
				grads     map[string][]float32
				load      [][]int
			}
			run := func(host bool) result {
				if err := m.ZeroGrads(); err != nil {
					t.Fatal(err)
				}
				if host {
					composed(m)
				}
				m.TakeExpertLoad()
				l, _, err := m.ForwardBackward(batch, 1/float32(16))
				if err != nil {
					t.Fatal(err)
				}
				return result{l, m.AuxLoss(), allGrads(t, m), m.TakeExpertLoad()}
			}
			dev := run(false)
			for _, l := range m.MoELayers() {
				if l.GateUp.W.IsNil() || l.Composed {
					t.Fatalf("%s has no stacked expert weights: the device path did not run", l.Name)
				}
			}
			host := run(true)
			if math.Abs(dev.loss-host.loss) > 1e-5*math.Abs(host.loss) || math.Abs(dev.aux-host.aux) > 1e-5*math.Abs(host.aux) {
				t.Fatalf("loss, aux %v, %v on the device path; %v, %v composed", dev.loss, dev.aux, host.loss, host.aux)
			}
			if fmt.Sprint(dev.load) != fmt.Sprint(host.load) {
				t.Fatalf("expert loads %v on the device path, %v composed", dev.load, host.load)
			}
			for name, want := range host.grads {
				got := dev.grads[name]
				scale := 0.0
				for _, v := range want {
					scale = math.Max(scale, math.Abs(float64(v)))
				}
				for i := range want {
					if d := math.Abs(float64(got[i] - want[i])); d > 1e-5*scale+1e-4*math.Abs(float64(want[i])) {
						t.Fatalf("%s[%d]: gradient %g on the device path, %g composed", name, i, got[i], want[i])
					}
				}
			}
		})
	}
}
