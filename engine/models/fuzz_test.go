package models

import (
	"testing"

	"github.com/halo-shell/halo-shell/engine/hf/config"
)

// FuzzBatch feeds arbitrary token/position/boundary/target arrays to the model: every batch
// is either refused with an error or runs; nothing panics and nothing leaks.
func FuzzBatch(f *testing.F) {
	f.Add([]byte{1, 2, 3, 4}, []byte{0, 1, 0, 1}, []byte{0, 2, 4}, []byte{2, 3, 4, 0})
	f.Add([]byte{5}, []byte{}, []byte{}, []byte{})
	f.Add([]byte{1, 2, 3}, []byte{0, 0, 0}, []byte{0, 3, 1}, []byte{9, 9, 9})
	b := newCPU()
	m := newTiny(f, b, tinyArch("mistral", func(a *Arch) { a.Windows = []int{2, 2} }), Options{}, 1)
	base := b.MemStats().Allocated
	// ints maps bytes to ids: v-1 (so 0 gives -1), and 0xfe gives the ignore index -100.
	ints := func(raw []byte) []int32 {
		if len(raw) == 0 {
			return nil
		}
		out := make([]int32, len(raw))
		for i, v := range raw {
			out[i] = int32(v) - 1
			if v == 0xfe {
				out[i] = -100
			}
		}
		return out
	}
	f.Fuzz(func(t *testing.T, tokens, positions, starts, targets []byte) {
		if len(tokens) > 64 {
			return
		}
		batch := Batch{Tokens: ints(tokens), Positions: ints(positions),
			DocStarts: ints(starts), Targets: ints(targets)}
		if batch.Targets == nil {
			batch.Targets = []int32{}
		}
		_, _, _ = m.ForwardBackward(batch, 1)
		_, _ = m.TokenLogprobs(batch)
		if got := b.MemStats().Allocated; got != base+m.Grads.Flat.Bytes() && got != base {
			t.Fatalf("allocated %d bytes, started with %d", got, base)
		}
	})
}

// FuzzApplyOverrides feeds arbitrary --set arguments: each is applied or refused with an
// error; nothing panics, and an accepted config builds a model or is refused by New.
func FuzzApplyOverrides(f *testing.F) {
	for _, s := range []string{"num_hidden_layers=3", "hidden_size=wide", "=1", "rope_parameters={\"rope_type\":\"yarn\",\"factor\":4}",
		"num_key_value_heads=3", "sliding_window=-1", "vocab_size=0", "layer_types=[\"sliding_attention\"]", "x"} {
		f.Add(s)
	}
	base, err := config.Preset("qwen3", "tiny")
	if err != nil {
		f.Fatal(err)
	}
	b := newCPU()
	f.Fuzz(func(t *testing.T, kv string) {
		cfg, err := ApplyOverrides(base, []string{kv})
		if err != nil {
			return
		}
		if cfg.VocabSize*cfg.HiddenSize > 1<<20 || cfg.NumHiddenLayers > 8 || cfg.IntermediateSize > 1<<12 ||
			cfg.NumAttentionHeads*cfg.HeadDim > 1<<12 {
			return // valid but too big to build in a fuzz loop
		}
		if m, err := New(cfg, b, Options{}); err == nil {
			m.Close()
		}
	})
}
