package models

import (
	"testing"
)

// TestForwardBackwardWeighted checks that per-token gradient scales equal the sum of separate
// scaled backward passes: scale c_d on every target token of document d gives the gradient
// of sum_d c_d * CE_d, which ForwardBackward computes one document at a time. The log-probs
// handed to weigh are the model's own (equal to TokenLogprobs).
func TestForwardBackwardWeighted(t *testing.T) {
	a := tinyArch("qwen3", nil)
	b := newCPU()
	m := newTiny(t, b, a, Options{}, 3)
	lens := []int{5, 7, 4}
	batch := packedBatch(a.Vocab, lens, 11)
	coef := []float32{0.7, -1.3, 0.25}
	wantLP, err := m.TokenLogprobs(batch)
	if err != nil {
		t.Fatal(err)
	}
	if err := m.ZeroGrads(); err != nil {
		t.Fatal(err)
	}
	err = m.ForwardBackwardWeighted(batch, func(lp []float32) ([]float32, error) {
		if d := maxAbsDiff(lp, wantLP); d > 1e-5 {
			t.Errorf("weigh got log-probs %g away from TokenLogprobs", d)
		}
		s := make([]float32, len(lp))
		for d := range lens {
			for i := batch.DocStarts[d]; i < batch.DocStarts[d+1]; i++ {
				s[i] = coef[d]
			}
		}
		return s, nil
	})
	if err != nil {
		t.Fatal(err)
	}
	got := allGrads(t, m)

	if err := m.ZeroGrads(); err != nil {
		t.Fatal(err)
	}
	for d := range lens {
		lo, hi := batch.DocStarts[d], batch.DocStarts[d+1]
		one := Batch{Tokens: batch.Tokens[lo:hi], Positions: batch.Positions[lo:hi], Targets: batch.Targets[lo:hi]}
		if _, _, err := m.ForwardBackward(one, coef[d]); err != nil {
			t.Fatal(err)
		}
	}
	want := allGrads(t, m)
	for name, w := range want {
		if r := relDiff(got[name], w); r > 1e-4 {
			t.Errorf("%s: weighted gradient differs from the per-document sum (relative %g)", name, r)
		}
	}

	// A scale of the wrong length is an error, not a silent truncation.
	err = m.ForwardBackwardWeighted(batch, func(lp []float32) ([]float32, error) { return make([]float32, 2), nil })
	if err == nil {
		t.Fatal("weigh returning 2 scales for a longer batch was accepted")
	}
	if err := m.ForwardBackwardWeighted(Batch{Tokens: batch.Tokens}, nil); err == nil {
		t.Fatal("a batch without targets was accepted")
	}
}
