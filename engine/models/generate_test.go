package models

import (
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"sort"
	"strings"
	"testing"
)

// uncachedGreedy continues prompt by re-running the whole sequence for every token and taking
// the argmax, stopping after a stop id or n tokens.
func uncachedGreedy(t *testing.T, m *Model, prompt []int32, n int, stop []int32) []int32 {
	t.Helper()
	seq := slices.Clone(prompt)
	for range n {
		lg, err := m.NextLogits(seq)
		if err != nil {
			t.Fatal(err)
		}
		id := Argmax(lg)
		seq = append(seq, id)
		if slices.Contains(stop, id) {
			break
		}
	}
	return seq[len(prompt):]
}

// batchPrompts are prompts of different lengths, so that the rows' keys sit at different
// offsets of the packed cache and the rows reach sliding windows at different steps.
var batchPrompts = [][]int32{{3, 9, 1, 22, 5}, {7, 2}, {11, 4, 30, 6, 8, 19, 2}, {5}}

// checkBatchGreedy checks greedy batched decoding against uncached decoding of each row, first
// to the full length, then with a stop id that ends some rows early (they leave the cache).
func checkBatchGreedy(t *testing.T, m *Model) {
	const n = 8
	got, err := m.GenerateBatch(batchPrompts, BatchGenerateOptions{GenerateOptions: GenerateOptions{MaxNewTokens: n}})
	if err != nil {
		t.Fatal(err)
	}
	for r, p := range batchPrompts {
		if want := uncachedGreedy(t, m, p, n, nil); !slices.Equal(got[r], want) {
			t.Errorf("row %d: batched cached greedy %v, uncached %v", r, got[r], want)
		}
	}
	// Stop on row 1's third token: row 1 ends after 3 tokens, others wherever they emit it.
	stop := []int32{got[1][2]}
	got, err = m.GenerateBatch(batchPrompts, BatchGenerateOptions{GenerateOptions: GenerateOptions{MaxNewTokens: n, StopIDs: stop}})
	if err != nil {
		t.Fatal(err)
	}
	early := 0
	for r, p := range batchPrompts {
		want := uncachedGreedy(t, m, p, n, stop)
		if len(want) < n {
			early++
		}
		if !slices.Equal(got[r], want) {
			t.Errorf("row %d with stop %v: batched %v, uncached %v", r, stop, got[r], want)
		}
	}
	if early == 0 {
		t.Fatal("no row stopped early: the test does not exercise rows leaving the batch")
	}
}

// TestGenerateBatchGreedyMatchesUncached checks, token by token for every dense family case
// (GQA, MHA, sliding windows, q/k norm, partial rotary, yarn and llama3 rope, biases), that
// greedy batched decoding with the KV cache equals the argmax of a full uncached forward.
func TestGenerateBatchGreedyMatchesUncached(t *testing.T) {
	for _, dec := range decoders {
		for _, tc := range familyCases {
			t.Run(dec+"/"+tc.name, func(t *testing.T) {
				m := newTiny(t, newCPU(), tc.arch, Options{}, 12)
				useDecoder(t, m, dec)
				checkBatchGreedy(t, m)
			})
		}
	}
}

// TestMoEGenerateBatchGreedyMatchesUncached is the same check for the mixture-of-experts
// families, whose routers see a different set of tokens at every step.
func TestMoEGenerateBatchGreedyMatchesUncached(t *testing.T) {
	for _, dec := range decoders {
		for _, tc := range moeCases {
			t.Run(dec+"/"+tc.name, func(t *testing.T) {
				m := tinyMoE(t, tc.fam, tc.mod)
				useDecoder(t, m, dec)
				checkBatchGreedy(t, m)
			})
		}
	}
}

// TestGenerateBatchRowsAreIndependent checks that a sampled row depends only on its prompt, the
// seed and its row index: changing the other rows' prompts (and so which rows run beside it and
// when they stop) leaves it unchanged, a lone Generate equals row 0, the same seed repeats and
// another seed differs.
func TestGenerateBatchRowsAreIndependent(t *testing.T) {
	for _, dec := range decoders {
		t.Run(dec, func(t *testing.T) {
			m := newTiny(t, newCPU(), familyCases[5].arch, Options{}, 21)
			useDecoder(t, m, dec)
			checkRowsIndependent(t, m)
		})
	}
}

func checkRowsIndependent(t *testing.T, m *Model) {
	o := BatchGenerateOptions{GenerateOptions: GenerateOptions{MaxNewTokens: 10, Temperature: 1.3, TopK: 20, TopP: 0.95, Seed: 7}}
	a, err := m.GenerateBatch(batchPrompts, o)
	if err != nil {
		t.Fatal(err)
	}
	other := [][]int32{{1, 2, 3, 4, 5, 6, 7, 8, 9}, {30}, batchPrompts[2], {8, 8}}
	o.StopIDs = []int32{a[0][1]}
	b, err := m.GenerateBatch(other, o)
	if err != nil {
		t.Fatal(err)
	}
	want2 := a[2]
	if i := slices.Index(want2, o.StopIDs[0]); i >= 0 {
		want2 = want2[:i+1]
	}
	if !slices.Equal(b[2], want2) {
		t.Errorf("row 2 changed with the other rows: %v, alone among others %v", want2, b[2])
	}
	o.StopIDs = nil
	one, err := m.Generate(batchPrompts[0], o.GenerateOptions)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(one, a[0]) {
		t.Errorf("lone Generate %v, batch row 0 %v", one, a[0])
	}
	again, err := m.GenerateBatch(batchPrompts, o)
	if err != nil {
		t.Fatal(err)
	}
	if fmt.Sprint(again) != fmt.Sprint(a) {
		t.Errorf("same seed: %v then %v", a, again)
	}
	o.Seed = 8
	c, err := m.GenerateBatch(batchPrompts, o)
	if err != nil {
		t.Fatal(err)
	}
	if fmt.Sprint(c) == fmt.Sprint(a) {
		t.Errorf("seeds 7 and 8 gave the same completions %v", a)
	}
	// Rows with the same prompt (GRPO's generations of one prompt) take different samples.
	same, err := m.GenerateBatch([][]int32{batchPrompts[0], batchPrompts[0], batchPrompts[0]}, o)
	if err != nil {
		t.Fatal(err)
	}
	if slices.Equal(same[0], same[1]) && slices.Equal(same[1], same[2]) {
		t.Errorf("three rows of one prompt sampled the same %v", same[0])
	}
}

// TestGenerateBatchRejectsBadInput checks the errors of bad arguments.
func TestGenerateBatchRejectsBadInput(t *testing.T) {
	m := newTiny(t, newCPU(), familyCases[0].arch, Options{}, 2)
	ok := GenerateOptions{MaxNewTokens: 2}
	for _, tc := range []struct {
		name    string
		prompts [][]int32
		o       GenerateOptions
		want    string
	}{
		{"no prompts", nil, ok, "at least one prompt"},
		{"empty prompt", [][]int32{{1}, {}}, ok, "prompt 1 is empty"},
		{"no tokens to make", [][]int32{{1}}, GenerateOptions{}, "max new tokens"},
		{"top_p above 1", [][]int32{{1}}, GenerateOptions{MaxNewTokens: 1, Temperature: 1, TopP: 1.5}, "top_p"},
		{"negative temperature", [][]int32{{1}}, GenerateOptions{MaxNewTokens: 1, Temperature: -1}, "temperature"},
		{"token outside vocabulary", [][]int32{{1}, {999}}, ok, "outside the vocabulary"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := m.GenerateBatch(tc.prompts, BatchGenerateOptions{GenerateOptions: tc.o})
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("error %v, want one naming %q", err, tc.want)
			}
		})
	}
}

// warped is the reference sampling distribution, written out the slow way: softmax at the
// temperature over all tokens, keep the top k (by logit, lower id first on ties), renormalise,
// keep the shortest prefix reaching top_p, renormalise.
func warped(logits []float32, o GenerateOptions) []float64 {
	idx := make([]int, len(logits))
	for i := range idx {
		idx[i] = i
	}
	sort.SliceStable(idx, func(a, b int) bool { return logits[idx[a]] > logits[idx[b]] })
	if o.TopK > 0 && o.TopK < len(idx) {
		idx = idx[:o.TopK]
	}
	p := make([]float64, len(logits))
	z := 0.0
	for _, j := range idx {
		p[j] = math.Exp(float64(logits[j]) / o.Temperature)
		z += p[j]
	}
	for _, j := range idx {
		p[j] /= z
	}
	if o.TopP > 0 && o.TopP < 1 {
		cum, cut := 0.0, len(idx)
		for i, j := range idx {
			cum += p[j]
			if cum >= o.TopP {
				cut = i + 1
				break
			}
		}
		z = 0
		for _, j := range idx[cut:] {
			p[j] = 0
		}
		for _, j := range idx[:cut] {
			z += p[j]
		}
		for _, j := range idx[:cut] {
			p[j] /= z
		}
	}
	return p
}

// TestSampleDistribution draws many samples from tiny logits and checks each token's frequency
// against the warped distribution within 5 standard errors, and that filtered tokens never
// appear.
func TestSampleDistribution(t *testing.T) {
	logits := []float32{2.0, 0.5, 1.0, -1.0, 1.0, 0.0, -3.0}
	for _, o := range []GenerateOptions{
		{Temperature: 1},
		{Temperature: 0.5},
		{Temperature: 2.5},
		{Temperature: 1, TopK: 3},
		{Temperature: 1, TopK: 1},
		{Temperature: 1, TopP: 0.6},
		{Temperature: 0.8, TopP: 0.9},
		{Temperature: 1.5, TopK: 4, TopP: 0.7},
		{Temperature: 1, TopK: 2}, // a tie at the cut: the lower id (2) is kept, 4 is not
	} {
		t.Run(fmt.Sprintf("T%v_k%d_p%v", o.Temperature, o.TopK, o.TopP), func(t *testing.T) {
			want := warped(logits, o)
			const draws = 40000
			counts := make([]int, len(logits))
			rng := rand.New(rand.NewPCG(1, 2))
			for range draws {
				counts[sample(logits, o, rng)]++
			}
			for j, p := range want {
				f := float64(counts[j]) / draws
				if p == 0 {
					if counts[j] != 0 {
						t.Errorf("token %d is filtered out but was drawn %d times", j, counts[j])
					}
					continue
				}
				se := math.Sqrt(p * (1 - p) / draws)
				if math.Abs(f-p) > 5*se+1e-12 {
					t.Errorf("token %d: frequency %.4f, probability %.4f (5 s.e. = %.4f)", j, f, p, 5*se)
				}
			}
		})
	}
}

// TestSampleGreedy checks that temperature 0 is the argmax, whatever top-k and top-p say.
func TestSampleGreedy(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 1))
	if got := sample([]float32{0, 3, 3, 1}, GenerateOptions{TopK: 1, TopP: 0.1}, rng); got != 1 {
		t.Errorf("greedy = %d, want 1 (the first maximum)", got)
	}
}

// TestKthLargest checks quickselect against a sort, with ties and extremes.
func TestKthLargest(t *testing.T) {
	rng := rand.New(rand.NewPCG(5, 5))
	for trial := range 200 {
		n := 1 + rng.IntN(40)
		v := make([]float32, n)
		for i := range v {
			v[i] = float32(rng.IntN(7)) // many ties
		}
		s := slices.Clone(v)
		slices.Sort(s)
		slices.Reverse(s)
		k := 1 + rng.IntN(n)
		if got := kthLargest(v, k); got != s[k-1] {
			t.Fatalf("trial %d: %d-th largest of %v = %v, want %v", trial, k, v, got, s[k-1])
		}
	}
}

// TestLossTemperature checks that after SetLossTemperature(t) the token log-probs are those of
// log_softmax(logits / t), from the uncached logits, that 1 restores them, and that the
// logits generation samples from do not change.
func TestLossTemperature(t *testing.T) {
	m := newTiny(t, newCPU(), familyCases[0].arch, Options{}, 4)
	ids := []int32{3, 9, 1, 22, 5}
	lg, err := m.NextLogits(ids[:4])
	if err != nil {
		t.Fatal(err)
	}
	lpAt := func(temp float64) float64 {
		mx := math.Inf(-1)
		for _, v := range lg {
			mx = math.Max(mx, float64(v)/temp)
		}
		z := 0.0
		for _, v := range lg {
			z += math.Exp(float64(v)/temp - mx)
		}
		return float64(lg[ids[4]])/temp - mx - math.Log(z)
	}
	for _, temp := range []float64{0.7, 1.6, 1} {
		if err := m.SetLossTemperature(temp); err != nil {
			t.Fatal(err)
		}
		if got, err := m.NextLogits(ids[:4]); err != nil || got[7] != lg[7] {
			t.Errorf("temperature %v changed the generation logits: %v, was %v (%v)", temp, got[7], lg[7], err)
		}
		lp, err := m.Logprobs(ids)
		if err != nil {
			t.Fatal(err)
		}
		if got, want := float64(lp[3]), lpAt(temp); math.Abs(got-want) > 1e-5 {
			t.Errorf("temperature %v: log-prob %v, want %v", temp, got, want)
		}
	}
	if err := m.SetLossTemperature(0); err == nil {
		t.Error("temperature 0 accepted")
	}
}

// TestSampleRowsReportsNaN checks that a row of NaN logits is reported (and the others are
// sampled), greedy and sampled.
func TestSampleRowsReportsNaN(t *testing.T) {
	nan := float32(math.NaN())
	logits := [][]float32{{0, 5, 1}, {1, nan, 0}, {9, 0, 0}}
	rngs := []*rand.Rand{rowRNG(1, 0), rowRNG(1, 1), rowRNG(1, 2)}
	for _, o := range []GenerateOptions{{}, {Temperature: 1, TopK: 2}} {
		ids, bad := sampleRows(logits, []int{0, 1, 2}, o, rngs)
		if bad != 1 {
			t.Errorf("%+v: bad row %d, want 1", o, bad)
		}
		if o.Temperature == 0 && (ids[0] != 1 || ids[2] != 0) {
			t.Errorf("greedy ids %v, want 1 and 0 for the good rows", ids)
		}
	}
	if _, bad := sampleRows(logits[:1], []int{0}, GenerateOptions{}, rngs); bad != -1 {
		t.Errorf("no NaN: bad %d", bad)
	}
}
