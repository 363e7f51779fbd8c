package cuda

import (
	"fmt"
)

// SwiGLU computes out = silu(gate) * up.
func (b *Backend) SwiGLU(out, gate, up T) error {
	const op = "SwiGLU"
	if out.Numel() != gate.Numel() || up.Numel() != gate.Numel() {
		return fmt.Errorf("cuda: %s: out %v, gate %v, up %v differ in element count", op, out, gate, up)
	}
	po, co, err := b.fptr(op, "out", out)
	if err != nil {
		return err
	}
	pg, cg, err := b.fptr(op, "gate", gate)
	if err != nil {
		return err
	}
	pu, cu, err := b.fptr(op, "up", up)
	if err != nil {
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
	pdg, cdg, err := b.fptr(op, "dGate", dGate)
	if err != nil {
		return err
	}
	pdu, cdu, err := b.fptr(op, "dUp", dUp)
	if err != nil {
		return err
	}
	pdo, cdo, err := b.fptr(op, "dOut", dOut)
	if err != nil {
		return err
	}
	pg, cg, err := b.fptr(op, "gate", gate)
	if err != nil {
		return err
	}
	pu, cu, err := b.fptr(op, "up", up)
	if err != nil {
		return err
	}
	if vec8(n, []int32{cdg, cdu, cdo, cg, cu}, pdg, pdu, pdo, pg, pu) {
		return b.launch1D("swiglu.cu", "swiglu_bwd_bf16x8", n/8, pdg, pdu, pdo, pg, pu, n/8)
	}
	return b.launch1D("swiglu.cu", "swiglu_bwd", n, pdg, cdg, pdu, cdu, pdo, cdo, pg, cg, pu, cu, n)
}
