package cuda

import (
	"fmt"
	"math"

	"github.com/halo-shell/halo-shell/engine/backend"
)

// Host launchers of kernels/decode.cu: one batched decoding step on the device (the slotted
// KV-cache attention and the sampler). Neither waits for the GPU: positions uploaded from the
// host are checked against their host copy, and the sampled ids are recorded as lying in
// [0, V) so that the next step's Embedding of them needs no check on the device either.

const (
	decodeFile    = "decode.cu"
	decThreads    = 256  // DEC_THREADS
	decTile       = 128  // DEC_TILE
	decMaxAcc     = 32   // DEC_MAX_ACC
	sampleThreads = 1024 // SAMPLE_THREADS
)

// DecodeAttention implements backend.Optional.DecodeAttention.
func (b *Backend) DecodeAttention(a backend.DecodeAttentionArgs) error {
	const op = "DecodeAttention"
	B, err := a.Validate()
	if err != nil {
		return fmt.Errorf("cuda: %w", err)
	}
	G := a.NH / a.NKV
	if G*a.HD > decThreads*decMaxAcc {
		return fmt.Errorf("cuda: %s: %d query heads per kv head of dim %d exceed the kernel's %d accumulators per block", op, G, a.HD, decThreads*decMaxAcc)
	}
	arg := b.args(op)
	dt := arg.code("Q", a.Q)
	po, pl := arg.ptr("Out", a.Out), arg.opt("LSE", a.LSE)
	pq, pk, pv := arg.ptr("Q", a.Q), arg.ptr("K", a.K), arg.ptr("V", a.V)
	pck, pcv := arg.ptr("CacheK", a.CacheK), arg.ptr("CacheV", a.CacheV)
	pp := arg.i32("Positions", a.Positions)
	if err := arg.err(); err != nil {
		return err
	}
	if B == 0 {
		return nil
	}
	// Positions made on the device are not checked: the kernel skips rows outside the slot.
	if res, at, v := b.i32.checkRange(pp, B, int32(min(a.Cap, math.MaxInt32)), false); res == i32Bad {
		return fmt.Errorf("cuda: %s: row %d is at position %d, outside its cache slot [0, %d)", op, at, v, a.Cap)
	}
	scale := a.Scale
	if scale == 0 {
		scale = float32(1 / math.Sqrt(float64(a.HD)))
	}
	shared := uint32(4 * (G*a.HD + G*decTile + 3*G))
	args := packArgs(po, pl, pq, pk, pv, pck, pcv, pp, dt, int32(a.Cap), int32(a.NH), int32(a.NKV), int32(a.HD),
		scale, int32(min(a.Window, math.MaxInt32)))
	grid := [3]uint32{uint32(B), uint32(a.NKV), 1}
	return b.d.Post(func() error {
		return b.d.launchOnThread(decodeFile, "decode_attn", grid, [3]uint32{decThreads, 1, 1}, shared, args...)
	})
}

// SampleTokens implements backend.Optional.SampleTokens.
func (b *Backend) SampleTokens(a backend.SampleArgs) error {
	const op = "SampleTokens"
	B, V, err := a.Validate()
	if err != nil {
		return fmt.Errorf("cuda: %w", err)
	}
	arg := b.args(op)
	pl, dt := arg.float("Logits", a.Logits)
	po := arg.i32("Out", a.Out)
	var pb uintptr
	if !a.Bad.IsNil() {
		pb = arg.i32("Bad", a.Bad)
	}
	if err := arg.err(); err != nil {
		return err
	}
	if B == 0 {
		return nil
	}
	// The kernel writes ids in [0, V) only: record that, so that Embedding trusts them.
	b.i32.recordRange(po, B, 0, int32(V-1))
	if pb != 0 {
		b.i32.invalidate(pb, uint64(4*B))
	}
	args := packArgs(po, pb, pl, dt, int64(V), a.Softcap, a.Temperature, int32(min(a.TopK, math.MaxInt32)), a.TopP, a.Seed, a.Step)
	return b.d.Post(func() error {
		return b.d.launchOnThread(decodeFile, "sample_tokens", [3]uint32{uint32(B), 1, 1}, [3]uint32{sampleThreads, 1, 1}, 0, args...)
	})
}
