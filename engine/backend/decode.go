package backend

import (
	"fmt"
	"math"

	"github.com/halo-shell/halo-shell/engine/tensor"
)

// Batched decoding on the device, Optional.DecodeAttention and Optional.SampleTokens: the two
// ops that let a decoding step of B rows run with its KV cache, its logits and its sampled ids
// all on the device, so that the host only reads the new ids (engine/models' GenerateBatch reads
// them every few steps).
//
// # Slotted KV cache
//
// Row b of a decoding batch owns the cache rows [b*Cap, (b+1)*Cap): its key at position j is
// cache row b*Cap + j. A step appends one token per row at its own position, so no row is ever
// moved and rows of different lengths need no padding in the queries.
//
// # Sampling stream
//
// The token of row b at step s is drawn with the Gumbel-max trick from the uniforms
// SampleUniform(Seed, b, s, i), one per vocabulary entry i: it is the kept entry with the largest
// l_i/Temperature + g_i, g_i = -log(-log(u_i)), which is a draw from softmax(l/Temperature)
// restricted to the kept entries. Every backend computes the same uniforms, so backends differ
// only where their logits do.

// DecodeAttentionArgs are the operands of Optional.DecodeAttention: one decoding step of B rows,
// one query token each, over a slotted KV cache. With p = Positions[b] and G = NH/NKV, query
// head h of row b sees the keys j in [max(0, p-Window+1), p] of kv head h/G (all of [0, p] when
// Window is 0), the key at p being this step's:
//
//	CacheK[b*Cap+p] = K[b], CacheV[b*Cap+p] = V[b]            (=; every other cache row is read only)
//	Out[b, h] = sum_j softmax_j(Scale * q·k_j) v_j             (=)
//	LSE[b, h] = log sum_j exp(Scale * q·k_j)                   (=, optional; natural log, as Attention's)
//
// Rows whose position lies outside [0, Cap) are an error where the backend knows the positions
// on the host; otherwise they are skipped (their Out is undefined, no cache row is written).
//
// Fallback: a contiguous cache that is regathered every step (engine/nn's CacheGather) and
// Attention with separate key boundaries.
type DecodeAttentionArgs struct {
	Out T // [B, NH*HD] =
	LSE T // [B, NH] F32 =, optional
	Q   T // [B, NH*HD] this step's queries (rotated)
	K   T // [B, NKV*HD] this step's keys (rotated)
	V   T // [B, NKV*HD] this step's values
	// CacheK and CacheV [B*Cap, NKV*HD] hold each row's earlier keys and values; the op writes
	// row b*Cap+Positions[b] of each.
	CacheK, CacheV T
	Positions      T // [B] I32: each row's new token position
	Cap            int
	NH, NKV, HD    int
	Scale          float32 // 0 means 1/sqrt(HD)
	Window         int     // sliding window; 0 = unlimited
}

// Validate checks the shapes and dtypes and returns B.
func (a DecodeAttentionArgs) Validate() (int, error) {
	const op = "DecodeAttention"
	if a.NH <= 0 || a.NKV <= 0 || a.HD <= 0 || a.NH%a.NKV != 0 {
		return 0, fmt.Errorf("%s: need NH, NKV, HD > 0 with NH a multiple of NKV (got %d, %d, %d)", op, a.NH, a.NKV, a.HD)
	}
	if a.Cap <= 0 || a.Window < 0 {
		return 0, fmt.Errorf("%s: Cap %d must be positive and Window %d not negative", op, a.Cap, a.Window)
	}
	for _, t := range []struct {
		name string
		t    T
	}{{"Out", a.Out}, {"Q", a.Q}, {"K", a.K}, {"V", a.V}, {"CacheK", a.CacheK}, {"CacheV", a.CacheV}, {"Positions", a.Positions}} {
		if t.t.IsNil() {
			return 0, fmt.Errorf("%s: %s is required", op, t.name)
		}
	}
	if a.Positions.DType() != tensor.I32 {
		return 0, fmt.Errorf("%s: Positions %v must be i32", op, a.Positions)
	}
	b := a.Positions.Numel()
	qw, kw := a.NH*a.HD, a.NKV*a.HD
	dt := a.Q.DType()
	for _, t := range []struct {
		name string
		t    T
		n    int
		desc string
	}{
		{"Q", a.Q, b * qw, "B*NH*HD"}, {"Out", a.Out, b * qw, "B*NH*HD"},
		{"K", a.K, b * kw, "B*NKV*HD"}, {"V", a.V, b * kw, "B*NKV*HD"},
		{"CacheK", a.CacheK, b * a.Cap * kw, "B*Cap*NKV*HD"}, {"CacheV", a.CacheV, b * a.Cap * kw, "B*Cap*NKV*HD"},
	} {
		if t.t.Numel() != t.n {
			return 0, fmt.Errorf("%s: %s %v has %d elements, want %s = %d (B = %d rows)", op, t.name, t.t, t.t.Numel(), t.desc, t.n, b)
		}
		if t.t.DType() != dt {
			return 0, fmt.Errorf("%s: %s %v must have Q's dtype %v", op, t.name, t.t, dt)
		}
	}
	if !dt.IsFloat() {
		return 0, fmt.Errorf("%s: Q %v must be a float tensor", op, a.Q)
	}
	if !a.LSE.IsNil() && (a.LSE.DType() != tensor.F32 || a.LSE.Numel() != b*a.NH) {
		return 0, fmt.Errorf("%s: LSE %v must be f32 [%d, %d]", op, a.LSE, b, a.NH)
	}
	return b, nil
}

// SampleArgs are the operands of Optional.SampleTokens: one token per row of logits.
//
// Each row's logits l are first soft-capped when Softcap is set (l = Softcap*tanh(l/Softcap)).
// At Temperature 0 the token is the first index of the largest logit. Otherwise, with
// s = l/Temperature, the kept entries are those with s_i >= the TopK-th largest s (all when
// TopK is 0 or >= V), and among them, when 0 < TopP < 1, those with s_i >= t for the largest t
// whose kept entries hold at least TopP of the probability softmax(s) gives the kept set (the
// nucleus; ties at either threshold are all kept). The token is the kept entry with the largest
// s_i - log(-log(SampleUniform(Seed, b, Step, i))), a draw from the renormalised distribution.
type SampleArgs struct {
	Out    T // [B] I32 =: the sampled ids, each in [0, V)
	Logits T // [B, V] F32 or BF16
	// Bad [B] I32, optional: set to 1 where row b's logits hold a NaN (its Out is then 0), left
	// as it is elsewhere, so one buffer collects the rows that failed over many steps.
	Bad         T
	Softcap     float32
	Temperature float32 // >= 0
	TopK        int     // >= 0
	TopP        float32 // in [0, 1]; 0 and 1 keep everything
	Seed        uint64
	Step        uint64
}

// Validate checks the operands and returns B and V.
func (a SampleArgs) Validate() (int, int, error) {
	const op = "SampleTokens"
	if a.Logits.IsNil() || a.Logits.Rank() != 2 || !a.Logits.DType().IsFloat() {
		return 0, 0, fmt.Errorf("%s: Logits %v must be a float [B, V] tensor", op, a.Logits)
	}
	b, v := a.Logits.Dim(0), a.Logits.Dim(1)
	if v <= 0 || v > math.MaxInt32 {
		return 0, 0, fmt.Errorf("%s: vocabulary %d must be in [1, 2^31)", op, v)
	}
	if a.Out.IsNil() || a.Out.DType() != tensor.I32 || a.Out.Numel() != b {
		return 0, 0, fmt.Errorf("%s: Out %v must be i32 [%d]", op, a.Out, b)
	}
	if !a.Bad.IsNil() && (a.Bad.DType() != tensor.I32 || a.Bad.Numel() != b) {
		return 0, 0, fmt.Errorf("%s: Bad %v must be i32 [%d]", op, a.Bad, b)
	}
	if !(a.Temperature >= 0) || math.IsInf(float64(a.Temperature), 0) || a.TopK < 0 || !(a.TopP >= 0 && a.TopP <= 1) || a.Softcap < 0 {
		return 0, 0, fmt.Errorf("%s: need temperature >= 0, top_k >= 0, 0 <= top_p <= 1 and softcap >= 0 (got %v, %d, %v, %v)", op, a.Temperature, a.TopK, a.TopP, a.Softcap)
	}
	return b, v, nil
}

// SampleUniform is the sampling stream: a uniform in (0, 1) that depends only on (seed, row,
// step, token),
//
//	h = mix64(mix64(mix64(seed) ^ row) ^ step); u = ((mix64(h ^ token) >> 40) + 0.5) / 2^24
//
// with mix64 the splitmix64 finaliser of SRBits. The 24 bits make u exact in float32.
func SampleUniform(seed, row, step, token uint64) float32 {
	return SampleUniformFrom(SampleRowKey(seed, row, step), token)
}

// SampleRowKey is the part of SampleUniform that does not depend on the token.
func SampleRowKey(seed, row, step uint64) uint64 {
	return mix64(mix64(mix64(seed)^row) ^ step)
}

// SampleUniformFrom finishes SampleUniform from a row key.
func SampleUniformFrom(key, token uint64) float32 {
	return (float32(mix64(key^token)>>40) + 0.5) / (1 << 24)
}

// SampleGumbel is the Gumbel noise -log(-log(u)) of a uniform, computed in float32 as the
// device kernels do (each log rounded to float32).
func SampleGumbel(u float32) float32 {
	return -float32(math.Log(float64(-float32(math.Log(float64(u))))))
}

// OrderedKey maps a float32 to a uint32 that sorts in the same order (NaN aside): the bisections
// of SampleTokens search over these keys.
func OrderedKey(f float32) uint32 {
	u := math.Float32bits(f)
	if u&0x80000000 != 0 {
		return ^u
	}
	return u | 0x80000000
}
