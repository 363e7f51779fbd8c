package cpu

import (
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"sort"
	"strings"
	"testing"

	"github.com/halo-shell/halo-shell/engine/backend"
	"github.com/halo-shell/halo-shell/engine/tensor"
)

// TestDecodeAttentionMatchesAttention: one decoding step over a slotted cache equals Attention
// over the same keys laid out contiguously (the host decoder's layout, with CuSeqlensK), Out
// and LSE, for GQA groups, sliding windows and rows at the ends of their slots; the step writes
// exactly its rows of the cache.
func TestDecodeAttentionMatchesAttention(t *testing.T) {
	b := newTestBackend(t)
	for _, tc := range []struct {
		NH, NKV, HD, Cap, Window int
		pos                      []int32
	}{
		{4, 2, 8, 10, 0, []int32{0, 9, 4}},
		{4, 1, 16, 12, 3, []int32{11, 2, 0, 7}},
		{2, 2, 4, 6, 0, []int32{5}},
	} {
		t.Run(fmt.Sprintf("h%d_kv%d_d%d_w%d", tc.NH, tc.NKV, tc.HD, tc.Window), func(t *testing.T) {
			r := rand.New(rand.NewPCG(1, uint64(tc.NH*tc.Cap)))
			B, qw, kw := len(tc.pos), tc.NH*tc.HD, tc.NKV*tc.HD
			q, k, v := randn(r, B*qw, 1), randn(r, B*kw, 1), randn(r, B*kw, 1)
			ck, cv := randn(r, B*tc.Cap*kw, 1), randn(r, B*tc.Cap*kw, 1)
			out, lse := zeros(t, b, tensor.F32, B, qw), zeros(t, b, tensor.F32, B, tc.NH)
			tck, tcv := up(t, b, ck, tensor.F32, B*tc.Cap, kw), up(t, b, cv, tensor.F32, B*tc.Cap, kw)
			must(t, b.DecodeAttention(backend.DecodeAttentionArgs{
				Out: out, LSE: lse, Q: up(t, b, q, tensor.F32, B, qw), K: up(t, b, k, tensor.F32, B, kw), V: up(t, b, v, tensor.F32, B, kw),
				CacheK: tck, CacheV: tcv, Positions: upInts(t, b, tc.pos, B), Cap: tc.Cap,
				NH: tc.NH, NKV: tc.NKV, HD: tc.HD, Window: tc.Window,
			}))
			// The expected cache: the old one with each row's new key at its position.
			wantK, wantV := slices.Clone(ck), slices.Clone(cv)
			var keys, vals []float64
			cuK := []int32{0}
			for r, p := range tc.pos {
				row := (r*tc.Cap + int(p)) * kw
				copy(wantK[row:row+kw], k[r*kw:(r+1)*kw])
				copy(wantV[row:row+kw], v[r*kw:(r+1)*kw])
				keys = append(keys, wantK[r*tc.Cap*kw:row+kw]...)
				vals = append(vals, wantV[r*tc.Cap*kw:row+kw]...)
				cuK = append(cuK, cuK[len(cuK)-1]+p+1)
			}
			approx(t, "cache K", down(t, b, tck), rounded(wantK, tensor.F32), 0, 0)
			approx(t, "cache V", down(t, b, tcv), rounded(wantV, tensor.F32), 0, 0)
			cuQ := make([]int32, B+1)
			for i := range cuQ {
				cuQ[i] = int32(i)
			}
			nk := int(cuK[B])
			ref, refLSE := zeros(t, b, tensor.F32, B, qw), zeros(t, b, tensor.F32, B, tc.NH)
			must(t, b.Attention(backend.AttentionArgs{
				AttentionShape: backend.AttentionShape{CuSeqlens: upInts(t, b, cuQ, B+1), CuSeqlensK: upInts(t, b, cuK, B+1),
					NH: tc.NH, NKV: tc.NKV, HD: tc.HD, Window: tc.Window},
				Out: ref, LSE: refLSE, Q: up(t, b, q, tensor.F32, B, qw), K: up(t, b, keys, tensor.F32, nk, kw), V: up(t, b, vals, tensor.F32, nk, kw),
			}))
			approx(t, "out", down(t, b, out), down(t, b, ref), 1e-5, 1e-5)
			approx(t, "lse", down(t, b, lse), down(t, b, refLSE), 1e-5, 1e-5)
		})
	}
}

// TestDecodeAttentionRefusesBadPositions: a position outside its slot, and shapes that do not
// match B rows, are errors naming what is wrong.
func TestDecodeAttentionRefusesBadPositions(t *testing.T) {
	b := newTestBackend(t)
	const B, NH, HD, Cap = 2, 2, 4, 5
	args := func() backend.DecodeAttentionArgs {
		return backend.DecodeAttentionArgs{
			Out: zeros(t, b, tensor.F32, B, NH*HD), Q: zeros(t, b, tensor.F32, B, NH*HD),
			K: zeros(t, b, tensor.F32, B, NH*HD), V: zeros(t, b, tensor.F32, B, NH*HD),
			CacheK: zeros(t, b, tensor.F32, B*Cap, NH*HD), CacheV: zeros(t, b, tensor.F32, B*Cap, NH*HD),
			Positions: upInts(t, b, []int32{1, 4}, B), Cap: Cap, NH: NH, NKV: NH, HD: HD,
		}
	}
	for _, tc := range []struct {
		name string
		mod  func(a *backend.DecodeAttentionArgs)
		want string
	}{
		{"position past the slot", func(a *backend.DecodeAttentionArgs) { a.Positions = upInts(t, b, []int32{1, 5}, B) }, "row 1 is at position 5"},
		{"negative position", func(a *backend.DecodeAttentionArgs) { a.Positions = upInts(t, b, []int32{-1, 0}, B) }, "row 0 is at position -1"},
		{"cache of another slot length", func(a *backend.DecodeAttentionArgs) { a.Cap = 4 }, "CacheK"},
		{"heads not a multiple", func(a *backend.DecodeAttentionArgs) { a.NKV = 3 }, "multiple of NKV"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			a := args()
			tc.mod(&a)
			if err := b.DecodeAttention(a); err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("error %v, want one naming %q", err, tc.want)
			}
		})
	}
}

// TestSampleRowThresholds: the top-k and top-p bisections keep exactly the entries the sorted
// definitions keep (ties at the cut included), on random logits; over many seeds only kept
// entries are drawn and each kept entry is drawn.
func TestSampleRowThresholds(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 4))
	logits := make([]float32, 200)
	for i := range logits {
		logits[i] = float32(math.Round(r.NormFloat64()*8) / 4) // coarse values: ties
	}
	for _, a := range []backend.SampleArgs{
		{Temperature: 1, TopK: 7},
		{Temperature: 0.5, TopP: 0.8},
		{Temperature: 2, TopK: 30, TopP: 0.6},
		{Temperature: 1, TopK: 1},
	} {
		t.Run(fmt.Sprintf("T%v_k%d_p%v", a.Temperature, a.TopK, a.TopP), func(t *testing.T) {
			kept := keptBySorting(logits, a)
			drawn := map[int32]bool{}
			for seed := range uint64(4000) {
				a.Seed = seed
				id, nan := SampleRow(logits, a, 0)
				if nan {
					t.Fatal("NaN reported for finite logits")
				}
				if !kept[id] {
					t.Fatalf("seed %d drew %d (logit %v), outside the kept set", seed, id, logits[id])
				}
				drawn[id] = true
			}
			if len(drawn) != len(kept) {
				t.Errorf("drew %d distinct ids of the %d kept", len(drawn), len(kept))
			}
		})
	}
	if id, _ := SampleRow(logits, backend.SampleArgs{TopK: 3}, 0); logits[id] != slices.Max(logits) || slices.Index(logits, logits[id]) != int(id) {
		t.Errorf("temperature 0 gave %d, not the first index of the largest logit", id)
	}
	bad := slices.Clone(logits)
	bad[17] = float32(math.NaN())
	if _, nan := SampleRow(bad, backend.SampleArgs{Temperature: 1}, 0); !nan {
		t.Error("a NaN logit was not reported")
	}
}

// keptBySorting is the kept set of SampleArgs by its sorted definition: the entries at least
// the k-th largest scaled logit, then the entries at least the smallest of the shortest sorted
// prefix holding top_p of the remaining probability.
func keptBySorting(logits []float32, a backend.SampleArgs) map[int32]bool {
	s := make([]float64, len(logits))
	for i, l := range logits {
		s[i] = float64(l / a.Temperature)
	}
	order := make([]int, len(s))
	for i := range order {
		order[i] = i
	}
	sort.SliceStable(order, func(x, y int) bool { return s[order[x]] > s[order[y]] })
	thr := math.Inf(-1)
	if a.TopK > 0 && a.TopK < len(s) {
		thr = s[order[a.TopK-1]]
	}
	if a.TopP > 0 && a.TopP < 1 {
		z := 0.0
		for _, i := range order {
			if s[i] >= thr {
				z += math.Exp(s[i] - s[order[0]])
			}
		}
		cum := 0.0
		for j, i := range order {
			if s[i] < thr {
				break
			}
			cum += math.Exp(s[i] - s[order[0]])
			if cum >= float64(a.TopP)*z && (j+1 == len(order) || s[order[j+1]] < s[i]) {
				thr = s[i]
				break
			}
		}
	}
	kept := map[int32]bool{}
	for i, v := range s {
		if v >= thr {
			kept[int32(i)] = true
		}
	}
	return kept
}
