package cuda

import (
	"fmt"

	"github.com/halo-shell/halo-shell/engine/backend"
	"github.com/halo-shell/halo-shell/engine/tensor"
)

// Host launchers of kernels/rope.cu: rotary position embedding, forward and transpose.

// RoPE rotates the first R dims of each head.
func (b *Backend) RoPE(out, x T, a backend.RoPEArgs) error { return b.rope("RoPE", out, x, a, 1) }

// RoPEBackward applies the transpose rotation.
func (b *Backend) RoPEBackward(dX, dY T, a backend.RoPEArgs) error {
	return b.rope("RoPEBackward", dX, dY, a, -1)
}

func (b *Backend) rope(op string, out, x T, a backend.RoPEArgs, sign float32) error {
	H, HD := a.Heads, a.HeadDim
	R := a.RotaryDim
	if R == 0 {
		R = HD
	}
	if H <= 0 || HD <= 0 || R <= 0 || R%2 != 0 || R > HD {
		return fmt.Errorf("cuda: %s: heads %d, head dim %d, rotary dim %d: need heads, head dim > 0 and an even rotary dim <= head dim", op, H, HD, R)
	}
	if x.Numel()%(H*HD) != 0 || out.Numel() != x.Numel() {
		return fmt.Errorf("cuda: %s: x %v and out %v must be [N, %d*%d]", op, x, out, H, HD)
	}
	N := x.Numel() / (H * HD)
	if a.Positions.Numel() != N {
		return fmt.Errorf("cuda: %s: positions %v must have N=%d elements", op, a.Positions, N)
	}
	if a.InvFreq.DType() != tensor.F32 || a.InvFreq.Numel() < R/2 {
		return fmt.Errorf("cuda: %s: inv_freq %v must be f32 with R/2=%d elements", op, a.InvFreq, R/2)
	}
	arg := b.args(op)
	po, co := arg.float("out", out)
	px, cx := arg.float("x", x)
	pp := arg.i32("positions", a.Positions)
	pf := arg.ptr("inv_freq", a.InvFreq)
	if err := arg.err(); err != nil {
		return err
	}
	s := a.AttentionScaling
	if s == 0 {
		s = 1
	}
	inter := int32(0)
	if a.Interleaved {
		inter = 1
	}
	if !a.Interleaved && R == HD && (HD/2)%4 == 0 && co == int32(tensor.BF16) && cx == int32(tensor.BF16) && po%8 == 0 && px%8 == 0 {
		return b.launch1D("rope.cu", "rope_bf16x4", int64(N)*int64(HD/8), po, px, pp, pf, int64(N), int32(H), int32(HD), s, sign)
	}
	total := int64(N) * int64(H) * int64(HD-R/2)
	return b.launch1D("rope.cu", "rope", total, po, co, px, cx, pp, pf, int64(N), int32(H), int32(HD), int32(R), s, sign, inter)
}
