package backend

import (
	"fmt"

	"github.com/halo-shell/halo-shell/engine/tensor"
)

// Mixture-of-experts ops: the argument types of the optional capabilities that run the experts of
// a layer on the device (members of Optional in fused.go).
//
// Letters, beyond those of the package doc: E experts, K the top-k of the router, I the expert
// width, S = N*K routed slots (rows sorted by expert), M_e the rows of expert e, G groups of a
// grouped product (G = E). N_ and K_ are the generic sizes of one grouped product below, to keep
// them apart from the token count N and the top-k K.

// GroupedKind selects which of the three products of an expert projection GroupedGEMM computes.
type GroupedKind int

const (
	// GroupedForward: Out[r] = A[r] · B_g^T for every row r of group g.
	// A [S,K_] rows; B [G,N_,K_] per-group weights (the HF [out, in] layout); Out [S,N_].
	GroupedForward GroupedKind = iota
	// GroupedInputGrad: Out[r] = A[r] · B_g.
	// A [S,N_] = dY; B [G,N_,K_] the forward's weights; Out [S,K_] = dX.
	GroupedInputGrad
	// GroupedWeightGrad: Out_g = A_g^T · B_g, a reduction over the rows of group g.
	// A [S,N_] = dY; B [S,K_] = X, the forward's input rows; Out [G,N_,K_] = dW.
	// An empty group writes zeros into Out_g, or leaves it as it is when Accumulate.
	GroupedWeightGrad
)

// String names the kind as errors and profiles show it.
func (k GroupedKind) String() string {
	switch k {
	case GroupedForward:
		return "forward"
	case GroupedInputGrad:
		return "input-grad"
	case GroupedWeightGrad:
		return "weight-grad"
	}
	return fmt.Sprintf("GroupedKind(%d)", int(k))
}

// GroupedGEMMArgs describe one grouped product: G independent matrix products, one per expert,
// in one call. The row-stacked operands (A always, B for GroupedWeightGrad, Out for the other
// two kinds) hold the rows of group 0, then group 1, and so on, as Offsets says.
//
// The gate and up projections of an expert MLP are one weight [G, 2I, C] (per expert, rows
// 0..I-1 gate and I..2I-1 up), so that one GroupedForward computes both into Out [S, 2I].
//
// A and B are BF16 or F32 (a backend states which it supports), Out BF16 or F32; products
// accumulate in fp32 and are rounded into Out's dtype once. Out is "=" by default; with
// Accumulate it is "+=": Out = Out + product in fp32, rounded once (no separate rounding of
// the product). Out may not overlap A, B or Offsets.
type GroupedGEMMArgs struct {
	Kind GroupedKind
	A, B T
	Out  T
	// Offsets [G+1] I32, on the device: group g owns rows [Offsets[g], Offsets[g+1]) of the
	// row-stacked operands; non-decreasing, Offsets[0] = 0, Offsets[G] = S. Empty groups are
	// allowed. A device backend never reads it on the host (no synchronisation per layer); the
	// CPU backend checks it and refuses offsets that break these rules.
	Offsets T
	// Accumulate makes Out "+=" (parameter gradients, a dX summed over several uses).
	Accumulate bool
}

// GroupedDims are the sizes of a grouped product, as GroupedGEMMArgs.Dims derives them.
type GroupedDims struct {
	G    int // groups
	S    int // rows of the row-stacked operands
	N, K int // N_ and K_: B_g is [N_,K_] for GroupedForward and GroupedInputGrad
}

// FLOPs is the multiply-add count of the product, times two: 2*S*N_*K_ for every kind.
func (d GroupedDims) FLOPs() int64 { return 2 * int64(d.S) * int64(d.N) * int64(d.K) }

// Dims checks the shapes and dtypes of a (not the values of Offsets, which live on the device)
// and returns the sizes. Errors name the kind and the argument: "grouped-gemm forward: B ...".
// Backends wrap them with their package prefix.
func (a GroupedGEMMArgs) Dims() (GroupedDims, error) {
	op := "grouped-gemm " + a.Kind.String()
	var d GroupedDims
	need := func(name string, t T, rank int, shape string) error {
		if t.IsNil() {
			return fmt.Errorf("%s: %s is missing (want %s)", op, name, shape)
		}
		if t.Rank() != rank {
			return fmt.Errorf("%s: %s %v must be %d-D %s", op, name, t, rank, shape)
		}
		if !t.DType().IsFloat() {
			return fmt.Errorf("%s: %s %v: want a float tensor (bf16 or f32)", op, name, t)
		}
		return nil
	}
	same := func(name string, t T, want ...int) error {
		if !t.Shape().Equal(tensor.Shape(want)) {
			return fmt.Errorf("%s: %s %v: want shape %v", op, name, t, tensor.Shape(want))
		}
		return nil
	}
	var err error
	switch a.Kind {
	case GroupedForward, GroupedInputGrad:
		rowsName, outName := "A [S,K_]", "Out [S,N_]"
		if a.Kind == GroupedInputGrad {
			rowsName, outName = "A [S,N_]", "Out [S,K_]"
		}
		if err = need("B", a.B, 3, "[G,N_,K_]"); err != nil {
			return d, err
		}
		if err = need("A", a.A, 2, rowsName); err != nil {
			return d, err
		}
		d = GroupedDims{G: a.B.Dim(0), S: a.A.Dim(0), N: a.B.Dim(1), K: a.B.Dim(2)}
		in, out := d.K, d.N
		if a.Kind == GroupedInputGrad {
			in, out = d.N, d.K
		}
		if a.A.Dim(1) != in {
			return d, fmt.Errorf("%s: A %v: want %s with the last dimension %d of B %v", op, a.A, rowsName, in, a.B)
		}
		if err = need("Out", a.Out, 2, outName); err != nil {
			return d, err
		}
		if err = same("Out", a.Out, d.S, out); err != nil {
			return d, err
		}
	case GroupedWeightGrad:
		if err = need("Out", a.Out, 3, "[G,N_,K_]"); err != nil {
			return d, err
		}
		if err = need("A", a.A, 2, "[S,N_] (dY)"); err != nil {
			return d, err
		}
		if err = need("B", a.B, 2, "[S,K_] (X)"); err != nil {
			return d, err
		}
		d = GroupedDims{G: a.Out.Dim(0), S: a.A.Dim(0), N: a.Out.Dim(1), K: a.Out.Dim(2)}
		if err = same("A", a.A, d.S, d.N); err != nil {
			return d, err
		}
		if err = same("B", a.B, d.S, d.K); err != nil {
			return d, err
		}
	default:
		return d, fmt.Errorf("grouped-gemm: unknown kind %d: want GroupedForward, GroupedInputGrad or GroupedWeightGrad", int(a.Kind))
	}
	if d.G < 1 {
		return d, fmt.Errorf("%s: %d groups: want at least one", op, d.G)
	}
	if a.Offsets.IsNil() {
		return d, fmt.Errorf("%s: Offsets is missing (want [G+1] = [%d] i32)", op, d.G+1)
	}
	if a.Offsets.DType() != tensor.I32 {
		return d, fmt.Errorf("%s: Offsets %v: want i32", op, a.Offsets)
	}
	if a.Offsets.Numel() != d.G+1 {
		return d, fmt.Errorf("%s: Offsets %v has %d elements, want G+1 = %d (one more than the groups)", op, a.Offsets, a.Offsets.Numel(), d.G+1)
	}
	for _, o := range []struct {
		name string
		t    T
	}{{"A", a.A}, {"B", a.B}, {"Offsets", a.Offsets}} {
		if tensor.SameBuffer(a.Out, o.t) {
			return d, fmt.Errorf("%s: Out and %s overlap; use separate tensors", op, o.name)
		}
	}
	return d, nil
}

// CheckOffsets checks host values of GroupedGEMMArgs.Offsets against the contract for s rows.
func CheckOffsets(op string, off []int32, s int) error {
	if len(off) == 0 || off[0] != 0 {
		return fmt.Errorf("%s: Offsets[0] = %v: want 0", op, off[:min(1, len(off))])
	}
	for g := 1; g < len(off); g++ {
		if off[g] < off[g-1] {
			return fmt.Errorf("%s: Offsets[%d] = %d < Offsets[%d] = %d: offsets must be non-decreasing", op, g, off[g], g-1, off[g-1])
		}
	}
	if last := off[len(off)-1]; int(last) != s {
		return fmt.Errorf("%s: Offsets[G] = %d: want the row count S = %d", op, last, s)
	}
	return nil
}
