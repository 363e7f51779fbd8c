package models

import (
	"math"
	"path/filepath"
	"testing"

	"github.com/halo-shell/halo-shell/engine/hf/config"
)

// TestClassifierGradientMatchesFiniteDifferences checks ForwardBackwardScores: the gradient
// of L = sum_d c_d * score_d along the gradient direction equals the finite difference of L.
func TestClassifierGradientMatchesFiniteDifferences(t *testing.T) {
	a := tinyArch("qwen3", nil)
	a.NumLabels = 1
	b := newCPU()
	m := newTiny(t, b, a, Options{NumLabels: 1}, 4)
	if !m.IsClassifier() {
		t.Fatal("NumLabels 1 did not build a classifier")
	}
	for _, s := range m.Specs {
		if s.Name == nameLMHead {
			t.Fatal("a classifier has an lm_head parameter")
		}
	}
	batch := packedBatch(a.Vocab, []int{5, 7, 4}, 2)
	batch.Targets = nil
	coef := []float32{0.5, -1, 2}
	loss := func() float64 {
		s, err := m.Scores(batch)
		if err != nil {
			t.Fatal(err)
		}
		l := 0.0
		for d, v := range s {
			l += float64(coef[d]) * float64(v)
		}
		return l
	}
	if err := m.ZeroGrads(); err != nil {
		t.Fatal(err)
	}
	var seen []float32
	if err := m.ForwardBackwardScores(batch, func(s []float32) ([]float32, error) { seen = s; return coef, nil }); err != nil {
		t.Fatal(err)
	}
	want, _ := m.Scores(batch)
	if d := maxAbsDiff(seen, want); len(seen) != 3 || d > 1e-5 {
		t.Fatalf("weigh saw scores %v, Scores gives %v", seen, want)
	}
	grads := allGrads(t, m)
	params := map[string][]float32{}
	norm := 0.0
	for n, g := range grads {
		params[n], _ = m.ParamFloat32(n)
		for _, v := range g {
			norm += float64(v) * float64(v)
		}
	}
	norm = math.Sqrt(norm)
	if grads[nameScore] == nil || norm == 0 {
		t.Fatal("no gradient reached the score head")
	}
	h := 1e-3
	move := func(sign float64) {
		for n, p := range params {
			q := make([]float32, len(p))
			for i := range p {
				q[i] = p[i] + float32(sign*h*float64(grads[n][i])/norm)
			}
			if err := m.SetParam(n, q); err != nil {
				t.Fatal(err)
			}
		}
	}
	move(1)
	lp := loss()
	move(-1)
	lm := loss()
	if fd := (lp - lm) / (2 * h); math.Abs(fd-norm) > 0.02*norm {
		t.Errorf("finite difference %g, gradient norm %g", fd, norm)
	}
	if _, err := m.TokenLogprobs(packedBatch(a.Vocab, []int{3}, 1)); err == nil {
		t.Error("a language-model pass on a classifier was accepted")
	}
}

// TestClassifierPoolsLastNonPadToken checks transformers' pooling: trailing pad tokens do not
// change a sequence's score.
func TestClassifierPoolsLastNonPadToken(t *testing.T) {
	a := tinyArch("qwen3", nil)
	a.PadID = 3
	b := newCPU()
	m := newTiny(t, b, a, Options{NumLabels: 1}, 5)
	one, err := m.Scores(Batch{Tokens: []int32{5, 9, 11}})
	if err != nil {
		t.Fatal(err)
	}
	padded, err := m.Scores(Batch{Tokens: []int32{5, 9, 11, 3, 3}})
	if err != nil {
		t.Fatal(err)
	}
	if math.Abs(float64(one[0]-padded[0])) > 1e-5 {
		t.Errorf("score %v with trailing pads, %v without", padded[0], one[0])
	}
}

// TestClassifierSaveLoad checks the saved layout (score.weight, no lm_head, the classifier
// class, id2label, pad_token_id) and that loading it back gives the same scores.
func TestClassifierSaveLoad(t *testing.T) {
	dir := t.TempDir()
	c, err := config.Load(filepath.Join("testdata", "parity", "qwen3"))
	if err != nil {
		t.Fatal(err)
	}
	c.PadTokenID = config.IntPtr(0)
	b := newCPU()
	m, err := New(c, b, Options{NumLabels: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	if err := m.InitRandom(3); err != nil {
		t.Fatal(err)
	}
	if err := m.Save(dir, SaveOptions{}); err != nil {
		t.Fatal(err)
	}
	back, err := config.Load(dir)
	if err != nil {
		t.Fatal(err)
	}
	if len(back.Architectures) != 1 || back.Architectures[0] != "Qwen3ForSequenceClassification" || back.PadTokenID == nil {
		t.Fatalf("saved config: architectures %v pad_token_id %v", back.Architectures, back.PadTokenID)
	}
	if _, ok := back.Extra("id2label"); !ok {
		t.Fatal("saved config has no id2label")
	}
	l, err := Load(dir, b, Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	if !l.IsClassifier() || len(l.Unused) != 0 {
		t.Fatalf("loaded back: classifier %v, unused %v", l.IsClassifier(), l.Unused)
	}
	ids := Batch{Tokens: []int32{1, 2, 3, 4}}
	s1, _ := m.Scores(ids)
	s2, err := l.Scores(ids)
	if err != nil {
		t.Fatal(err)
	}
	if s1[0] != s2[0] {
		t.Errorf("scores %v before saving, %v after loading", s1, s2)
	}
}
