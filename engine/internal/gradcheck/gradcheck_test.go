package gradcheck

import (
	"math"
	"strings"
	"testing"

	"github.com/halo-shell/halo-shell/engine/tensor"
)

// ref is a reference with one layer whose key bias gradient is at float32 rounding noise
// (as on a NoPE layer) beside ordinary tensors, and one tensor outside the layers.
func ref() map[string][]float32 {
	return map[string][]float32{
		"model.layers.1.self_attn.k_proj.bias":   {1.2e-8, -1.4e-8},
		"model.layers.1.self_attn.k_proj.weight": {0.3, -0.4}, // norm 0.5: the layer's scale
		"model.layers.1.mlp.down_proj.bias":      {0.06, 0.08},
		"model.embed_tokens.weight":              {2, 0},
	}
}

func with(name string, v ...float32) map[string][]float32 {
	m := ref()
	m[name] = v
	return m
}

func TestCompare(t *testing.T) {
	const kb, kw, db, emb = "model.layers.1.self_attn.k_proj.bias", "model.layers.1.self_attn.k_proj.weight",
		"model.layers.1.mlp.down_proj.bias", "model.embed_tokens.weight"
	cases := []struct {
		name string
		got  map[string][]float32
		fail []string // the tensors that must fail at tolerance 1e-3, in float32
	}{
		{"identical", ref(), nil},
		// Unrelated noise on a zero gradient: a relative difference near 2, under the floor.
		{"noise against noise", with(kb, -1.1e-8, 1.5e-8), nil},
		{"noise tensor beyond the floor", with(kb, 1e-5, 0), []string{kb}},
		{"missing noise-level gradient is noise", with(kb, 0, 0), nil},
		{"ordinary tensor within tolerance", with(db, 0.06, 0.08005), nil},
		{"ordinary tensor off by 1%", with(db, 0.0606, 0.0808), []string{db}},
		{"missing ordinary gradient", with(kw, 0, 0), []string{kw}},
		{"sign-flipped gradient", with(emb, -2, 0), []string{emb}},
		{"NaN never passes", with(kb, float32(math.NaN()), 0), []string{kb}},
	}
	noise, err := Noise(tensor.F32)
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			diffs, err := Compare(tc.got, ref(), noise)
			if err != nil {
				t.Fatal(err)
			}
			if len(diffs) != len(ref()) {
				t.Fatalf("%d diffs for %d tensors", len(diffs), len(ref()))
			}
			var failed []string
			for _, d := range diffs {
				if d.Noise != (d.Name == kb) {
					t.Errorf("%s: Noise %v, floor %.3g", d.Name, d.Noise, d.Floor)
				}
				if !d.Pass(1e-3) {
					failed = append(failed, d.Name)
				}
			}
			if strings.Join(failed, ",") != strings.Join(tc.fail, ",") {
				t.Errorf("failed %v, want %v", failed, tc.fail)
			}
		})
	}
}

// The floor scales with the largest gradient of the tensor's own layer: the same small bias
// gradient is noise beside large weights and an ordinary tensor beside small ones.
func TestFloorIsPerLayer(t *testing.T) {
	want := map[string][]float32{
		"model.layers.0.self_attn.k_proj.bias":   {1e-6},
		"model.layers.0.self_attn.k_proj.weight": {1},
		"model.layers.2.self_attn.k_proj.bias":   {1e-6},
		"model.layers.2.self_attn.k_proj.weight": {1e-2},
	}
	diffs, err := Compare(want, want, 1e-5)
	if err != nil {
		t.Fatal(err)
	}
	for _, d := range diffs {
		noise := d.Name == "model.layers.0.self_attn.k_proj.bias"
		if d.Noise != noise {
			t.Errorf("%s: Noise %v, want %v (floor %.3g)", d.Name, d.Noise, noise, d.Floor)
		}
	}
}

func TestCompareRefusesMismatchedSets(t *testing.T) {
	got := ref()
	delete(got, "model.embed_tokens.weight")
	if _, err := Compare(got, ref(), 1e-5); err == nil || !strings.Contains(err.Error(), "model.embed_tokens.weight") {
		t.Errorf("a missing gradient: err %v", err)
	}
	if _, err := Compare(with("model.embed_tokens.weight", 1), ref(), 1e-5); err == nil || !strings.Contains(err.Error(), "1 values") {
		t.Errorf("a short gradient: err %v", err)
	}
}

func TestNoise(t *testing.T) {
	f, err := Noise(tensor.F32)
	if err != nil || f != 1e-5 {
		t.Errorf("float32: %g, %v", f, err)
	}
	b, err := Noise(tensor.BF16)
	if err != nil || b != 1.0/256 {
		t.Errorf("bfloat16: %g, %v", b, err)
	}
	if _, err := Noise(tensor.F16); err == nil {
		t.Error("float16 has no noise level and must be refused")
	}
}
