package models

import (
	"encoding/binary"
	"fmt"
	"slices"
	"strconv"
	"strings"

	"github.com/halo-shell/halo-shell/engine/backend"
	"github.com/halo-shell/halo-shell/engine/nn"
	"github.com/halo-shell/halo-shell/engine/tensor"
	"github.com/halo-shell/halo-shell/internal/switches"
)

// The device decoder: GenerateBatch with the KV cache, the logits and the sampled ids all on the
// device (backend Optional.DecodeAttention and Optional.SampleTokens). Every row keeps its own
// slot of the cache for the whole call, so a step appends in place; each step's ids are written
// by the sampler straight into the buffer the next step embeds from; and the host reads the ids
// only every HALO_GENERATE_CHECK_EVERY steps, to find the rows that stopped. A decoding step
// thus uploads nothing, allocates none of the decoder's buffers (the layers' activations come
// from the backend's allocator, which reuses them) and makes the host wait not at all between
// two reads of the ids.
//
// Rows that have stopped keep decoding until the next read (their tokens past the stop are
// dropped), and the batch never shrinks: the cost of a step is that of B rows until every row
// has stopped.

var (
	swGenerate = switches.Register(switches.Switch{Name: "HALO_GENERATE", Kind: switches.Tuning,
		Default: "auto", Values: []string{"auto", "host", "device"},
		Doc: "Batched generation: device keeps the KV cache, the logits and the sampling on the device (slotted cache, DecodeAttention, SampleTokens) and reads the ids every few steps; host regathers the cache each step and samples downloaded logits on the host; auto is device on every backend that has both ops except the CPU, whose logits are already on the host."})
	swGenerateCheck = switches.Register(switches.Switch{Name: "HALO_GENERATE_CHECK_EVERY", Kind: switches.Tuning,
		Default: "8",
		Doc:     "Decoding steps between two reads of the sampled ids by the device decoder (1 to 256): the rows that reached a stop token are found then, and OnToken callbacks receive the tokens."})
)

// checkEvery is HALO_GENERATE_CHECK_EVERY, validated.
func checkEvery() (int, error) {
	v := swGenerateCheck.Value()
	n, err := strconv.Atoi(v)
	if err != nil || n < 1 || n > 256 {
		return 0, fmt.Errorf("models: HALO_GENERATE_CHECK_EVERY=%q: want a whole number of steps from 1 to 256", v)
	}
	return n, nil
}

// deviceDecoding reports whether GenerateBatch takes the device decoder: HALO_GENERATE, the
// backend's decoding ops and the model's attention decide.
func (m *Model) deviceDecoding() (bool, error) {
	mode := swGenerate.Value()
	if err := swGenerate.Check(); err != nil {
		return false, fmt.Errorf("models: %w", err)
	}
	if mode == "host" {
		return false, nil
	}
	o := m.b.Optional()
	why := ""
	switch {
	case o.DecodeAttention == nil || o.SampleTokens == nil:
		why = fmt.Sprintf("backend %s has no DecodeAttention and SampleTokens", m.b.Name())
	case m.Arch.Latent.KVRank > 0:
		why = "latent attention (MLA) keeps its own cache layout"
	case slices.Contains(m.Arch.Conv.Layers, true):
		why = "short-convolution layers (lfm2_moe) keep their state in the host decoder's cache"
	case m.Arch.Linear.Layers > 0:
		why = "gated delta-net layers keep their recurrent state on the host"
	}
	if why != "" {
		if mode == "device" {
			return false, fmt.Errorf("models: HALO_GENERATE=device: %s; unset it or use host", why)
		}
		return false, nil
	}
	return mode == "device" || !strings.HasPrefix(m.b.Name(), "cpu"), nil
}

// passFor is the layer geometry of a pass of n query tokens whose longest document has maxLen.
func (m *Model) passFor(n, maxLen int) nn.Pass {
	return nn.Pass{
		B: m.b, DType: m.opts.DType, N: n, MaxSeqLen: maxLen,
		InvFreq: m.invFreq, AttentionScaling: m.attnScale, NoAdapters: m.adaptersOff,
		LocalInvFreq: m.localInvFreq, LocalAttentionScaling: m.localScale,
		Scratch: m.scratch(),
	}
}

// deviceDecoder holds the buffers of one device GenerateBatch, allocated once.
type deviceDecoder struct {
	m     *Model
	B     int
	cap   int             // slot length: the longest prompt plus MaxNewTokens
	slots nn.SlotCache    // per layer K, V [B*cap, NKV*HD]
	ids   tensor.Tensor   // [1+MaxNew, B] I32: row 0 the NaN flags, row 1+s the tokens of step s
	pos   tensor.Tensor   // [MaxNew-1, B] I32: the position each decoding step feeds
	cu    tensor.Tensor   // [B+1] I32: 0, 1, ..., B (one query per row)
	owned []tensor.Tensor // everything above, freed by close
}

func (d *deviceDecoder) close() {
	for _, t := range d.owned {
		_ = d.m.b.Free(t)
	}
}

func (d *deviceDecoder) keep(t tensor.Tensor, err error) (tensor.Tensor, error) {
	if err == nil {
		d.owned = append(d.owned, t)
	}
	return t, err
}

func (m *Model) newDeviceDecoder(prompts [][]int32, maxNew int) (*deviceDecoder, error) {
	B := len(prompts)
	longest := 0
	for _, p := range prompts {
		longest = max(longest, len(p))
	}
	d := &deviceDecoder{m: m, B: B, cap: longest + maxNew}
	ok := false
	defer func() {
		if !ok {
			d.close()
		}
	}()
	d.slots = nn.SlotCache{Layers: make([]*nn.KVCache, len(m.blocks)), Cap: d.cap}
	for i := range d.slots.Layers {
		hd, kvh := m.Arch.LayerHeads(i) // gemma4_text's full layers have their own width
		kvw := kvh * hd
		c := &nn.KVCache{}
		var err error
		if c.K, err = d.keep(m.b.Empty(m.opts.DType, B*d.cap, kvw)); err != nil {
			return nil, fmt.Errorf("models: KV cache of %d rows x %d slots: %w", B, d.cap, err)
		}
		if c.V, err = d.keep(m.b.Empty(m.opts.DType, B*d.cap, kvw)); err != nil {
			return nil, fmt.Errorf("models: KV cache of %d rows x %d slots: %w", B, d.cap, err)
		}
		d.slots.Layers[i] = c
	}
	var err error
	if d.ids, err = d.keep(m.b.Alloc(tensor.I32, 1+maxNew, B)); err != nil {
		return nil, fmt.Errorf("models: generated ids: %w", err)
	}
	cu := make([]int32, B+1)
	for i := range cu {
		cu[i] = int32(i)
	}
	if d.cu, err = d.keep(backend.FromInt32(m.b, cu, B+1)); err != nil {
		return nil, err
	}
	if maxNew > 1 {
		pos := make([]int32, 0, (maxNew-1)*B)
		for s := 1; s < maxNew; s++ {
			for _, p := range prompts {
				pos = append(pos, int32(len(p)+s-1))
			}
		}
		if d.pos, err = d.keep(backend.FromInt32(m.b, pos, maxNew-1, B)); err != nil {
			return nil, err
		}
	}
	if err := m.ropeFor(d.cap); err != nil {
		return nil, err
	}
	ok = true
	return d, nil
}

// idsRow is row r of the ids buffer as a [B] tensor.
func (d *deviceDecoder) idsRow(r int) tensor.Tensor {
	t, err := d.ids.Rows(r, r+1)
	if err != nil {
		panic(err) // r is in range by construction
	}
	t, _ = t.Reshape(d.B)
	return t
}

// sample runs the LM head over x [B, C] (the last hidden state of every row) and samples step
// s's tokens into ids row 1+s.
func (d *deviceDecoder) sample(p *nn.Pass, x tensor.Tensor, s int, o GenerateOptions) error {
	m := d.m
	h := m.head // with the model's own logit scale, whatever SetLossTemperature set
	h.LogitScale = m.Arch.LogitScale
	lg, err := h.Logits(p, x)
	if err != nil {
		return err
	}
	defer m.b.Free(lg)
	if lg, err = lg.Reshape(d.B, -1); err != nil {
		return err
	}
	return m.b.Optional().SampleTokens(backend.SampleArgs{
		Out: d.idsRow(1 + s), Logits: lg, Bad: d.idsRow(0), Softcap: m.head.Softcap,
		Temperature: float32(o.Temperature), TopK: o.TopK, TopP: float32(o.TopP), Seed: o.Seed, Step: uint64(s),
	})
}

// prefill runs every prompt, packed, fills the cache slots and samples the first tokens.
func (d *deviceDecoder) prefill(prompts [][]int32, o GenerateOptions) error {
	m := d.m
	var tokens []int32
	cu := []int32{0}
	for _, p := range prompts {
		tokens = append(tokens, p...)
		cu = append(cu, int32(len(tokens)))
	}
	r, err := m.resolve(&Batch{Tokens: tokens, DocStarts: cu})
	if err != nil {
		return err
	}
	p, err := m.newPass(r)
	if err != nil {
		return err
	}
	defer p.release(m.b)
	fill := make([]int32, d.B*d.cap)
	last := make([]int32, d.B)
	for b, pr := range prompts {
		for k := range d.cap {
			fill[b*d.cap+k] = cu[b] + int32(min(k, len(pr)-1))
		}
		last[b] = cu[b+1] - 1
	}
	slots := d.slots
	if slots.Fill, err = backend.FromInt32(m.b, fill, len(fill)); err != nil {
		return err
	}
	defer m.b.Free(slots.Fill)
	p.Slots = &slots
	x, err := m.hidden(&p.Pass, p.ids)
	if err != nil {
		return err
	}
	defer m.b.Free(x)
	idx, err := backend.FromInt32(m.b, last, len(last))
	if err != nil {
		return err
	}
	defer m.b.Free(idx)
	sel, err := m.b.Empty(x.DType(), d.B, x.Dim(1))
	if err != nil {
		return err
	}
	defer m.b.Free(sel)
	if err := m.b.Embedding(sel, x, idx); err != nil {
		return fmt.Errorf("models: gather last tokens: %w", err)
	}
	return d.sample(&p.Pass, sel, 0, o)
}

// step feeds the tokens of step s-1 at their positions and samples those of step s (s >= 1).
func (d *deviceDecoder) step(s int, o GenerateOptions) error {
	m := d.m
	p := m.passFor(d.B, 1)
	var err error
	if p.Positions, err = d.pos.Rows(s-1, s); err != nil {
		return err
	}
	if p.Positions, err = p.Positions.Reshape(d.B); err != nil {
		return err
	}
	p.CuSeqlens = d.cu
	p.Slots = &d.slots
	x, err := m.hidden(&p, d.idsRow(s))
	if err != nil {
		return err
	}
	defer m.b.Free(x)
	return d.sample(&p, x, s, o)
}

// read downloads the NaN flags and the tokens of steps [0, n).
func (d *deviceDecoder) read(n int) (bad []int32, tokens [][]int32, err error) {
	view, err := d.ids.Rows(0, 1+n)
	if err != nil {
		return nil, nil, err
	}
	raw := make([]byte, view.Bytes())
	if err := d.m.b.Download(raw, view); err != nil {
		return nil, nil, err
	}
	all := make([]int32, len(raw)/4)
	for i := range all {
		all[i] = int32(binary.LittleEndian.Uint32(raw[4*i:]))
	}
	bad = all[:d.B]
	for s := range n {
		tokens = append(tokens, all[(1+s)*d.B:(2+s)*d.B])
	}
	return bad, tokens, nil
}

// generateOnDevice is GenerateBatch through the device decoder (prompts and options checked).
func (m *Model) generateOnDevice(prompts [][]int32, o BatchGenerateOptions) ([][]int32, error) {
	every, err := checkEvery()
	if err != nil {
		return nil, err
	}
	d, err := m.newDeviceDecoder(prompts, o.MaxNewTokens)
	if err != nil {
		return nil, err
	}
	defer d.close()
	out := make([][]int32, d.B)
	done := make([]bool, d.B)
	running := d.B
	seen := 0 // steps whose tokens the host has read
	// collect reads the tokens of steps [seen, n) and ends the rows that stopped.
	collect := func(n int) error {
		bad, tokens, err := d.read(n)
		if err != nil {
			return err
		}
		for r, f := range bad {
			if f != 0 {
				return fmt.Errorf("models: Generate: row %d has NaN logits by new token %d: the weights or activations are not finite", r, n-1)
			}
		}
		for s := seen; s < n; s++ {
			for r, id := range tokens[s] {
				if done[r] {
					continue
				}
				out[r] = append(out[r], id)
				if o.OnRowToken != nil {
					if err := o.OnRowToken(r, id); err != nil {
						return err
					}
				}
				if slices.Contains(o.StopIDs, id) || len(out[r]) == o.MaxNewTokens {
					done[r] = true
					running--
				}
			}
		}
		seen = n
		return nil
	}
	if err := d.prefill(prompts, o.GenerateOptions); err != nil {
		return nil, err
	}
	for s := 1; s < o.MaxNewTokens; s++ {
		if s%every == 0 {
			if err := collect(s); err != nil {
				return out, err
			}
			if running == 0 {
				return out, nil
			}
		}
		if err := d.step(s, o.GenerateOptions); err != nil {
			return out, err
		}
	}
	if err := collect(o.MaxNewTokens); err != nil {
		return out, err
	}
	return out, nil
}
