package nn

import (
	"errors"
	"fmt"

	"github.com/halo-shell/halo-shell/engine/backend"
	"github.com/halo-shell/halo-shell/engine/tensor"
)

// T is a tensor (a view into device memory owned by a backend).
type T = tensor.Tensor

// Pass is the geometry of one micro-batch, shared by every layer of one forward (and its
// backward). The model builds it once per micro-batch; layers only read it.
type Pass struct {
	// B runs every op.
	B backend.Backend
	// DType of activations (F32 or BF16).
	DType tensor.DType
	// N is the number of query tokens (rows of every activation).
	N int
	// Positions [N] I32: each token's position in its document.
	Positions T
	// CuSeqlens [D+1] I32: query document boundaries.
	CuSeqlens T
	// CuSeqlensK [D+1] I32: key boundaries when keys come from a KV cache (decoding); zero
	// tensor otherwise.
	CuSeqlensK T
	// MaxSeqLen is the longest document (a hint for the attention op).
	MaxSeqLen int
	// InvFreq [R/2] F32 and AttentionScaling are the rotary tables of this micro-batch.
	InvFreq          T
	AttentionScaling float32
	// LocalInvFreq [R/2] F32 and LocalAttentionScaling are the rotary tables of the layers
	// with Attention.LocalRope (sliding layers of families with a second RoPE base); zero
	// otherwise.
	LocalInvFreq          T
	LocalAttentionScaling float32
	// Cache, when set, holds per-layer key/value caches: attention appends this pass's keys and
	// values at rows [CacheLen, CacheLen+N) and attends over rows [0, CacheLen+N).
	Cache    []*KVCache
	CacheLen int
	// CacheGather [Nk] I32, optional with Cache: after appending, attention gathers rows
	// CacheGather[j] of [0, CacheLen+N) into the cache's spare buffers (row j), swaps them in and
	// attends over rows [0, Nk), with CuSeqlensK giving each document's keys. Batched decoding
	// uses it to keep every sequence's keys contiguous (old rows, then its new one) and to drop
	// finished sequences, in one gather per layer.
	CacheGather T
	// StateRows, when decoding, maps document j of the pass to the row of the gated delta-net
	// layers' LinearState it continues (the previous pass's document of that index); nil
	// starts every document fresh (the prefill).
	StateRows []int
	// Slots, when set (instead of Cache), is a slotted KV cache for batched decoding on the
	// device (SlotCache).
	Slots *SlotCache
	// Train marks a training pass: adapter dropout is active only there.
	Train bool
	// DropoutKey selects this micro-batch's dropout masks (the model advances it once per
	// training forward); a recomputed forward and the backward of the same pass reuse it.
	DropoutKey uint64
	// NoAdapters runs every Linear without its LoRA adapter (the base model alone).
	NoAdapters bool
	// Scratch receives the bf16 weights of quantised linears (Linear.Quant); the model owns it
	// and shares it across its layers and passes. Required only when a layer is quantised.
	Scratch *WeightScratch
	// Fresh, when set, holds the gradients this optimizer step has not written yet, which hold
	// no values: their first write overwrites them (FreshGrads). nil: every gradient holds
	// values (zeros after ZeroGrads) and every write accumulates.
	Fresh *FreshGrads
}

// alloc returns a zeroed activation of the pass dtype.
func (p *Pass) alloc(shape ...int) (T, error) { return p.B.Alloc(p.DType, shape...) }

// allocF32 returns a zeroed F32 tensor (statistics: rstd, lse).
func (p *Pass) allocF32(shape ...int) (T, error) { return p.B.Alloc(tensor.F32, shape...) }

// out returns an activation of the pass dtype with undefined contents (backend Empty), for the
// output of an op that writes all of it (=); tensors that are accumulated into (+=) come from
// alloc.
func (p *Pass) out(shape ...int) (T, error) { return p.B.Empty(p.DType, shape...) }

// outF32 is out for F32 statistics (rstd, lse).
func (p *Pass) outF32(shape ...int) (T, error) { return p.B.Empty(tensor.F32, shape...) }

// free releases tensors allocated by this package; zero tensors are skipped. The first error
// is returned but every tensor is attempted.
func free(b backend.Backend, ts ...*T) error {
	var errs []error
	for _, t := range ts {
		if t == nil || t.IsNil() {
			continue
		}
		if err := b.Free(*t); err != nil {
			errs = append(errs, err)
		}
		*t = T{}
	}
	return errors.Join(errs...)
}

// errorf prefixes an error with the layer name.
func wrap(layer string, err error) error {
	if err == nil {
		return nil
	}
	return fmt.Errorf("nn: %s: %w", layer, err)
}

// SlotCache is a slotted KV cache for batched decoding on the device (backend
// Optional.DecodeAttention): row b of the batch owns rows [b*Cap, (b+1)*Cap) of every layer's K
// and V, its key at position j being row b*Cap+j, so a decoding step appends in place and no
// row ever moves.
type SlotCache struct {
	// Layers holds per layer (indexed by Attention.Layer) K and V [B*Cap, NKV*HD]; K2 and V2
	// are unused.
	Layers []*KVCache
	Cap    int
	// Fill [B*Cap] I32 marks the prefill pass: attention runs over the pass's packed prompts as
	// it does without a cache, then cache row i of each layer becomes the pass's key (value) row
	// Fill[i] (rows past a prompt take any row: they are written before they are read). Without
	// Fill the pass is a decoding step of one token per row, at Pass.Positions.
	Fill T
}
