package models

import (
	"fmt"

	"github.com/halo-shell/halo-shell/engine/backend"
	"github.com/halo-shell/halo-shell/engine/nn"
	"github.com/halo-shell/halo-shell/engine/tensor"
)

// Batch is one packed micro-batch: documents concatenated into one row of N tokens.
type Batch struct {
	// Tokens [N] are the input ids.
	Tokens []int32
	// Positions [N] are each token's position within its document (restarting at 0 per
	// document). Nil means: derived from DocStarts.
	Positions []int32
	// DocStarts [D+1] are the cumulative document boundaries (cu_seqlens): DocStarts[0] = 0,
	// DocStarts[D] = N. Nil means: derived from Positions (a document starts wherever the
	// position is 0), or one document when Positions is nil too.
	DocStarts []int32
	// Targets [N] are the ids to predict at each position (usually the next token of the same
	// document); backend.IgnoreIndex (-100) excludes a position from the loss. Nil means no
	// loss (Forward then only runs the model).
	Targets []int32
}

// resolved is a validated batch with positions and boundaries filled in.
type resolved struct {
	tokens, positions, cu, targets []int32
	maxLen, maxPos                 int
}

func (m *Model) resolve(b *Batch) (*resolved, error) {
	n := len(b.Tokens)
	if n == 0 {
		return nil, fmt.Errorf("models: batch has no tokens")
	}
	r := &resolved{tokens: b.Tokens, positions: b.Positions, cu: b.DocStarts, targets: b.Targets}
	for i, t := range b.Tokens {
		if t < 0 || int(t) >= m.Arch.Vocab {
			return nil, fmt.Errorf("models: batch token %d at position %d is outside the vocabulary [0,%d)", t, i, m.Arch.Vocab)
		}
	}
	if r.positions != nil && len(r.positions) != n {
		return nil, fmt.Errorf("models: batch has %d positions for %d tokens", len(r.positions), n)
	}
	if r.targets != nil && len(r.targets) != n {
		return nil, fmt.Errorf("models: batch has %d targets for %d tokens", len(r.targets), n)
	}
	for i, t := range r.targets {
		if t != backend.IgnoreIndex && (t < 0 || int(t) >= m.Arch.Vocab) {
			return nil, fmt.Errorf("models: batch target %d at position %d is outside the vocabulary [0,%d) (use %d to ignore a position)", t, i, m.Arch.Vocab, backend.IgnoreIndex)
		}
	}
	if r.cu == nil {
		if r.positions == nil {
			r.cu = []int32{0, int32(n)}
		} else {
			r.cu = []int32{0}
			for i := 1; i < n; i++ {
				if r.positions[i] == 0 {
					r.cu = append(r.cu, int32(i))
				}
			}
			r.cu = append(r.cu, int32(n))
		}
	}
	if len(r.cu) < 2 || r.cu[0] != 0 || int(r.cu[len(r.cu)-1]) != n {
		return nil, fmt.Errorf("models: batch DocStarts must start at 0 and end at %d (the token count), got %v", n, r.cu)
	}
	for d := 1; d < len(r.cu); d++ {
		l := int(r.cu[d] - r.cu[d-1])
		if l <= 0 {
			return nil, fmt.Errorf("models: batch DocStarts must be strictly increasing, got %v at document %d", r.cu[d-1:d+1], d-1)
		}
		r.maxLen = max(r.maxLen, l)
	}
	if r.positions == nil {
		r.positions = make([]int32, n)
		for d := 1; d < len(r.cu); d++ {
			for i := r.cu[d-1]; i < r.cu[d]; i++ {
				r.positions[i] = i - r.cu[d-1]
			}
		}
	}
	for i, p := range r.positions {
		if p < 0 {
			return nil, fmt.Errorf("models: batch position %d at token %d is negative", p, i)
		}
		r.maxPos = max(r.maxPos, int(p))
	}
	return r, nil
}

type nnPass = nn.Pass

// pass uploads a resolved batch and returns the layer geometry; release frees its tensors.
type pass struct {
	nn.Pass
	ids, targets tensor.Tensor
}

func (m *Model) newPass(r *resolved) (*pass, error) {
	if err := m.ropeFor(r.maxPos + 1); err != nil {
		return nil, err
	}
	p := &pass{Pass: nn.Pass{
		B: m.b, DType: m.opts.DType, N: len(r.tokens), MaxSeqLen: r.maxLen,
		InvFreq: m.invFreq, AttentionScaling: m.attnScale, NoAdapters: m.adaptersOff,
		LocalInvFreq: m.localInvFreq, LocalAttentionScaling: m.localScale,
		Scratch: m.scratch(),
	}}
	var err error
	if p.ids, err = backend.FromInt32(m.b, r.tokens, len(r.tokens)); err != nil {
		return nil, err
	}
	if p.Positions, err = backend.FromInt32(m.b, r.positions, len(r.positions)); err != nil {
		p.release(m.b)
		return nil, err
	}
	if p.CuSeqlens, err = backend.FromInt32(m.b, r.cu, len(r.cu)); err != nil {
		p.release(m.b)
		return nil, err
	}
	if r.targets != nil {
		if p.targets, err = backend.FromInt32(m.b, r.targets, len(r.targets)); err != nil {
			p.release(m.b)
			return nil, err
		}
	}
	return p, nil
}

func (p *pass) release(b backend.Backend) {
	for _, t := range []*tensor.Tensor{&p.ids, &p.targets, &p.Positions, &p.CuSeqlens, &p.CuSeqlensK} {
		if !t.IsNil() {
			_ = b.Free(*t)
			*t = tensor.Tensor{}
		}
	}
}
