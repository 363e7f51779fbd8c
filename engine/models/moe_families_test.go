package models

import (
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/halo-shell/halo-shell/engine/hf/safetensors"
)

// TestGraniteMoESavesFusedExperts: granitemoe's checkpoints hold every expert of a layer in
// input_linear [E,2I,C] (gate rows, then up rows) and output_linear [E,C,I]; Save writes them so
// from the per-expert parameters, and Load reads them back into the same model.
func TestGraniteMoESavesFusedExperts(t *testing.T) {
	m := tinyMoE(t, "granitemoe", nil)
	defer m.Close()
	dir := t.TempDir()
	if err := m.Save(dir, SaveOptions{}); err != nil {
		t.Fatal(err)
	}
	ck, err := safetensors.OpenCheckpoint(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer ck.Close()
	e, in, c := m.Arch.Experts, m.Arch.ExpertIntermediate, m.Arch.Hidden
	for l := range m.Arch.Layers {
		pre := fmt.Sprintf("model.layers.%d.block_sparse_moe.", l)
		for _, tc := range []struct {
			name  string
			shape []int
		}{{"input_linear.weight", []int{e, 2 * in, c}}, {"output_linear.weight", []int{e, c, in}}, {"router.layer.weight", []int{e, c}}} {
			info, ok := ck.Tensor(pre + tc.name)
			if !ok || !slices.Equal(info.Shape, tc.shape) {
				t.Fatalf("%s%s: present %v, shape %v, want %v", pre, tc.name, ok, info.Shape, tc.shape)
			}
		}
		gu, _ := ck.Tensor(pre + "input_linear.weight")
		dn, _ := ck.Tensor(pre + "output_linear.weight")
		guv, _ := safetensors.ToFloat32(gu)
		dnv, _ := safetensors.ToFloat32(dn)
		for x := 0; x < e; x++ {
			ep := fmt.Sprintf("%sexperts.%d.", pre, x)
			for _, p := range []struct {
				name string
				got  []float32
			}{{"gate_proj", guv[2*x*in*c : (2*x+1)*in*c]}, {"up_proj", guv[(2*x+1)*in*c : (2*x+2)*in*c]},
				{"down_proj", dnv[x*c*in : (x+1)*c*in]}} {
				want, err := m.ParamFloat32(ep + p.name + ".weight")
				if err != nil {
					t.Fatal(err)
				}
				if !slices.Equal(p.got, want) {
					t.Errorf("expert %d %s: the fused tensor does not hold its weight", x, p.name)
				}
			}
		}
	}
	for _, n := range ck.Names() {
		if strings.Contains(n, ".experts.") {
			t.Errorf("per-expert tensor %s written beside the fused ones", n)
		}
	}
	back, err := Load(dir, newCPU(), Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer back.Close()
	if len(back.Unused) != 0 {
		t.Errorf("tensors not used on load: %v", back.Unused)
	}
	ids := []int32{3, 9, 17, 2, 30, 8, 8, 40}
	a, err := m.Logprobs(ids)
	if err != nil {
		t.Fatal(err)
	}
	b, err := back.Logprobs(ids)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(a, b) {
		t.Errorf("logprobs after the round trip %v, before %v", b, a)
	}
}
