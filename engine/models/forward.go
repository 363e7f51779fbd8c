package models

import (
	"errors"
	"fmt"

	"github.com/halo-shell/halo-shell/engine/backend"
	"github.com/halo-shell/halo-shell/engine/tensor"
)

// ForwardBackward runs the model on a packed micro-batch with targets and accumulates into the
// gradient arena (+=) the gradient of lossScale * (sum of per-token cross-entropy over the
// non-ignored targets), plus AuxLossScale() * AuxLoss() for mixture-of-experts models. It returns that sum (unscaled, in float64) and the number of
// non-ignored targets. For the mean loss of an optimizer step over several micro-batches, count
// the step's targets first and pass lossScale = 1/total to every micro-batch.
func (m *Model) ForwardBackward(b Batch, lossScale float32) (lossSum float64, nTargets int, err error) {
	if b.Targets == nil {
		return 0, 0, errors.New("models: ForwardBackward needs Batch.Targets")
	}
	if err := m.lmOnly("ForwardBackward"); err != nil {
		return 0, 0, err
	}
	if m.Family.Host != nil {
		return m.hostForwardBackward(b, lossScale)
	}
	var loss tensor.Tensor
	defer func() {
		if !loss.IsNil() {
			_ = m.b.Free(loss)
		}
	}()
	r, err := m.forwardBackward(b, func(p *pass, _ *resolved, x tensor.Tensor) (tensor.Tensor, error) {
		var err error
		if loss, err = m.b.Alloc(tensor.F32, p.N); err != nil {
			return tensor.Tensor{}, err
		}
		return m.head.Loss(&p.Pass, x, p.targets, loss, tensor.Tensor{}, true, lossScale)
	})
	if err != nil {
		return 0, 0, err
	}
	return m.sumLoss(loss, r.targets)
}

// ForwardBackwardWeighted runs the model on a packed micro-batch with targets and lets the
// caller weigh each token's gradient after seeing the log-probs: weigh receives
// logprob[n] = log p(Targets[n] | document up to n) for every position (0 where the target
// is ignored) and returns scale [N], and the gradient of sum_n scale[n] * loss[n] (loss[n] =
// -logprob[n]), plus AuxLossScale() * AuxLoss() for mixture-of-experts models, accumulates
// into the gradient arena (+=). For a sequence-level loss L of the log-probs, scale[n] =
// -dL/dlogprob[n]. The blocks run forward once; the head runs twice (log-probs, then the
// weighted backward), which costs one more LM-head GEMM.
func (m *Model) ForwardBackwardWeighted(b Batch, weigh func(logprob []float32) ([]float32, error)) error {
	if b.Targets == nil {
		return errors.New("models: ForwardBackwardWeighted needs Batch.Targets")
	}
	if err := m.lmOnly("ForwardBackwardWeighted"); err != nil {
		return err
	}
	if m.Family.Host != nil {
		return m.hostWeighted(b, weigh)
	}
	var lpt, st tensor.Tensor
	defer func() {
		for _, t := range []tensor.Tensor{lpt, st} {
			if !t.IsNil() {
				_ = m.b.Free(t)
			}
		}
	}()
	_, err := m.forwardBackward(b, func(p *pass, _ *resolved, x tensor.Tensor) (tensor.Tensor, error) {
		var err error
		if lpt, err = m.b.Alloc(tensor.F32, p.N); err != nil {
			return tensor.Tensor{}, err
		}
		if _, err = m.head.Loss(&p.Pass, x, p.targets, tensor.Tensor{}, lpt, false, 0); err != nil {
			return tensor.Tensor{}, err
		}
		lp, err := backend.ToFloat32(m.b, lpt)
		if err != nil {
			return tensor.Tensor{}, err
		}
		scale, err := weigh(lp)
		if err != nil {
			return tensor.Tensor{}, err
		}
		if len(scale) != p.N {
			return tensor.Tensor{}, fmt.Errorf("models: ForwardBackwardWeighted: weigh returned %d scales for %d tokens", len(scale), p.N)
		}
		if st, err = backend.FromFloat32(m.b, scale, tensor.F32, p.N); err != nil {
			return tensor.Tensor{}, err
		}
		return m.head.LossScaled(&p.Pass, x, p.targets, st, tensor.Tensor{}, tensor.Tensor{}, true, 1)
	})
	return err
}

// forwardBackward runs the blocks forward with their caches, hands the head's input to head
// (which returns the new gradient dx [N,C] of the objective with respect to it, and
// accumulates the head's own gradients), then runs the blocks and the embedding backward.
func (m *Model) forwardBackward(b Batch, head func(p *pass, r *resolved, x tensor.Tensor) (tensor.Tensor, error)) (_ *resolved, err error) {
	if err := m.EnableGrads(); err != nil {
		return nil, err
	}
	r, err := m.resolve(&b)
	if err != nil {
		return nil, err
	}
	p, err := m.newPass(r)
	if err != nil {
		return nil, err
	}
	defer p.release(m.b)
	p.Train, p.DropoutKey = true, m.dropoutKey
	m.dropoutKey++
	// The gradients ZeroGrads left unfilled are written by their blocks' backward; any a
	// failed or partial pass did not reach are zeroed on the way out.
	p.Fresh = m.fresh
	defer func() {
		if serr := m.SettleGrads(); serr != nil && err == nil {
			err = serr
		}
	}()

	// xs[i] is the input of block i; xs[L] the input of the head.
	xs := make([]tensor.Tensor, 0, len(m.blocks)+1)
	var dx tensor.Tensor
	defer func() {
		for i := range m.blocks {
			m.blocks[i].Release(&p.Pass)
		}
		for i := range xs {
			if !xs[i].IsNil() {
				_ = m.b.Free(xs[i])
			}
		}
		if !dx.IsNil() {
			_ = m.b.Free(dx)
		}
	}()
	x, err := m.embed.Forward(&p.Pass, p.ids)
	if err != nil {
		return nil, err
	}
	xs = append(xs, x)
	if m.ple != nil {
		defer m.ple.release(&p.Pass)
		if err = m.ple.forward(&p.Pass, p.ids, x, m.blocks, true); err != nil {
			return nil, err
		}
	}
	for _, blk := range m.blocks {
		y, err := blk.Forward(&p.Pass, xs[len(xs)-1], true)
		if err != nil {
			return nil, err
		}
		xs = append(xs, y)
	}
	// The aux loss's gradient needs every MoE layer's routing statistics before the backward;
	// without it they are read after the backward, so that the host does not wait between the
	// two.
	early := m.moe.auxScale != 0
	if early {
		if err = m.moeAfterForward(true); err != nil {
			return nil, err
		}
	} else {
		m.clearAuxGrad()
	}
	if dx, err = head(p, r, xs[len(m.blocks)]); err != nil {
		return nil, err
	}
	for i := len(m.blocks) - 1; i >= 0; i-- {
		if dx, err = m.blocks[i].Backward(&p.Pass, dx); err != nil {
			return nil, err
		}
		_ = m.b.Free(xs[i+1])
		xs[i+1] = tensor.Tensor{}
	}
	if m.ple != nil {
		if err = m.ple.backward(&p.Pass, dx, p.ids); err != nil {
			return nil, err
		}
	}
	if err = m.embed.Backward(&p.Pass, dx, p.ids); err != nil {
		return nil, err
	}
	if early {
		// Recomputation re-ran the routing in the backward: read its (equal) statistics.
		err = m.moeFetch()
	} else {
		err = m.moeAfterForward(true)
	}
	if err != nil {
		return nil, err
	}
	return r, nil
}

func (m *Model) sumLoss(loss tensor.Tensor, targets []int32) (float64, int, error) {
	vals, err := backend.ToFloat32(m.b, loss)
	if err != nil {
		return 0, 0, err
	}
	sum, n := 0.0, 0
	for i, t := range targets {
		if t != backend.IgnoreIndex {
			sum += float64(vals[i])
			n++
		}
	}
	return sum, n, nil
}

// Forward runs the model without gradients (evaluation) and returns the summed cross-entropy
// over the non-ignored targets and their number. Nothing is cached.
func (m *Model) Forward(b Batch) (lossSum float64, nTargets int, err error) {
	if b.Targets == nil {
		return 0, 0, errors.New("models: Forward needs Batch.Targets")
	}
	loss, _, err := m.evalTokens(b, true, false)
	if err != nil {
		return 0, 0, err
	}
	for i, t := range b.Targets {
		if t != backend.IgnoreIndex {
			lossSum += float64(loss[i])
			nTargets++
		}
	}
	return lossSum, nTargets, nil
}

// TokenLogprobs returns, for each token n of a batch with targets, log p(Targets[n] | the
// tokens of its document up to n) in float32; ignored positions get 0.
func (m *Model) TokenLogprobs(b Batch) ([]float32, error) {
	if b.Targets == nil {
		return nil, errors.New("models: TokenLogprobs needs Batch.Targets")
	}
	_, lp, err := m.evalTokens(b, false, true)
	return lp, err
}

// Logprobs returns log p(ids[t] | ids[:t]) for t = 1..len(ids)-1 (len(ids)-1 values), the
// contract used to compare with transformers.
func (m *Model) Logprobs(ids []int32) ([]float32, error) {
	if len(ids) < 2 {
		return nil, fmt.Errorf("models: Logprobs needs at least 2 ids, got %d", len(ids))
	}
	tg := make([]int32, len(ids))
	copy(tg, ids[1:])
	tg[len(ids)-1] = backend.IgnoreIndex
	lp, err := m.TokenLogprobs(Batch{Tokens: ids, Targets: tg})
	if err != nil {
		return nil, err
	}
	return lp[:len(ids)-1], nil
}

// evalTokens runs an inference forward and returns per-token loss and/or logprob.
func (m *Model) evalTokens(b Batch, wantLoss, wantLP bool) (loss, lp []float32, err error) {
	if err := m.lmOnly("a language-model forward"); err != nil {
		return nil, nil, err
	}
	if m.Family.Host != nil {
		lp, err := m.hostRun(&b, nil)
		if err != nil {
			return nil, nil, err
		}
		if wantLoss {
			loss = make([]float32, len(lp))
			for i, v := range lp {
				loss[i] = -v
			}
		}
		if !wantLP {
			lp = nil
		}
		return loss, lp, nil
	}
	r, err := m.resolve(&b)
	if err != nil {
		return nil, nil, err
	}
	p, err := m.newPass(r)
	if err != nil {
		return nil, nil, err
	}
	defer p.release(m.b)
	x, err := m.hidden(&p.Pass, p.ids)
	if err != nil {
		return nil, nil, err
	}
	defer m.b.Free(x)
	var lt, lpt tensor.Tensor
	defer func() {
		for _, t := range []tensor.Tensor{lt, lpt} {
			if !t.IsNil() {
				_ = m.b.Free(t)
			}
		}
	}()
	if wantLoss {
		if lt, err = m.b.Alloc(tensor.F32, p.N); err != nil {
			return nil, nil, err
		}
	}
	if wantLP {
		if lpt, err = m.b.Alloc(tensor.F32, p.N); err != nil {
			return nil, nil, err
		}
	}
	if _, err = m.head.Loss(&p.Pass, x, p.targets, lt, lpt, false, 0); err != nil {
		return nil, nil, err
	}
	if wantLoss {
		if loss, err = backend.ToFloat32(m.b, lt); err != nil {
			return nil, nil, err
		}
	}
	if wantLP {
		if lp, err = backend.ToFloat32(m.b, lpt); err != nil {
			return nil, nil, err
		}
	}
	return loss, lp, nil
}

// hidden runs the embedding and every block without caching and returns the final residual
// stream [N,C] (before the final norm); the caller frees it.
func (m *Model) hidden(p *nnPass, ids tensor.Tensor) (tensor.Tensor, error) {
	if m.Family.Host != nil {
		return tensor.Tensor{}, m.errHostOnly("device hidden states (generation, scoring heads)")
	}
	x, err := m.embed.Forward(p, ids)
	if err != nil {
		return tensor.Tensor{}, err
	}
	if m.ple != nil {
		defer m.ple.release(p)
		if err = m.ple.forward(p, ids, x, m.blocks, false); err != nil {
			_ = m.b.Free(x)
			return tensor.Tensor{}, err
		}
	}
	for _, blk := range m.blocks {
		y, err := blk.Forward(p, x, false)
		_ = m.b.Free(x)
		if err != nil {
			return tensor.Tensor{}, err
		}
		x = y
	}
	if err := m.moeAfterForward(false); err != nil {
		_ = m.b.Free(x)
		return tensor.Tensor{}, err
	}
	return x, nil
}
