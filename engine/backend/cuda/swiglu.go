package cuda

import (
	"fmt"
)

// Host launchers of kernels/swiglu.cu: the SwiGLU gate, forward and backward.

// SwiGLU computes out = silu(gate) * up.
func (b *Backend) SwiGLU(out, gate, up T) error {
	const op = "SwiGLU"
	if out.Numel() != gate.Numel() || up.Numel() != gate.Numel() {
		return fmt.Errorf("cuda: %s: out %v, gate %v, up %v differ in element count", op, out, gate, up)
	}
	arg := b.args(op)
	po, co := arg.float("out", out)
	pg, cg := arg.float("gate", gate)
	pu, cu := arg.float("up", up)
	if err := arg.err(); err != nil {
		return err
	}
	n := int64(out.Numel())
	if vec8(n, []int32{co, cg, cu}, po, pg, pu) {
		return b.launch1D("swiglu.cu", "swiglu_fwd_bf16x8", n/8, po, pg, pu, n/8)
	}
	return b.launch1D("swiglu.cu", "swiglu_fwd", n, po, co, pg, cg, pu, cu, n)
}

// SwiGLUBackward computes dGate and dUp.
func (b *Backend) SwiGLUBackward(dGate, dUp, dOut, gate, up T) error {
	const op = "SwiGLUBackward"
	n := int64(gate.Numel())
	for _, t := range []T{dGate, dUp, dOut, up} {
		if int64(t.Numel()) != n {
			return fmt.Errorf("cuda: %s: dGate %v, dUp %v, dOut %v, gate %v, up %v differ in element count", op, dGate, dUp, dOut, gate, up)
		}
	}
	arg := b.args(op)
	pdg, cdg := arg.float("dGate", dGate)
	pdu, cdu := arg.float("dUp", dUp)
	pdo, cdo := arg.float("dOut", dOut)
	pg, cg := arg.float("gate", gate)
	pu, cu := arg.float("up", up)
	if err := arg.err(); err != nil {
		return err
	}
	if vec8(n, []int32{cdg, cdu, cdo, cg, cu}, pdg, pdu, pdo, pg, pu) {
		return b.launch1D("swiglu.cu", "swiglu_bwd_bf16x8", n/8, pdg, pdu, pdo, pg, pu, n/8)
	}
	return b.launch1D("swiglu.cu", "swiglu_bwd", n, pdg, cdg, pdu, cdu, pdo, cdo, pg, cg, pu, cu, n)
}

// SwiGLUClamped implements backend.Ops.SwiGLUClamped (gpt-oss's expert activation).
func (b *Backend) SwiGLUClamped(out, gateUp T, alpha, limit float32) error {
	const op = "SwiGLUClamped"
	if gateUp.Rank() != 2 || gateUp.Dim(1)%2 != 0 || out.Numel()*2 != gateUp.Numel() {
		return fmt.Errorf("cuda: %s: gateUp %v must be [R, 2I] and out %v [R, I]", op, gateUp, out)
	}
	arg := b.args(op)
	po, co := arg.float("out", out)
	pg, cg := arg.float("gateUp", gateUp)
	if err := arg.err(); err != nil {
		return err
	}
	n := int64(out.Numel())
	return b.launch1D("swiglu.cu", "swiglu_clamped_fwd", n, po, co, pg, cg, alpha, limit, n)
}

// SwiGLUClampedBackward implements backend.Ops.SwiGLUClampedBackward.
func (b *Backend) SwiGLUClampedBackward(dGateUp, dOut, gateUp T, alpha, limit float32) error {
	const op = "SwiGLUClampedBackward"
	if gateUp.Rank() != 2 || gateUp.Dim(1)%2 != 0 || dOut.Numel()*2 != gateUp.Numel() || dGateUp.Numel() != gateUp.Numel() {
		return fmt.Errorf("cuda: %s: gateUp %v and dGateUp %v must be [R, 2I] and dOut %v [R, I]", op, gateUp, dGateUp, dOut)
	}
	arg := b.args(op)
	pdg, cdg := arg.float("dGateUp", dGateUp)
	pd, cd := arg.float("dOut", dOut)
	pg, cg := arg.float("gateUp", gateUp)
	if err := arg.err(); err != nil {
		return err
	}
	n := int64(dOut.Numel())
	return b.launch1D("swiglu.cu", "swiglu_clamped_bwd", n, pdg, cdg, pd, cd, pg, cg, alpha, limit, n)
}
