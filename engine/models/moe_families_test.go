package models

import (
	"fmt"
	"math"
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

// TestErnieCorrectionBiasChoosesOnly: ERNIE 4.5's moe_statics.e_score_correction_bias is added
// to the router's softmax for the choice of experts only. A large bias on one expert makes every
// token choose it, while the weights stay the renormalised probabilities.
func TestErnieCorrectionBiasChoosesOnly(t *testing.T) {
	m := tinyMoE(t, "ernie4_5_moe", nil)
	name := "model.layers.1.mlp.moe_statics.e_score_correction_bias"
	bias := make([]float32, m.Arch.Experts)
	bias[3] = 10
	if err := m.SetParam(name, bias); err != nil {
		t.Fatal(err)
	}
	composed(m)
	if _, _, err := m.Forward(packedBatch(m.Arch.Vocab, []int{5, 4}, 1)); err != nil {
		t.Fatal(err)
	}
	layers := m.MoELayers()
	r := layers[len(layers)-1].Routing()
	for tok := 0; tok < r.N; tok++ {
		sel, w := r.Sel[tok*r.K:(tok+1)*r.K], r.Weights[tok*r.K:(tok+1)*r.K]
		if !slices.Contains(sel, 3) {
			t.Fatalf("token %d chose %v; the bias of expert 3 should make it chosen", tok, sel)
		}
		var sum float32
		for _, s := range sel {
			sum += r.Probs[tok*r.E+int(s)]
		}
		for j, s := range sel {
			if want := r.Probs[tok*r.E+int(s)] / sum; math.Abs(float64(w[j]-want)) > 1e-6 {
				t.Errorf("token %d expert %d: weight %g, want its renormalised probability %g", tok, s, w[j], want)
			}
		}
	}
}

// TestMiniMaxM2LoadsTransformersNames: a MiniMax-M2 checkpoint under transformers 5's in-memory
// names — mlp.gate.weight, mlp.e_score_correction_bias and the fused mlp.experts.gate_up_proj
// [E,2I,C] and down_proj [E,C,I] — loads into the same model as the Hub names Save writes.
func TestMiniMaxM2LoadsTransformersNames(t *testing.T) {
	m := tinyMoE(t, "minimax_m2", nil)
	dir := t.TempDir()
	if err := m.Save(dir, SaveOptions{}); err != nil {
		t.Fatal(err)
	}
	ck, err := safetensors.OpenCheckpoint(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer ck.Close()
	e := m.Arch.Experts
	var out []safetensors.Tensor
	for l := range m.Arch.Layers {
		pre := fmt.Sprintf("model.layers.%d.", l)
		var gu, dn []byte
		for x := 0; x < e; x++ {
			for _, p := range []string{"w1", "w3"} {
				info, _ := ck.Tensor(fmt.Sprintf("%sblock_sparse_moe.experts.%d.%s.weight", pre, x, p))
				gu = append(gu, info.Data...)
			}
			info, _ := ck.Tensor(fmt.Sprintf("%sblock_sparse_moe.experts.%d.w2.weight", pre, x))
			dn = append(dn, info.Data...)
		}
		in, c := m.Arch.ExpertIntermediate, m.Arch.Hidden
		out = append(out, safetensors.Tensor{Name: pre + "mlp.experts.gate_up_proj", DType: safetensors.F32, Shape: []int{e, 2 * in, c}, Data: gu},
			safetensors.Tensor{Name: pre + "mlp.experts.down_proj", DType: safetensors.F32, Shape: []int{e, c, in}, Data: dn})
	}
	for _, n := range ck.Names() {
		if strings.Contains(n, ".experts.") {
			continue
		}
		info, _ := ck.Tensor(n)
		out = append(out, safetensors.Tensor{Name: strings.Replace(n, ".block_sparse_moe.", ".mlp.", 1), DType: info.DType, Shape: info.Shape, Data: info.Data})
	}
	checkLoadsAs(t, m, dir, out, "loading transformers' names")
}
