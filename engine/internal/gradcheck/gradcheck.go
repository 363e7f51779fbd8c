// Package gradcheck is the rule by which the parity tests judge a model's parameter gradients
// against a reference (transformers' float32 gradients, or the CPU backend's in the same
// dtype): the CPU backend's tests (engine/models) and the CUDA backend's (engine/backend/cuda)
// both call Compare, so the two agree on what a match is. It holds no model code.
//
// The rule: a tensor is compared by its relative difference, ‖got−want‖/‖want‖, unless its
// reference gradient is rounding noise of one that is zero in exact arithmetic. The key bias
// of an attention layer without RoPE (smollm3's NoPE layers) is one: it adds the same q·b to
// every score of a query, which softmax cancels, so its gradient is a sum of terms that
// cancel, and two backends hold unrelated noise there (a relative difference of 1 to 2). A
// tensor whose reference norm is below the floor, Noise(dtype) times the largest reference
// gradient norm of its decoder layer, must instead agree within that floor, absolutely.
package gradcheck

import (
	"fmt"
	"math"
	"regexp"
	"slices"

	"github.com/halo-shell/halo-shell/engine/tensor"
)

// Noise returns the fraction of a layer's largest gradient norm below which a gradient
// computed with activations in dt is taken as rounding noise of an exactly-zero one. float32
// carries about 6e-8 relative, so 1e-5 leaves two orders of margin; bfloat16 keeps 8
// significant bits, and a cancelling sum of bf16-rounded terms is left with noise of up to
// about 2^-8 of the layer's gradients. It is an error for any other dtype.
func Noise(dt tensor.DType) (float64, error) {
	switch dt {
	case tensor.F32:
		return 1e-5, nil
	case tensor.BF16:
		return 1.0 / 256, nil
	}
	return 0, fmt.Errorf("gradcheck: no noise level for gradients in %s; use float32 or bfloat16", dt)
}

// Diff is how one tensor's gradient compares with its reference.
type Diff struct {
	Name string
	// Noise: the reference is below Floor, so Abs (‖got−want‖) is compared with Floor and Rel
	// is not meaningful. Otherwise Rel (‖got−want‖/‖want‖) is compared with the tolerance.
	Noise           bool
	Rel, Abs, Floor float64
}

// Ratio is the difference over what it may be: Abs/Floor for a noise-level tensor, Rel/tol
// otherwise. At most 1 passes; NaN never does.
func (d Diff) Ratio(tol float64) float64 {
	if d.Noise {
		return d.Abs / d.Floor
	}
	return d.Rel / tol
}

// Pass reports whether the tensor matches within tol (relative) or its noise floor.
func (d Diff) Pass(tol float64) bool { return d.Ratio(tol) <= 1 }

// String says what was compared, for a test's failure message.
func (d Diff) String() string {
	if d.Noise {
		return fmt.Sprintf("%s: noise-level reference gradient: |diff| %.3g, floor %.3g", d.Name, d.Abs, d.Floor)
	}
	return fmt.Sprintf("%s: relative difference %.3g", d.Name, d.Rel)
}

// Compare returns one Diff per tensor of want, sorted by name, with the floor of each taken
// as noise times the largest norm in want among the tensors of its decoder layer (LayerOf).
// got must hold every tensor of want, with the same length.
func Compare(got, want map[string][]float32, noise float64) ([]Diff, error) {
	scale := map[string]float64{}
	names := make([]string, 0, len(want))
	for n, w := range want {
		g, ok := got[n]
		if !ok {
			return nil, fmt.Errorf("gradcheck: no gradient %s to compare with the reference", n)
		}
		if len(g) != len(w) {
			return nil, fmt.Errorf("gradcheck: gradient %s has %d values, its reference %d", n, len(g), len(w))
		}
		names = append(names, n)
		l := LayerOf(n)
		scale[l] = math.Max(scale[l], norm(w))
	}
	slices.Sort(names)
	out := make([]Diff, 0, len(names))
	for _, n := range names {
		g, w := got[n], want[n]
		d := Diff{Name: n, Abs: diffNorm(g, w), Floor: noise * scale[LayerOf(n)]}
		wn := norm(w)
		d.Noise = wn < d.Floor
		switch {
		case wn > 0:
			d.Rel = d.Abs / wn
		case d.Abs > 0:
			d.Rel = math.Inf(1)
		}
		out = append(out, d)
	}
	return out, nil
}

// layerPrefix matches the parameters of one decoder layer.
var layerPrefix = regexp.MustCompile(`^model\.layers\.\d+\.`)

// LayerOf returns the decoder-layer prefix of a parameter name ("model.layers.3."), or "" for
// the parameters outside the layers (embeddings, final norm, head), which share one scale.
func LayerOf(name string) string { return layerPrefix.FindString(name) }

func norm(a []float32) float64 {
	var s float64
	for _, v := range a {
		s += float64(v) * float64(v)
	}
	return math.Sqrt(s)
}

func diffNorm(a, b []float32) float64 {
	var s float64
	for i := range a {
		d := float64(a[i]) - float64(b[i])
		s += d * d
	}
	return math.Sqrt(s)
}
