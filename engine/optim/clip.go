package optim

import (
	"fmt"
	"math"

	"github.com/halo-shell/halo-shell/engine/backend"
	"github.com/halo-shell/halo-shell/engine/tensor"
)

// GradNorm returns the global L2 norm of all gradients (sqrt of the sum of squares, accumulated
// in float64). It synchronises the backend.
func GradNorm(b backend.Backend, grads []tensor.Tensor) (float64, error) {
	ss, err := b.SumSquares(grads)
	if err != nil {
		return 0, fmt.Errorf("optim: grad norm: %w", err)
	}
	var s float64
	for _, v := range ss {
		s += v
	}
	return math.Sqrt(s), nil
}

// ClipCoef returns the factor torch.nn.utils.clip_grad_norm_ multiplies gradients by:
// min(1, maxNorm / (norm + 1e-6)), computed in float32 as torch does. maxNorm <= 0 disables
// clipping (factor 1). A NaN norm gives NaN and an infinite one 0: callers should check the norm
// and skip a step whose gradients are not finite.
func ClipCoef(norm, maxNorm float64) float64 {
	if maxNorm <= 0 {
		return 1
	}
	// torch computes the coefficient in float32.
	c := float64(float32(maxNorm) / (float32(norm) + 1e-6))
	if c > 1 {
		return 1
	}
	return c
}
