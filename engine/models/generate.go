package models

import (
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"sort"

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
// values. It returns the generated tokens (without the prompt).
func (m *Model) Generate(prompt []int32, o GenerateOptions) ([]int32, error) {
	if len(prompt) == 0 {
		return nil, errors.New("models: Generate needs a non-empty prompt")
	}
	if o.MaxNewTokens <= 0 {
		return nil, fmt.Errorf("models: Generate: max new tokens must be > 0, got %d", o.MaxNewTokens)
	}
	if o.Temperature < 0 || math.IsNaN(o.Temperature) || o.TopK < 0 || o.TopP < 0 || o.TopP > 1 {
		return nil, fmt.Errorf("models: Generate: need temperature >= 0, top_k >= 0 and 0 <= top_p <= 1 (got %v, %d, %v)", o.Temperature, o.TopK, o.TopP)
	}
	total := len(prompt) + o.MaxNewTokens
	caches := make([]*nn.KVCache, len(m.blocks))
	defer func() {
		for _, c := range caches {
			if c != nil {
				_ = m.b.Free(c.K)
				_ = m.b.Free(c.V)
			}
		}
	}()
	kvw := m.Arch.KVHeads * m.Arch.HeadDim
	for i := range caches {
		k, err := m.b.Alloc(m.opts.DType, total, kvw)
		if err != nil {
			return nil, fmt.Errorf("models: KV cache for %d tokens: %w", total, err)
		}
		v, err := m.b.Alloc(m.opts.DType, total, kvw)
		if err != nil {
			_ = m.b.Free(k)
			return nil, fmt.Errorf("models: KV cache for %d tokens: %w", total, err)
		}
		caches[i] = &nn.KVCache{K: k, V: v}
	}
	rng := rand.New(rand.NewPCG(o.Seed, 0x9e3779b97f4a7c15))
	var out []int32
	input, cached := slices.Clone(prompt), 0
	for len(out) < o.MaxNewTokens {
		logits, err := m.cachedStep(input, cached, caches)
		if err != nil {
			return out, err
		}
		cached += len(input)
		id := sample(logits, o, rng)
		out = append(out, id)
		if o.OnToken != nil {
			if err := o.OnToken(id); err != nil {
				return out, err
			}
		}
		if slices.Contains(o.StopIDs, id) {
			break
		}
		input = []int32{id}
	}
	return out, nil
}

// cachedStep runs tokens at positions [cached, cached+len(tokens)) against the KV caches and
// returns the logits of the last one.
func (m *Model) cachedStep(tokens []int32, cached int, caches []*nn.KVCache) ([]float32, error) {
	n := len(tokens)
	pos := make([]int32, n)
	for i := range pos {
		pos[i] = int32(cached + i)
	}
	r, err := m.resolve(&Batch{Tokens: tokens, Positions: pos, DocStarts: []int32{0, int32(n)}})
	if err != nil {
		return nil, err
	}
	p, err := m.newPass(r)
	if err != nil {
		return nil, err
	}
	defer p.release(m.b)
	if p.CuSeqlensK, err = backend.FromInt32(m.b, []int32{0, int32(cached + n)}, 2); err != nil {
		return nil, err
	}
	p.MaxSeqLen = cached + n
	p.Cache, p.CacheLen = caches, cached
	x, err := m.hidden(&p.Pass, p.ids)
	if err != nil {
		return nil, err
	}
	defer m.b.Free(x)
	return m.lastLogits(&p.Pass, x)
}

func (m *Model) lastLogits(p *nn.Pass, x tensor.Tensor) ([]float32, error) {
	last, err := x.Rows(x.Dim(0)-1, x.Dim(0))
	if err != nil {
		return nil, err
	}
	lg, err := m.head.Logits(p, last)
	if err != nil {
		return nil, err
	}
	defer m.b.Free(lg)
	return backend.ToFloat32(m.b, lg)
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

// sample picks the next token: greedy at temperature 0, else softmax(logits/T) restricted by
// top-k and then top-p, as transformers' logits warpers apply them.
func sample(logits []float32, o GenerateOptions, rng *rand.Rand) int32 {
	if o.Temperature == 0 {
		return Argmax(logits)
	}
	idx := make([]int, len(logits))
	for i := range idx {
		idx[i] = i
	}
	sort.SliceStable(idx, func(a, b int) bool { return logits[idx[a]] > logits[idx[b]] })
	if o.TopK > 0 && o.TopK < len(idx) {
		idx = idx[:o.TopK]
	}
	probs := make([]float64, len(idx))
	mx := float64(logits[idx[0]]) / o.Temperature
	sum := 0.0
	for i, j := range idx {
		probs[i] = math.Exp(float64(logits[j])/o.Temperature - mx)
		sum += probs[i]
	}
	for i := range probs {
		probs[i] /= sum
	}
	if o.TopP > 0 && o.TopP < 1 {
		cum := 0.0
		for i, p := range probs {
			cum += p
			if cum >= o.TopP {
				probs, idx = probs[:i+1], idx[:i+1]
				break
			}
		}
		s := 0.0
		for _, p := range probs {
			s += p
		}
		for i := range probs {
			probs[i] /= s
		}
	}
	u := rng.Float64()
	for i, p := range probs {
		u -= p
		if u < 0 {
			return int32(idx[i])
		}
	}
	return int32(idx[len(idx)-1])
}
