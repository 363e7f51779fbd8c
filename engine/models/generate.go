package models

import (
	"cmp"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"runtime"
	"slices"
	"sync"

	"github.com/halo-shell/halo-shell/engine/backend"
	"github.com/halo-shell/halo-shell/engine/nn"
	"github.com/halo-shell/halo-shell/engine/tensor"
)

// GenerateOptions control decoding.
type GenerateOptions struct {
	// MaxNewTokens is the most tokens to generate (> 0).
	MaxNewTokens int
	// Temperature divides the logits before sampling; 0 means greedy (argmax).
	Temperature float64
	// TopK keeps the K most likely tokens before sampling; 0 means all.
	TopK int
	// TopP keeps the smallest set of most likely tokens whose probability reaches TopP
	// (nucleus sampling); 0 or 1 means all.
	TopP float64
	// Seed makes sampling reproducible.
	Seed uint64
	// StopIDs end generation when produced (the stop token is included in the result).
	StopIDs []int32
	// OnToken, if set, is called with each generated token as soon as it exists (streaming);
	// an error from it stops generation and is returned.
	OnToken func(id int32) error
}

// Generate continues prompt with up to MaxNewTokens tokens using a KV cache: the prompt is run
// once (prefill), then each new token costs one single-token forward over the cached keys and
// values. It returns the generated tokens (without the prompt). It is GenerateBatch with one
// prompt, streaming through OnToken.
func (m *Model) Generate(prompt []int32, o GenerateOptions) ([]int32, error) {
	if len(prompt) == 0 {
		return nil, errors.New("models: Generate needs a non-empty prompt")
	}
	if err := m.lmOnly("Generate"); err != nil {
		return nil, err
	}
	var bo BatchGenerateOptions
	bo.GenerateOptions = o
	if o.OnToken != nil {
		bo.OnRowToken = func(_ int, id int32) error { return o.OnToken(id) }
	}
	out, err := m.GenerateBatch([][]int32{prompt}, bo)
	if len(out) == 0 {
		return nil, err
	}
	return out[0], err
}

// BatchGenerateOptions control GenerateBatch: the per-sequence decoding options and a
// streaming hook that names the row.
type BatchGenerateOptions struct {
	GenerateOptions
	// OnRowToken, if set, is called with each generated token of row r as soon as it exists;
	// an error from it stops generation and is returned. (GenerateOptions.OnToken is ignored
	// here.)
	OnRowToken func(row int, id int32) error
}

// rowRNG is row r's sampling stream: row r of a batch samples exactly what a lone
// Generate with the same prompt would with this stream, so results do not depend on how rows
// are batched or when the others stop.
func rowRNG(seed uint64, row int) *rand.Rand {
	return rand.New(rand.NewPCG(seed, 0x9e3779b97f4a7c15+uint64(row)))
}

// GenerateBatch continues every prompt with up to MaxNewTokens tokens, decoding the rows
// together: one prefill pass over all prompts packed as documents, then one forward per new
// token whose queries are the last token of every row still running. Row r samples from its
// own stream (seeded by Seed and r), so its tokens equal those of decoding it alone. A row
// stops at one of StopIDs (included in its result) or after MaxNewTokens; stopped rows leave
// the batch, so later steps cost only the rows still running.
//
// Where the backend can decode on the device (HALO_GENERATE, generate_device.go), the cache,
// the logits and the sampling stay there and the host reads the ids every few steps; rows then
// sample from the backend's counter-based stream (backend.SampleUniform) instead of the host's.
// Otherwise the KV cache of each layer keeps every running row's keys contiguous (its older rows, then
// its newest), which is the packed layout the attention op reads; each decoding step appends
// the new keys and regathers the rows in one Embedding op per buffer, so the cache costs twice
// sum(len(prompt)) + B*MaxNewTokens rows of NKV*HD per layer.
func (m *Model) GenerateBatch(prompts [][]int32, o BatchGenerateOptions) ([][]int32, error) {
	if len(prompts) == 0 {
		return nil, errors.New("models: GenerateBatch needs at least one prompt")
	}
	if err := m.lmOnly("GenerateBatch"); err != nil {
		return nil, err
	}
	for r, p := range prompts {
		if len(p) == 0 {
			return nil, fmt.Errorf("models: GenerateBatch: prompt %d is empty", r)
		}
	}
	if o.MaxNewTokens <= 0 {
		return nil, fmt.Errorf("models: Generate: max new tokens must be > 0, got %d", o.MaxNewTokens)
	}
	if o.Temperature < 0 || math.IsNaN(o.Temperature) || o.TopK < 0 || o.TopP < 0 || o.TopP > 1 || math.IsNaN(o.TopP) {
		return nil, fmt.Errorf("models: Generate: need temperature >= 0, top_k >= 0 and 0 <= top_p <= 1 (got %v, %d, %v)", o.Temperature, o.TopK, o.TopP)
	}
	if m.recomputes() {
		return m.generateRecompute(prompts, o)
	}
	if dev, err := m.deviceDecoding(); err != nil {
		return nil, err
	} else if dev {
		return m.generateOnDevice(prompts, o)
	}
	d, err := m.newDecoder(prompts, o.MaxNewTokens)
	if err != nil {
		return nil, err
	}
	defer d.close()
	rngs := make([]*rand.Rand, len(prompts))
	for r := range rngs {
		rngs[r] = rowRNG(o.Seed, r)
	}
	out := make([][]int32, len(prompts))
	logits, err := d.prefill(prompts)
	for step := 0; err == nil; step++ {
		ids, bad := sampleRows(logits, d.rows, o.GenerateOptions, rngs)
		if bad >= 0 {
			return out, fmt.Errorf("models: Generate: row %d has NaN logits at new token %d: the weights or activations are not finite", d.rows[bad], step)
		}
		var keep []int
		var next []int32
		for i, r := range d.rows {
			out[r] = append(out[r], ids[i])
			if o.OnRowToken != nil {
				if err := o.OnRowToken(r, ids[i]); err != nil {
					return out, err
				}
			}
			if !slices.Contains(o.StopIDs, ids[i]) && len(out[r]) < o.MaxNewTokens {
				keep = append(keep, i)
				next = append(next, ids[i])
			}
		}
		if len(keep) == 0 {
			return out, nil
		}
		logits, err = d.step(keep, next)
	}
	return out, err
}

// decoder is the state of one GenerateBatch: per layer a KV cache whose first used rows hold,
// for each running row in order, its keys contiguously.
type decoder struct {
	m      *Model
	caches []*nn.KVCache
	used   int   // rows of the caches in use
	rows   []int // the running rows (indices into the prompts), in cache order
	lens   []int // cached tokens of each running row
}

func (m *Model) newDecoder(prompts [][]int32, maxNew int) (*decoder, error) {
	total := 0
	for _, p := range prompts {
		total += len(p) + maxNew
	}
	d := &decoder{m: m, caches: make([]*nn.KVCache, len(m.blocks))}
	spare := len(prompts) > 1
	for i := range d.caches {
		hd, kvh := m.Arch.LayerHeads(i)
		kvw := kvh * hd
		if l := m.Arch.Latent; l.KVRank > 0 {
			kvw = m.Arch.Heads * max(l.QKHead(), l.V) // nn.MLA's cached heads
		}
		conv := m.Arch.IsConv(i)
		if conv {
			kvw = m.Arch.Hidden // nn.ShortConv caches bx in K alone
		}
		c := &nn.KVCache{}
		d.caches[i] = c
		if m.Arch.IsLinear(i) {
			continue // a gated delta-net layer keeps its state in c.Linear
		}
		for _, t := range []*tensor.Tensor{&c.K, &c.V, &c.K2, &c.V2} {
			if !spare && (t == &c.K2 || t == &c.V2) || conv && (t == &c.V || t == &c.V2) {
				continue
			}
			var err error
			if *t, err = m.b.Empty(m.opts.DType, total, kvw); err != nil {
				d.close()
				return nil, fmt.Errorf("models: KV cache for %d tokens: %w", total, err)
			}
		}
	}
	return d, nil
}

func (d *decoder) close() {
	for _, c := range d.caches {
		if c == nil {
			continue
		}
		for _, t := range []tensor.Tensor{c.K, c.V, c.K2, c.V2} {
			if !t.IsNil() {
				_ = d.m.b.Free(t)
			}
		}
	}
}

// prefill runs every prompt (packed as documents) into the caches and returns the logits
// [B][V] that predict each row's first new token.
func (d *decoder) prefill(prompts [][]int32) ([][]float32, error) {
	var tokens []int32
	cu := []int32{0}
	for r, p := range prompts {
		tokens = append(tokens, p...)
		cu = append(cu, int32(len(tokens)))
		d.rows = append(d.rows, r)
		d.lens = append(d.lens, len(p))
	}
	logits, err := d.forward(&Batch{Tokens: tokens, DocStarts: cu}, nil, nil, cu[1:], nil)
	if err != nil {
		return nil, err
	}
	d.used = len(tokens)
	return logits, nil
}

// step feeds next[j] to running row keep[j] (indices into d.rows); rows not in keep have
// stopped and leave the caches. It returns the logits [len(keep)][V] of the new tokens.
func (d *decoder) step(keep []int, next []int32) ([][]float32, error) {
	off := make([]int, len(d.rows)) // each running row's first cache row
	for i := 1; i < len(d.rows); i++ {
		off[i] = off[i-1] + d.lens[i-1]
	}
	n := len(keep)
	pos := make([]int32, n)
	cu := make([]int32, n+1)
	cuK := make([]int32, n+1)
	gather := make([]int32, 0, d.used+n)
	identity := true
	rows, lens := make([]int, n), make([]int, n)
	for j, i := range keep {
		pos[j] = int32(d.lens[i])
		cu[j+1] = int32(j + 1)
		for k := range d.lens[i] {
			gather = append(gather, int32(off[i]+k))
		}
		gather = append(gather, int32(d.used+j))
		cuK[j+1] = int32(len(gather))
		rows[j], lens[j] = d.rows[i], d.lens[i]+1
	}
	for j, g := range gather {
		if int(g) != j {
			identity = false
			break
		}
	}
	if identity {
		gather = nil
	}
	last := cu[1:]
	logits, err := d.forward(&Batch{Tokens: next, Positions: pos, DocStarts: cu}, cuK, gather, last, keep)
	if err != nil {
		return nil, err
	}
	d.rows, d.lens, d.used = rows, lens, int(cuK[n])
	return logits, nil
}

// forward runs one cached pass (keys appended at row d.used; with gather, regathered into the
// running rows' layout whose boundaries are cuK) and returns the logits of the tokens ending
// at ends (exclusive offsets). Document j of the pass continues running row stateRows[j] of
// the previous pass in gated delta-net layers (nil for the prefill).
func (d *decoder) forward(b *Batch, cuK, gather, ends []int32, stateRows []int) ([][]float32, error) {
	m := d.m
	r, err := m.resolve(b)
	if err != nil {
		return nil, err
	}
	if cuK != nil {
		// The attention op's length hint is the longest row's keys, not its one query.
		r.maxLen = 0
		for i := 1; i < len(cuK); i++ {
			r.maxLen = max(r.maxLen, int(cuK[i]-cuK[i-1]))
		}
	}
	p, err := m.newPass(r)
	if err != nil {
		return nil, err
	}
	defer p.release(m.b)
	p.Cache, p.CacheLen, p.StateRows = d.caches, d.used, stateRows
	if cuK != nil {
		if p.CuSeqlensK, err = backend.FromInt32(m.b, cuK, len(cuK)); err != nil {
			return nil, err
		}
	}
	if gather != nil {
		if p.CacheGather, err = backend.FromInt32(m.b, gather, len(gather)); err != nil {
			return nil, err
		}
		defer m.b.Free(p.CacheGather)
	}
	x, err := m.hidden(&p.Pass, p.ids)
	if err != nil {
		return nil, err
	}
	defer m.b.Free(x)
	last := make([]int32, len(ends))
	for i, e := range ends {
		last[i] = e - 1
	}
	return m.rowLogits(&p.Pass, x, last)
}

// rowLogits returns the logits [len(rows)][V] of the hidden states x[rows].
func (m *Model) rowLogits(p *nn.Pass, x tensor.Tensor, rows []int32) ([][]float32, error) {
	var sel tensor.Tensor
	if len(rows) == 1 {
		var err error
		if sel, err = x.Rows(int(rows[0]), int(rows[0])+1); err != nil {
			return nil, err
		}
	} else {
		idx, err := backend.FromInt32(m.b, rows, len(rows))
		if err != nil {
			return nil, err
		}
		defer m.b.Free(idx)
		if sel, err = m.b.Empty(x.DType(), len(rows), x.Dim(1)); err != nil {
			return nil, err
		}
		defer m.b.Free(sel)
		if err = m.b.Embedding(sel, x, idx); err != nil {
			return nil, fmt.Errorf("models: gather last tokens: %w", err)
		}
	}
	h := m.head // with the model's own logit scale, whatever SetLossTemperature set
	h.LogitScale = m.Arch.LogitScale
	lg, err := h.Logits(p, sel)
	if err != nil {
		return nil, err
	}
	defer m.b.Free(lg)
	flat, err := backend.ToFloat32(m.b, lg)
	if err != nil {
		return nil, err
	}
	m.head.SoftcapLogits(flat)
	v := len(flat) / len(rows)
	out := make([][]float32, len(rows))
	for i := range out {
		out[i] = flat[i*v : (i+1)*v : (i+1)*v]
	}
	return out, nil
}

func (m *Model) lastLogits(p *nn.Pass, x tensor.Tensor) ([]float32, error) {
	lg, err := m.rowLogits(p, x, []int32{int32(x.Dim(0) - 1)})
	if err != nil {
		return nil, err
	}
	return lg[0], nil
}

// NextLogits runs the whole sequence without a cache and returns the logits [V] that predict
// the token after it.
func (m *Model) NextLogits(ids []int32) ([]float32, error) {
	r, err := m.resolve(&Batch{Tokens: ids})
	if err != nil {
		return nil, err
	}
	p, err := m.newPass(r)
	if err != nil {
		return nil, err
	}
	defer p.release(m.b)
	x, err := m.hidden(&p.Pass, p.ids)
	if err != nil {
		return nil, err
	}
	defer m.b.Free(x)
	return m.lastLogits(&p.Pass, x)
}

// Argmax returns the index of the largest value (the first one on ties).
func Argmax(v []float32) int32 {
	best := 0
	for i, x := range v {
		if x > v[best] {
			best = i
		}
	}
	return int32(best)
}

// sampleRows samples the next token of every running row (rows[i] names the row whose logits
// are logits[i]) from that row's stream, the rows in parallel: each stream is used by one row
// only, so the result does not depend on scheduling. bad is the first i whose logits hold a
// NaN (its token is not to be used), -1 when none does.
func sampleRows(logits [][]float32, rows []int, o GenerateOptions, rngs []*rand.Rand) (ids []int32, bad int) {
	ids = make([]int32, len(logits))
	nan := make([]bool, len(logits))
	one := func(i int) {
		if slices.ContainsFunc(logits[i], func(x float32) bool { return x != x }) {
			nan[i] = true
			return
		}
		ids[i] = sample(logits[i], o, rngs[rows[i]])
	}
	if len(logits) == 1 {
		one(0)
	} else {
		var wg sync.WaitGroup
		next := make(chan int)
		for range min(runtime.GOMAXPROCS(0), len(logits)) {
			wg.Go(func() {
				for i := range next {
					one(i)
				}
			})
		}
		for i := range logits {
			next <- i
		}
		close(next)
		wg.Wait()
	}
	return ids, slices.Index(nan, true)
}

// sample picks the next token: greedy at temperature 0, else softmax(logits/T) restricted by
// top-k and then top-p (renormalised after each), as transformers' logits warpers apply them.
// Ties in the ordering go to the lower token id. Only the tokens that can survive the filters
// are sorted: with top-k, those at or above the k-th largest logit; with top-p, those whose
// probability is at least (1-top_p)/n of the n kept so far, since the rest together hold less
// than 1-top_p and so lie past the nucleus.
func sample(logits []float32, o GenerateOptions, rng *rand.Rand) int32 {
	if o.Temperature == 0 {
		return Argmax(logits)
	}
	idx := make([]int, 0, len(logits))
	if o.TopK > 0 && o.TopK < len(logits) {
		thr := kthLargest(logits, o.TopK)
		for i, l := range logits {
			if l >= thr {
				idx = append(idx, i)
			}
		}
	} else {
		for i := range logits {
			idx = append(idx, i)
		}
	}
	byLogit := func(a, b int) int {
		if c := cmp.Compare(logits[b], logits[a]); c != 0 {
			return c
		}
		return cmp.Compare(a, b)
	}
	if o.TopK > 0 && len(idx) > o.TopK {
		slices.SortFunc(idx, byLogit)
		idx = idx[:o.TopK]
	}
	mx := math.Inf(-1)
	for _, j := range idx {
		mx = max(mx, float64(logits[j])/o.Temperature)
	}
	probs := make([]float64, len(logits))
	sum := 0.0
	for _, j := range idx {
		probs[j] = math.Exp(float64(logits[j])/o.Temperature - mx)
		sum += probs[j]
	}
	for _, j := range idx {
		probs[j] /= sum
	}
	if o.TopP > 0 && o.TopP < 1 {
		// Half the bound, so that rounding in the sums cannot cut into the nucleus.
		floor := (1 - o.TopP) / float64(len(idx)) / 2
		kept := idx[:0]
		for _, j := range idx {
			if probs[j] >= floor {
				kept = append(kept, j)
			}
		}
		idx = kept
		slices.SortFunc(idx, byLogit)
		cum := 0.0
		for i, j := range idx {
			cum += probs[j]
			if cum >= o.TopP {
				idx = idx[:i+1]
				break
			}
		}
		s := 0.0
		for _, j := range idx {
			s += probs[j]
		}
		for _, j := range idx {
			probs[j] /= s
		}
	}
	if len(idx) == 0 { // only with non-finite logits
		return Argmax(logits)
	}
	u := rng.Float64()
	for _, j := range idx {
		u -= probs[j]
		if u < 0 {
			return int32(j)
		}
	}
	return int32(idx[len(idx)-1])
}

// kthLargest returns the k-th largest value of v (1 <= k <= len(v)), by quickselect on a copy.
func kthLargest(v []float32, k int) float32 {
	a := slices.Clone(v)
	lo, hi, want := 0, len(a)-1, k-1
	for lo < hi {
		// Median of three as the pivot; partition descending.
		mid := lo + (hi-lo)/2
		p := max(min(a[lo], a[mid]), min(max(a[lo], a[mid]), a[hi]))
		i, j := lo, hi
		for i <= j {
			for a[i] > p {
				i++
			}
			for a[j] < p {
				j--
			}
			if i <= j {
				a[i], a[j] = a[j], a[i]
				i++
				j--
			}
		}
		switch {
		case want <= j:
			hi = j
		case want >= i:
			lo = i
		default:
			return a[want]
		}
	}
	return a[want]
}

// SetLossTemperature makes the losses and log-probs of Forward, ForwardBackward,
// ForwardBackwardWeighted and TokenLogprobs those of the logits divided by t, as GRPO scores
// completions sampled at temperature t (TRL divides the logits by the sampling temperature
// before its log-softmax); 1 restores the model's own. Generation is not affected: it applies
// its own temperature. A family that caps its logits (final_logit_softcapping) would cap them
// after the division, where TRL divides the capped logits, so t != 1 is refused there.
func (m *Model) SetLossTemperature(t float64) error {
	if !(t > 0) || math.IsInf(t, 0) {
		return fmt.Errorf("models: loss temperature %v must be a positive number", t)
	}
	if t != 1 && m.Arch.LogitSoftcap != 0 {
		return fmt.Errorf("models: loss temperature %v: the logits of %s are soft-capped, and the division would come before the cap", t, m.Arch.ModelType)
	}
	base := m.Arch.LogitScale
	if base == 0 {
		base = 1
	}
	m.head.LogitScale = base / float32(t)
	return nil
}
