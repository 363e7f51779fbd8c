package models

import (
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"

	"github.com/halo-shell/halo-shell/engine/backend"
	"github.com/halo-shell/halo-shell/engine/hf/config"
	"github.com/halo-shell/halo-shell/engine/tensor"
)

// A sequence classifier (Arch.NumLabels > 0) is transformers' XForSequenceClassification: the
// decoder, its final norm, and score.weight [L, C] (no bias) in place of the LM head. A
// sequence's scores are score.weight @ norm(h) at its pooled token, the last token that is
// not pad_token_id (transformers' rule; the last token when every one is padding or there
// is no pad_token_id). A reward model is a classifier with one label.

// classifierSuffix ends the transformers class name of a sequence classifier.
const classifierSuffix = "ForSequenceClassification"

// classifierLabels is the number of labels of cfg when its architectures name a sequence
// classifier (num_labels, else the size of id2label, else transformers' default 2), 0 when
// they do not.
func classifierLabels(cfg *config.Config) int {
	if len(cfg.Architectures) == 0 || !strings.HasSuffix(cfg.Architectures[0], classifierSuffix) {
		return 0
	}
	if raw, ok := cfg.Extra("num_labels"); ok {
		if n, err := strconv.Atoi(strings.TrimSpace(string(raw))); err == nil && n > 0 {
			return n
		}
	}
	if raw, ok := cfg.Extra("id2label"); ok {
		var m map[string]any
		if json.Unmarshal(raw, &m) == nil && len(m) > 0 {
			return len(m)
		}
	}
	return 2
}

// ClassifierArchitecture is the transformers class of family f's sequence classifier, e.g.
// Qwen3ForSequenceClassification.
func ClassifierArchitecture(f *Family) string {
	name := f.Architectures[0]
	return strings.TrimSuffix(name, "ForCausalLM") + classifierSuffix
}

// classifierConfig adapts the config.json written by Save for a classifier: its
// architectures, id2label and label2id (num_labels follows from them), and pad_token_id.
func (m *Model) classifierConfig(cfg *config.Config) {
	cfg.Architectures = []string{ClassifierArchitecture(m.Family)}
	id2, l2i := map[string]string{}, map[string]int{}
	for i := 0; i < m.Arch.NumLabels; i++ {
		id2[strconv.Itoa(i)] = "LABEL_" + strconv.Itoa(i)
		l2i["LABEL_"+strconv.Itoa(i)] = i
	}
	a, _ := json.Marshal(id2)
	b, _ := json.Marshal(l2i)
	cfg.SetExtra("id2label", a)
	cfg.SetExtra("label2id", b)
	if m.Arch.PadID >= 0 && cfg.PadTokenID == nil {
		cfg.PadTokenID = config.IntPtr(m.Arch.PadID)
	}
}

// IsClassifier reports whether the model is a sequence classifier (a score head, no LM head).
func (m *Model) IsClassifier() bool { return m.Arch.NumLabels > 0 }

// errClassifier refuses language-model passes on a classifier.
func (m *Model) lmOnly(what string) error {
	if m.Arch.NumLabels > 0 {
		return fmt.Errorf("models: %s: the model is a sequence classifier (score head, no LM head); use Scores", what)
	}
	return nil
}

// pooled returns the pooled token of each document of r: the last that is not pad.
func pooled(r *resolved, pad int) []int {
	D := len(r.cu) - 1
	out := make([]int, D)
	for d := 0; d < D; d++ {
		lo, hi := int(r.cu[d]), int(r.cu[d+1])
		out[d] = hi - 1
		if pad < 0 {
			continue
		}
		for i := hi - 1; i >= lo; i-- {
			if int(r.tokens[i]) != pad {
				out[d] = i
				break
			}
		}
	}
	return out
}

// Scores returns the classifier's scores of every document of b, [D*L] row-major (L =
// NumLabels), with no gradients. Targets are not needed.
func (m *Model) Scores(b Batch) ([]float32, error) {
	if m.Arch.NumLabels == 0 {
		return nil, errors.New("models: Scores: the model is a causal LM, not a sequence classifier")
	}
	r, err := m.resolve(&b)
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
	hid, rstd, err := m.head.Norm.Forward(&p.Pass, x)
	if err != nil {
		return nil, err
	}
	defer m.b.Free(rstd)
	defer m.b.Free(hid)
	logits, err := m.score.Forward(&p.Pass, hid)
	if err != nil {
		return nil, err
	}
	defer m.b.Free(logits)
	all, err := backend.ToFloat32(m.b, logits)
	if err != nil {
		return nil, err
	}
	return pick(all, pooled(r, m.Arch.PadID), m.Arch.NumLabels), nil
}

func pick(all []float32, rows []int, L int) []float32 {
	out := make([]float32, 0, len(rows)*L)
	for _, i := range rows {
		out = append(out, all[i*L:(i+1)*L]...)
	}
	return out
}

// ForwardBackwardScores runs the classifier on b, hands the scores [D*L] of its documents to
// weigh, which returns dL/dscores of the same shape, and accumulates into the gradient arena
// (+=) the gradient of that loss (plus AuxLossScale() * AuxLoss() for mixture-of-experts
// models). Targets are not needed.
func (m *Model) ForwardBackwardScores(b Batch, weigh func(scores []float32) ([]float32, error)) error {
	if m.Arch.NumLabels == 0 {
		return errors.New("models: ForwardBackwardScores: the model is a causal LM, not a sequence classifier")
	}
	L := m.Arch.NumLabels
	_, err := m.forwardBackward(b, func(p *pass, r *resolved, x tensor.Tensor) (tensor.Tensor, error) {
		var hid, rstd, logits, dlogits, dhid tensor.Tensor
		defer func() {
			for _, t := range []tensor.Tensor{hid, rstd, logits, dlogits, dhid} {
				if !t.IsNil() {
					_ = m.b.Free(t)
				}
			}
		}()
		var err error
		if hid, rstd, err = m.head.Norm.Forward(&p.Pass, x); err != nil {
			return tensor.Tensor{}, err
		}
		if logits, err = m.score.Forward(&p.Pass, hid); err != nil {
			return tensor.Tensor{}, err
		}
		all, err := backend.ToFloat32(m.b, logits)
		if err != nil {
			return tensor.Tensor{}, err
		}
		rows := pooled(r, m.Arch.PadID)
		g, err := weigh(pick(all, rows, L))
		if err != nil {
			return tensor.Tensor{}, err
		}
		if len(g) != len(rows)*L {
			return tensor.Tensor{}, fmt.Errorf("models: ForwardBackwardScores: weigh returned %d gradients for %d scores", len(g), len(rows)*L)
		}
		dl := make([]float32, p.N*L)
		for d, i := range rows {
			copy(dl[i*L:(i+1)*L], g[d*L:(d+1)*L])
		}
		if dlogits, err = backend.FromFloat32(m.b, dl, p.DType, p.N, L); err != nil {
			return tensor.Tensor{}, err
		}
		if dhid, err = m.b.Empty(p.DType, p.N, m.Arch.Hidden); err != nil {
			return tensor.Tensor{}, err
		}
		if err = m.score.Backward(&p.Pass, dhid, dlogits, hid, false); err != nil {
			return tensor.Tensor{}, err
		}
		dx, err := m.b.Empty(p.DType, x.Shape()...)
		if err != nil {
			return tensor.Tensor{}, err
		}
		if err = m.head.Norm.Backward(&p.Pass, dx, dhid, x, rstd, false); err != nil {
			_ = m.b.Free(dx)
			return tensor.Tensor{}, err
		}
		return dx, nil
	})
	return err
}
