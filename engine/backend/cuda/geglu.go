package cuda

import (
	"fmt"
)

// Host launchers of kernels/geglu.cu: the GeGLU gate (tanh-approximated GELU), forward and
// backward.

// GeGLU computes out = gelu_tanh(gate) * up.
func (b *Backend) GeGLU(out, gate, up T) error {
	const op = "GeGLU"
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
	return b.launch1D("geglu.cu", "geglu_fwd", n, po, co, pg, cg, pu, cu, n)
}

// GeGLUBackward computes dGate and dUp.
func (b *Backend) GeGLUBackward(dGate, dUp, dOut, gate, up T) error {
	const op = "GeGLUBackward"
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
	return b.launch1D("geglu.cu", "geglu_bwd", n, pdg, cdg, pdu, cdu, pdo, cdo, pg, cg, pu, cu, n)
}
