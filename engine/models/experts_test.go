package models

import (
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/halo-shell/halo-shell/engine/hf/config"
	"github.com/halo-shell/halo-shell/engine/hf/safetensors"
)

// A model built with Options.Experts holds those experts only: its spec table is the full
// one less the other experts (same HF names), random init gives the values of the full model,
// it loads its experts from a whole checkpoint without reporting the others unused, exports
// only its own, and refuses to save itself as a whole checkpoint or to run without a runner.
func TestModelHoldingSomeExperts(t *testing.T) {
	for _, tc := range moeCases {
		t.Run(tc.name, func(t *testing.T) {
			cfg := tinyMoE(t, tc.fam, tc.mod).Config()
			held := ExpertRange{Lo: 2, Hi: 4}
			full, err := New(cfg, newCPU(), Options{})
			if err != nil {
				t.Fatal(err)
			}
			defer full.Close()
			sub, err := New(cfg, newCPU(), Options{Experts: held})
			if err != nil {
				t.Fatal(err)
			}
			defer sub.Close()
			for _, m := range []*Model{full, sub} {
				if err := m.InitRandom(7); err != nil {
					t.Fatal(err)
				}
			}
			if got := full.HeldExperts(); got != (ExpertRange{0, 6}) {
				t.Errorf("full model holds %v, want [0,6)", got)
			}
			if got := sub.HeldExperts(); got != held {
				t.Errorf("subset model holds %v, want %v", got, held)
			}
			var want []string
			dropped := 0
			for _, s := range full.Specs {
				if x, ok := full.ExpertOf(s.Name); ok && !held.Contains(x) {
					dropped += s.Numel()
					continue
				}
				want = append(want, s.Name)
			}
			var got []string
			for _, s := range sub.Specs {
				got = append(got, s.Name)
			}
			if !slices.Equal(got, want) || dropped == 0 {
				t.Fatalf("subset spec table %v\nwant %v (dropping %d elements)", got, want, dropped)
			}
			if _, arena := ArenaLayout(sub.Specs); sub.NumParams() != full.NumParams()-dropped || sub.Params.Flat.Numel() != arena {
				t.Errorf("subset holds %d parameters in a %d-element arena, full %d less %d", sub.NumParams(), sub.Params.Flat.Numel(), full.NumParams(), dropped)
			}
			for _, name := range want {
				a, _ := full.ParamFloat32(name)
				b, err := sub.ParamFloat32(name)
				if err != nil || !slices.Equal(a, b) {
					t.Fatalf("random init of %s differs from the full model's (%v)", name, err)
				}
			}
			for _, l := range sub.MoELayers() {
				if len(l.Experts) != 2 || l.FirstExpert != 2 || l.Routed() != 6 {
					t.Errorf("%s: %d experts from %d of %d, want 2 from 2 of 6", l.Name, len(l.Experts), l.FirstExpert, l.Routed())
				}
			}
			// Load from the full model's checkpoint.
			dir := t.TempDir()
			if err := full.Save(dir, SaveOptions{}); err != nil {
				t.Fatal(err)
			}
			ck, err := safetensors.OpenCheckpoint(dir)
			if err != nil {
				t.Fatal(err)
			}
			defer ck.Close()
			fresh, err := New(cfg, newCPU(), Options{Experts: held})
			if err != nil {
				t.Fatal(err)
			}
			defer fresh.Close()
			unused, err := fresh.LoadWeights(ck)
			if err != nil {
				t.Fatal(err)
			}
			if len(unused) != 0 {
				t.Errorf("loading experts %v reports %v unused", held, unused)
			}
			for _, name := range want {
				a, _ := full.ParamFloat32(name)
				b, _ := fresh.ParamFloat32(name)
				if !slices.Equal(a, b) {
					t.Fatalf("%s loaded differently from the checkpoint", name)
				}
			}
			ts, err := sub.WeightTensors(0)
			if err != nil {
				t.Fatal(err)
			}
			var names []string
			for _, x := range ts {
				names = append(names, x.Name)
			}
			if !slices.Equal(names, want) {
				t.Errorf("WeightTensors of the subset: %v, want %v", names, want)
			}
			if err := sub.Save(filepath.Join(t.TempDir(), "part"), SaveOptions{}); err == nil || !strings.Contains(err.Error(), "holds experts [2,4) of 6") {
				t.Errorf("saving a subset model: got %v", err)
			}
			b := packedBatch(41, []int{6}, 3)
			if _, _, err := sub.Forward(b); err == nil || !strings.Contains(err.Error(), "expert runner") {
				t.Errorf("running a subset model without runners: got %v", err)
			}
		})
	}
}

func TestExpertRangeIsChecked(t *testing.T) {
	moe := tinyMoE(t, "qwen3_moe", nil).Config()
	dense, err := config.Preset("llama", "tiny")
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		cfg  *config.Config
		r    ExpertRange
		want string
	}{
		{"negative", moe, ExpertRange{-1, 2}, "expert range [-1,2) is not a non-empty part of the 6 experts"},
		{"empty", moe, ExpertRange{3, 3}, "expert range [3,3)"},
		{"past the end", moe, ExpertRange{4, 7}, "expert range [4,7)"},
		{"dense model", dense, ExpertRange{0, 1}, "has no routed experts"},
	} {
		m, err := New(tc.cfg, newCPU(), Options{Experts: tc.r})
		if err == nil {
			m.Close()
		}
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: got %v, want an error containing %q", tc.name, err, tc.want)
		}
	}
}
