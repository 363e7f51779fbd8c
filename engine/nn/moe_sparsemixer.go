package nn

import (
	"fmt"
	"math"

	"github.com/halo-shell/halo-shell/engine/backend"
)

// SparseMixer is Phi-3.5-MoE's router (transformers' sparsemixer) in its deterministic form,
// the one transformers runs outside training. It always picks two experts, in two stages over
// the router logits z of a token:
//
//	stage 1: i1 = argmax z (first on ties), m = z[i1]
//	stage 2: i2 = argmax of z without i1, m = z[i2]
//	in each stage U = { j : (m - z_j) / max(|z_j|, m) <= 2*Eps } (stage 2 also drops i1),
//	         g = softmax of z over U (zero outside), w = g[i]
//
// The two weights are used as they are (no renormalisation, no scaling). Their gradient is
// that of the softmax over the kept set; the sets themselves are piecewise constant.
//
// transformers' training mode replaces both argmaxes by Gumbel samples and the backward by a
// Heun's-method estimator with a random midpoint mask; those are random draws the engine does
// not reproduce, so a block with a SparseMixer computes the deterministic routing and its exact
// gradient in training too.
type SparseMixer struct {
	// Eps is router_jitter_noise: the relative gap to the stage's best logit beyond which an
	// expert leaves the stage's softmax.
	Eps float64
}

// sparseMixerStage runs one stage over the row z, skipping expert skip (-1: none): it writes
// the stage's softmax into g (zero outside the kept set) and returns the chosen expert.
func sparseMixerStage(g []float64, z []float32, skip int, eps float64) int {
	best := -1
	for j, v := range z {
		if j != skip && (best < 0 || v > z[best]) {
			best = j
		}
	}
	m := z[best]
	// The threshold test runs in fp32, as transformers computes it in the logits' dtype.
	thr := float32(2 * eps)
	sum := 0.0
	for j, v := range z {
		g[j] = 0
		if j == skip {
			continue
		}
		factor := float32(math.Max(math.Abs(float64(v)), float64(m)))
		if (m-v)/factor > thr {
			continue
		}
		g[j] = math.Exp(float64(v) - float64(m))
		sum += g[j]
	}
	for j := range g {
		g[j] /= sum
	}
	return best
}

// route fills sel [2] and w [2] for one token's logits z.
func (s *SparseMixer) route(sel []int32, w []float32, z []float32) {
	g := make([]float64, len(z))
	i1 := sparseMixerStage(g, z, -1, s.Eps)
	w[0] = float32(g[i1])
	i2 := sparseMixerStage(g, z, i1, s.Eps)
	w[1] = float32(g[i2])
	sel[0], sel[1] = int32(i1), int32(i2)
}

// grad adds to dz [E] the gradient with respect to one token's logits z of an objective whose
// gradient with respect to the two routing weights is dw [2].
func (s *SparseMixer) grad(dz []float32, z []float32, dw []float64) {
	g := make([]float64, len(z))
	skip := -1
	for k := 0; k < 2; k++ {
		i := sparseMixerStage(g, z, skip, s.Eps)
		c := dw[k] * g[i]
		for j, gj := range g {
			d := -gj
			if j == i {
				d++
			}
			dz[j] += float32(c * d)
		}
		skip = i
	}
}

// check reports a block the sparsemixer cannot route: it picks exactly two of at least two
// experts.
func (s *SparseMixer) check(name string, e, k int) error {
	if k != 2 {
		return fmt.Errorf("nn: %s: the sparsemixer router picks exactly 2 experts, not %d; set num_experts_per_tok to 2", name, k)
	}
	if e < 2 {
		return fmt.Errorf("nn: %s: the sparsemixer router needs at least 2 experts, got %d", name, e)
	}
	if s.Eps < 0 || math.IsNaN(s.Eps) {
		return fmt.Errorf("nn: %s: the sparsemixer threshold (router_jitter_noise) %v must be non-negative", name, s.Eps)
	}
	return nil
}

// checkSparseMixer refuses a block that combines the sparsemixer with settings of the top-k
// router it replaces.
func (m *MoE) checkSparseMixer(e, k int) error {
	if err := m.SparseMixer.check(m.Name, e, k); err != nil {
		return err
	}
	rt := m.routing()
	if m.NormTopK || m.Bias != nil || !m.ScoreBias.IsNil() || rt.Grouped() || rt.Scaling() != 1 || m.Score != backend.RouterSoftmax {
		return fmt.Errorf("nn: %s: the sparsemixer router takes no renormalisation, balancing bias, expert groups, routed scaling or sigmoid score", m.Name)
	}
	return nil
}

// SparseMixerSets returns which experts the two stages of each token kept in the cached
// host-path forward ([N,2,E]: token-major, then stage), or nil when the block has no
// SparseMixer. The loss is smooth in the router logits only while these sets (and the
// choices) stay the same, which gradient checks need to know.
func (m *MoE) SparseMixerSets() []bool {
	if m.SparseMixer == nil || m.r.E == 0 {
		return nil
	}
	e := m.r.E
	n := len(m.smLogits) / e
	out := make([]bool, 0, n*2*e)
	g := make([]float64, e)
	for t := 0; t < n; t++ {
		z := m.smLogits[t*e : (t+1)*e]
		skip := -1
		for k := 0; k < 2; k++ {
			skip = sparseMixerStage(g, z, skip, m.SparseMixer.Eps)
			for _, v := range g {
				out = append(out, v > 0)
			}
		}
	}
	return out
}
