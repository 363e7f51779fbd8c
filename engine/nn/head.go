package nn

import (
	"fmt"
	"math"

	"github.com/halo-shell/halo-shell/engine/backend"
)

// Head is the final RMSNorm and the LM head with the fused causal-LM cross-entropy. W is
// lm_head.weight [V,C], or the embedding table when embeddings are tied (then GW is the
// embedding gradient, so both uses accumulate into one gradient).
//
// With LogitScale set the logits are multiplied by it (granite divides them by
// logits_scaling): the normed hidden states are scaled before the LM head, which is the same
// product, and their gradient by the same factor.
//
// With B set (lm_head.bias [V], gradient GB) the fused cross-entropy sees the bias as one more
// input column: hidden [N,C+1] with a last column of ones against [W | B] [V,C+1], built for
// each call (a copy of the head's weight), and the gradient of the last column is GB's.
type Head struct {
	Name       string
	Norm       RMSNorm
	W, GW      T
	B, GB      T
	ChunkRows  int     // tokens per cross-entropy chunk; 0 = backend default
	LogitScale float32 // 0 means 1
	// Softcap caps the logits after LogitScale, Softcap * tanh(logit / Softcap)
	// (final_logit_softcapping); 0 = none. Logits leaves them uncapped: see Logits.
	Softcap float32
}

// scaled reports whether the logits are scaled.
func (h *Head) scaled() bool { return h.LogitScale != 0 && h.LogitScale != 1 }

// Loss runs the head on x [N,C] with targets [N] I32 (IgnoreIndex skips a token), writing
// per-token loss and target logprob (both [N] F32, optional). With train set it also returns a
// new dx [N,C] (=) for d(gradScale * sum of losses)/dx and accumulates GW and the norm weight
// gradient (+=); otherwise dx is the zero tensor.
func (h *Head) Loss(p *Pass, x, targets, loss, logprob T, train bool, gradScale float32) (dx T, err error) {
	return h.LossScaled(p, x, targets, T{}, loss, logprob, train, gradScale)
}

// LossScaled is Loss with a per-token gradient scale: with tokenScale [N] F32 set, dx is
// d(gradScale * sum_n tokenScale[n] * loss[n])/dx (and GW and the norm weight gradient
// accumulate the same), so a sequence-level objective weighs each token by its own
// -dL/dlogprob.
func (h *Head) LossScaled(p *Pass, x, targets, tokenScale, loss, logprob T, train bool, gradScale float32) (dx T, err error) {
	hid, rstd, err := h.Norm.Forward(p, x)
	if err != nil {
		return T{}, err
	}
	var dh T
	defer func() { _ = free(p.B, &hid, &rstd, &dh) }()
	if h.scaled() {
		if err = p.B.Scale(hid, h.LogitScale); err != nil {
			return T{}, wrap(h.Name, err)
		}
	}
	args := backend.CrossEntropyArgs{
		Hidden: hid, Weight: h.W, Targets: targets, Loss: loss, LogProb: logprob,
		GradScale: gradScale, TokenScale: tokenScale, ChunkRows: h.ChunkRows, Softcap: h.Softcap,
	}
	if train {
		if dh, err = p.out(hid.Shape()...); err != nil {
			return T{}, wrap(h.Name, err)
		}
		args.DHidden, args.DWeight = dh, h.GW
	}
	if !h.B.IsNil() {
		err = h.biasedCrossEntropy(p, args, train)
	} else {
		err = p.B.CrossEntropy(args)
	}
	if err != nil {
		return T{}, wrap(h.Name+" cross-entropy", err)
	}
	if !train {
		return T{}, nil
	}
	if h.scaled() {
		if err = p.B.Scale(dh, h.LogitScale); err != nil {
			return T{}, wrap(h.Name, err)
		}
	}
	if dx, err = p.out(x.Shape()...); err != nil {
		return T{}, wrap(h.Name, err)
	}
	if err = h.Norm.Backward(p, dx, dh, x, rstd, false); err != nil {
		_ = free(p.B, &dx)
		return T{}, err
	}
	return dx, nil
}

// Logits returns new logits [M,V] for the hidden states x [M,C] (typically the last position
// of each sequence during generation), in the activation dtype, before Softcap: the caller
// caps them (SoftcapLogits) where it reads them.
func (h *Head) Logits(p *Pass, x T) (T, error) {
	hid, rstd, err := h.Norm.Forward(p, x)
	if err != nil {
		return T{}, err
	}
	defer func() { _ = free(p.B, &hid, &rstd) }()
	if h.scaled() {
		if err = p.B.Scale(hid, h.LogitScale); err != nil {
			return T{}, wrap(h.Name, err)
		}
	}
	lin := Linear{Name: h.Name, W: h.W, B: h.B}
	return lin.Forward(p, hid)
}

// SoftcapLogits applies the head's cap to logits read on the host, in place.
func (h *Head) SoftcapLogits(logits []float32) {
	if h.Softcap == 0 {
		return
	}
	c := float64(h.Softcap)
	for i, x := range logits {
		logits[i] = float32(c * math.Tanh(float64(x)/c))
	}
}

// biasedCrossEntropy runs the fused cross-entropy of args with the head's bias as a last input
// column (see Head), then hands the gradients of the augmented operands back to args.DHidden,
// GW and GB.
func (h *Head) biasedCrossEntropy(p *Pass, args backend.CrossEntropyArgs, train bool) (err error) {
	n, c := args.Hidden.Dim(0), args.Hidden.Dim(1)
	v := h.W.Dim(0)
	var hid, w, dh, dw T
	defer func() { _ = free(p.B, &hid, &w, &dh, &dw) }()
	cols := func(dst, src T, width, dstOff, srcOff int, acc bool) error {
		return p.B.CopyColumns(backend.ColumnCopyArgs{Dst: dst, Src: src, Groups: 1, Width: width,
			DstOffset: dstOff, SrcOffset: srcOff, Accumulate: acc})
	}
	if hid, err = p.B.Empty(args.Hidden.DType(), n, c+1); err != nil {
		return err
	}
	if w, err = p.B.Empty(h.W.DType(), v, c+1); err != nil {
		return err
	}
	b, err := h.B.Reshape(v, 1)
	if err != nil {
		return err
	}
	if err = p.B.Fill(hid, 1); err == nil {
		err = cols(hid, args.Hidden, c, 0, 0, false)
	}
	if err == nil {
		err = cols(w, h.W, c, 0, 0, false)
	}
	if err == nil {
		err = cols(w, b, 1, c, 0, false)
	}
	if err != nil {
		return fmt.Errorf("bias column: %w", err)
	}
	aug := args
	aug.Hidden, aug.Weight, aug.DHidden, aug.DWeight = hid, w, T{}, T{}
	if train {
		if dh, err = p.B.Empty(args.DHidden.DType(), n, c+1); err != nil {
			return err
		}
		aug.DHidden = dh
		if !h.GW.IsNil() || !h.GB.IsNil() {
			dt := h.GW.DType()
			if h.GW.IsNil() {
				dt = h.GB.DType()
			}
			if dw, err = p.B.Alloc(dt, v, c+1); err != nil {
				return err
			}
			aug.DWeight = dw
		}
	}
	if err = p.B.CrossEntropy(aug); err != nil || !train {
		return err
	}
	if err = cols(args.DHidden, dh, c, 0, 0, false); err != nil {
		return err
	}
	if !h.GW.IsNil() {
		if err = cols(h.GW, dw, c, 0, 0, true); err != nil {
			return err
		}
	}
	if !h.GB.IsNil() {
		gb, err := h.GB.Reshape(v, 1)
		if err == nil {
			err = cols(gb, dw, 1, 0, c, true)
		}
		if err != nil {
			return err
		}
	}
	return nil
}
