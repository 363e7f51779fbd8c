package cuda

import (
	"fmt"
	"math"

	"github.com/halo-shell/halo-shell/engine/backend"
	"github.com/halo-shell/halo-shell/engine/tensor"
)

// Host launchers of kernels/adamw.cu: the fused AdamW step, with its per-step constants derived
// as the CPU backend derives them.

// AdamW runs one fused AdamW step.
func (b *Backend) AdamW(a backend.AdamWArgs) error {
	const op = "AdamW"
	n := int64(a.Param.Numel())
	for name, t := range map[string]T{"grad": a.Grad, "m": a.M, "v": a.V} {
		if int64(t.Numel()) != n {
			return fmt.Errorf("cuda: %s: %s %v must have %d elements like param %v", op, name, t, n, a.Param)
		}
	}
	if !a.Shadow.IsNil() && int64(a.Shadow.Numel()) != n {
		return fmt.Errorf("cuda: %s: shadow %v must have %d elements", op, a.Shadow, n)
	}
	if a.Step < 1 {
		return fmt.Errorf("cuda: %s: step %d must be >= 1", op, a.Step)
	}
	arg := b.args(op)
	pp, cp := arg.float("param", a.Param)
	pg, cg := arg.float("grad", a.Grad)
	pm, cm := arg.float("m", a.M)
	pv, cv := arg.float("v", a.V)
	ps, cs := arg.optFloat("shadow", a.Shadow)
	if err := arg.err(); err != nil {
		return err
	}
	k := adamwScalarsFor(a)
	st := int32(0)
	if a.Stochastic {
		st = 1
	}
	args := []any{pp, cp, pg, cg, pm, cm, pv, cv, ps, cs, n,
		k.w1, a.Beta2, k.w2, a.Eps, k.decay, k.stepSize, k.bc2Sqrt, k.gradScale, st, a.Seed, uint64(a.Step), a.ParamIndex}
	if adamwVec4(n, [][2]uintptr{{pp, uintptr(cp)}, {pg, uintptr(cg)}, {pm, uintptr(cm)}, {pv, uintptr(cv)}, {ps, uintptr(cs)}}) {
		return b.launch1D("adamw.cu", "adamw_step4", n/4, args...)
	}
	return b.launch1D("adamw.cu", "adamw_step", n, args...)
}

// adamwVec4 says whether adamw_step4 applies: n a multiple of 4 and every (pointer, dtype code)
// pair aligned for a 4-element access (16 bytes for F32, 8 for BF16); a null pointer (no shadow)
// is fine.
func adamwVec4(n int64, ptrs [][2]uintptr) bool {
	if n%4 != 0 {
		return false
	}
	for _, p := range ptrs {
		align := uintptr(8)
		if p[1] == uintptr(tensor.F32) {
			align = 16
		}
		if p[0]%align != 0 {
			return false
		}
	}
	return true
}

// adamwScalars are the per-step constants of the AdamW update.
type adamwScalars struct {
	w1, w2, decay, stepSize, bc2Sqrt, gradScale float32
}

// adamwScalarsFor derives the constants exactly as the CPU backend does (same float64 and float32
// operations; see engine/backend/cpu/adamw.go), and lets AdamWArgs' precise fields override them,
// so that both backends run the same update from the same numbers.
func adamwScalarsFor(a backend.AdamWArgs) adamwScalars {
	k := adamwScalars{gradScale: a.GradScale}
	if k.gradScale == 0 {
		k.gradScale = 1
	}
	b1, b2 := a.Beta1, a.Beta2
	bc1 := 1 - math.Pow(float64(b1), float64(a.Step))
	bc2 := 1 - math.Pow(float64(b2), float64(a.Step))
	k.stepSize = float32(float64(a.LR) / bc1)
	k.bc2Sqrt = float32(math.Sqrt(bc2))
	k.decay = 1 - a.LR*a.WeightDecay
	k.w1, k.w2 = 1-b1, 1-b2
	for _, o := range []struct {
		dst *float32
		v   float32
	}{{&k.stepSize, a.StepSize}, {&k.bc2Sqrt, a.BC2Sqrt}, {&k.decay, a.Decay}, {&k.w1, a.Weight1}, {&k.w2, a.Weight2}} {
		if o.v != 0 {
			*o.dst = o.v
		}
	}
	return k
}
