package cpu

import (
	"fmt"
	"math"

	"github.com/halo-shell/halo-shell/engine/backend"
)

// DecodeAttention implements backend.Optional.DecodeAttention: the reference of the device
// kernel. Each (row, query head) is one task; scores and the weighted sum accumulate in float64.
func (b *Backend) DecodeAttention(a backend.DecodeAttentionArgs) error {
	const op = "decode attention"
	B, err := a.Validate()
	if err != nil {
		return fmt.Errorf("cpu: %w", err)
	}
	pos, err := ints(op, "Positions", a.Positions)
	if err != nil {
		return err
	}
	for r, p := range pos {
		if p < 0 || int(p) >= a.Cap {
			return fmt.Errorf("cpu: %s: row %d is at position %d, outside its cache slot [0, %d)", op, r, p, a.Cap)
		}
	}
	qw, kw := a.NH*a.HD, a.NKV*a.HD
	// Append first: the cache rows this step writes are read by the same step.
	for _, pair := range [][2]T{{a.CacheK, a.K}, {a.CacheV, a.V}} {
		src, err := b.in(op, "K/V", pair[1])
		if err != nil {
			return err
		}
		dst, flush, err := b.out(op, "cache", pair[0], true)
		if err != nil {
			return err
		}
		for r, p := range pos {
			copy(dst[(r*a.Cap+int(p))*kw:][:kw], src[r*kw:][:kw])
		}
		flush()
	}
	q, err := b.in(op, "Q", a.Q)
	if err != nil {
		return err
	}
	ck, err := b.in(op, "CacheK", a.CacheK)
	if err != nil {
		return err
	}
	cv, err := b.in(op, "CacheV", a.CacheV)
	if err != nil {
		return err
	}
	out, flush, err := b.out(op, "Out", a.Out, false)
	if err != nil {
		return err
	}
	var lse []float32
	if !a.LSE.IsNil() {
		if lse, err = f32only(op, "LSE", a.LSE); err != nil {
			return err
		}
	}
	scale := float64(a.Scale)
	if scale == 0 {
		scale = 1 / math.Sqrt(float64(a.HD))
	}
	group := a.NH / a.NKV
	b.pool.run(B*a.NH, func(task int) {
		r, h := task/a.NH, task%a.NH
		p := int(pos[r])
		lo := 0
		if a.Window > 0 {
			lo = max(0, p-a.Window+1)
		}
		qh := q[r*qw+h*a.HD:][:a.HD]
		off := (h / group) * a.HD
		s := make([]float64, p+1-lo)
		mx := math.Inf(-1)
		for j := lo; j <= p; j++ {
			k := ck[(r*a.Cap+j)*kw+off:][:a.HD]
			var d float64
			for i, x := range qh {
				d += float64(x) * float64(k[i])
			}
			s[j-lo] = d * scale
			mx = max(mx, s[j-lo])
		}
		acc := make([]float64, a.HD)
		var sum float64
		for j := lo; j <= p; j++ {
			e := math.Exp(s[j-lo] - mx)
			sum += e
			v := cv[(r*a.Cap+j)*kw+off:][:a.HD]
			for i, x := range v {
				acc[i] += e * float64(x)
			}
		}
		o := out[r*qw+h*a.HD:][:a.HD]
		for i := range o {
			o[i] = float32(acc[i] / sum)
		}
		if lse != nil {
			lse[r*a.NH+h] = float32(mx + math.Log(sum))
		}
	})
	flush()
	return nil
}

// SampleTokens implements backend.Optional.SampleTokens: the reference of the device kernel,
// rows in parallel, each with the kernel's bisections for the top-k and top-p thresholds.
func (b *Backend) SampleTokens(a backend.SampleArgs) error {
	const op = "sample tokens"
	B, V, err := a.Validate()
	if err != nil {
		return fmt.Errorf("cpu: %w", err)
	}
	lg, err := b.in(op, "Logits", a.Logits)
	if err != nil {
		return err
	}
	out, err := ints(op, "Out", a.Out)
	if err != nil {
		return err
	}
	var bad []int32
	if !a.Bad.IsNil() {
		if bad, err = ints(op, "Bad", a.Bad); err != nil {
			return err
		}
	}
	b.pool.run(B, func(r int) {
		id, nan := SampleRow(lg[r*V:(r+1)*V], a, uint64(r))
		out[r] = id
		if nan && bad != nil {
			bad[r] = 1
		}
	})
	return nil
}

// SampleRow is SampleTokens for one row of logits (row r of the batch): the token, and whether
// the logits hold a NaN (the token is then 0). It does not modify logits.
func SampleRow(logits []float32, a backend.SampleArgs, r uint64) (int32, bool) {
	V := len(logits)
	s := make([]float32, V)
	capv := float64(a.Softcap)
	for i, l := range logits {
		if l != l {
			return 0, true
		}
		if capv != 0 {
			l = float32(capv * math.Tanh(float64(l)/capv))
		}
		s[i] = l
	}
	if a.Temperature == 0 {
		best := 0
		for i, x := range s {
			if x > s[best] {
				best = i
			}
		}
		return int32(best), false
	}
	mx := float32(math.Inf(-1))
	for i := range s {
		s[i] /= a.Temperature
		mx = max(mx, s[i])
	}
	var thr uint32 // keep entries whose key is >= thr
	if a.TopK > 0 && a.TopK < V {
		thr = bisectKeys(0, math.MaxUint32, func(k uint32) bool {
			n := 0
			for _, x := range s {
				if backend.OrderedKey(x) >= k {
					n++
				}
			}
			return n >= a.TopK
		})
	}
	if a.TopP > 0 && a.TopP < 1 {
		mass := func(k uint32) float64 {
			var m float64
			for _, x := range s {
				if backend.OrderedKey(x) >= k {
					m += math.Exp(float64(x - mx))
				}
			}
			return m
		}
		target := float64(a.TopP) * mass(thr)
		thr = bisectKeys(thr, backend.OrderedKey(mx), func(k uint32) bool { return mass(k) >= target })
	}
	key := backend.SampleRowKey(a.Seed, r, a.Step)
	best, bestV := -1, float32(math.Inf(-1))
	for i, x := range s {
		if backend.OrderedKey(x) < thr {
			continue
		}
		v := x + backend.SampleGumbel(backend.SampleUniformFrom(key, uint64(i)))
		if best < 0 || v > bestV {
			best, bestV = i, v
		}
	}
	return int32(max(best, 0)), false
}

// bisectKeys returns the largest k in [lo, hi] with ok(k), given that ok holds at lo and is
// monotone (true up to some key, false after).
func bisectKeys(lo, hi uint32, ok func(uint32) bool) uint32 {
	for lo < hi {
		mid := lo + (hi-lo)/2 + (hi-lo)%2
		if ok(mid) {
			lo = mid
		} else {
			hi = mid - 1
		}
	}
	return lo
}
