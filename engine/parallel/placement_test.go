package parallel

import (
	"slices"
	"strings"
	"testing"

	"github.com/halo-shell/halo-shell/engine/mesh"
	"github.com/halo-shell/halo-shell/engine/models"
	"github.com/halo-shell/halo-shell/engine/optim"
)

// A plan lays out every parameter as its family's table declares: the table's split under
// tensor parallelism, everything whole with one tensor rank, and routed experts whole under
// etp = 1.
func TestPlanPlacesByFamilyTable(t *testing.T) {
	for _, tc := range []struct {
		family, layout string
		n              int
	}{
		{"llama", "tp=2", 2}, {"qwen3", "tp=4", 4}, {"qwen3", "", 2},
		{"qwen3_moe", "tp=2", 2}, {"qwen3_moe", "ep=2 tp=2 etp=2", 4}, {"mixtral", "tp=2 etp=2", 2},
	} {
		t.Run(tc.family+" "+tc.layout, func(t *testing.T) {
			src := tinyModel(t, tc.family, 1)
			p := newPlan(t, src, tc.n, tc.layout, optim.Config{})
			l := p.Mesh.Layout
			splits := map[models.Split]int{}
			for _, s := range src.Specs {
				pp, err := src.Family.Place(s.Name)
				if err != nil {
					t.Fatal(err)
				}
				want := pp.Split
				if l.TP == 1 || (pp.Expert >= 0 && l.ETP == 1) {
					want = models.Replicated
				}
				if got := p.Placement(s.Name); got != want {
					t.Errorf("%s: placed %v, want %v (table entry %q %v)", s.Name, got, want, pp.Module, pp.Split)
				}
				splits[p.Placement(s.Name)]++
			}
			if l.TP > 1 && (splits[models.Column] == 0 || splits[models.Row] == 0) {
				t.Errorf("no column or row split under %s: %v", tc.layout, splits)
			}
		})
	}
}

// A table that disagrees with the weights is refused when the plan binds, naming the weight,
// its shape and the split the table asked for.
func TestPlanRefusesWrongTable(t *testing.T) {
	set := func(module string, split models.Split) func([]models.Placement) []models.Placement {
		return func(ps []models.Placement) []models.Placement {
			for i := range ps {
				if ps[i].Module == module {
					ps[i].Split = split
				}
			}
			return ps
		}
	}
	for _, tc := range []struct {
		name, family, layout string
		n                    int
		edit                 func([]models.Placement) []models.Placement
		want                 []string
	}{
		{"row weight declared column", "llama", "tp=2", 2, set("model.layers.*.self_attn.o_proj", models.Column),
			[]string{`"model.layers.0.self_attn.o_proj.weight" [16 32]`, "column-parallel", "should hold [8 32]", "holds [16 16]"}},
		{"column weight declared whole", "llama", "tp=2", 2, set("model.layers.*.self_attn.q_proj", models.Replicated),
			[]string{`"model.layers.0.self_attn.q_proj.weight" [32 16]`, "whole on every tensor rank", "should hold [32 16]", "holds [16 16]"}},
		{"split bias declared whole", "llama", "tp=2", 2, set("model.layers.*.self_attn.k_proj", models.Replicated),
			[]string{`"model.layers.0.self_attn.k_proj.weight" [16 16]`, "holds [8 16]"}},
		{"whole norm declared column", "qwen3", "tp=2", 2, set("model.layers.*.self_attn.q_norm", models.Column),
			[]string{`"model.layers.0.self_attn.q_norm.weight" [4]`, "column-parallel", "should hold [2]", "holds [4]"}},
		{"vector declared row", "llama", "tp=2", 2, set("model.norm", models.Row),
			[]string{`"model.norm.weight" [16]`, "row-parallel", "cuts dim 1 of a matrix"}},
		{"split that does not divide", "llama", "tp=2", 2, set("model.embed_tokens", models.Column),
			[]string{`"model.embed_tokens.weight" [41 16]`, "column-parallel", "dim 0 into 2 equal parts"}},
		{"expert down declared column", "qwen3_moe", "tp=2 etp=2", 2, set("model.layers.*.mlp.experts.*.down_proj", models.Column),
			[]string{`"model.layers.1.mlp.experts.0.down_proj.weight" [16 8]`, "column-parallel", "should hold [8 8]", "holds [16 4]"}},
		{"dense mlp of a mixture declared column", "qwen3_moe", "tp=2", 2, set("model.layers.*.mlp.gate_proj", models.Column),
			[]string{`"model.layers.0.mlp.gate_proj.weight" [24 16]`, "should hold [12 16]", "holds [24 16]"}},
		{"missing entry", "mistral", "", 1, func(ps []models.Placement) []models.Placement {
			return slices.DeleteFunc(ps, func(p models.Placement) bool { return p.Module == "model.layers.*.post_attention_layernorm" })
		}, []string{`"model.layers.0.post_attention_layernorm.weight"`, `add an entry for "model.layers.*.post_attention_layernorm"`}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			src := tinyModel(t, tc.family, 1)
			f := *src.Family
			f.Placements = tc.edit(slices.Clone(f.Placements))
			src.Family = &f
			l, err := mesh.ParseLayout(tc.layout)
			if err != nil {
				t.Fatal(err)
			}
			p, err := New(src, cpuDevices(tc.n), l, Options{})
			if err == nil {
				p.Close()
				t.Fatal("a wrong table was accepted")
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not say %q", err, w)
				}
			}
		})
	}
}
