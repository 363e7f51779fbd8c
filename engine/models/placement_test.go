package models

import (
	"fmt"
	"maps"
	"slices"
	"strings"
	"testing"

	"github.com/halo-shell/halo-shell/engine/hf/config"
)

// structuralVariants are the config.json settings that add or remove weights; each family's
// tiny model is built with every one its config family has, so that every module the family
// can have is present in some variant.
var structuralVariants = []struct {
	key   string
	value any
	more  map[string]any // further keys the variant needs
	// only, when set, is the one family the variant applies to; not is a family whose
	// config refuses the value (the variant describes another family's structure).
	only, not string
}{
	{"attention_bias", true, nil, "", ""},
	{"mlp_bias", true, nil, "", ""},
	{"tie_word_embeddings", true, nil, "", ""},
	{"tie_word_embeddings", false, nil, "", ""},                              // families tied by default (smollm3)
	{"mlp_only_layers", []int{0}, nil, "", ""},                               // a dense layer in a mixture of experts
	{"q_lora_rank", nil, nil, "", "deepseek_v4"},                             // latent attention with a plain q_proj
	{"moe_layer_start_index", 1, nil, "", ""},                                // a dense first layer (ernie4_5_moe)
	{"mlp_layer_types", []string{"dense", "sparse"}, nil, "", "deepseek_v4"}, // a dense layer (laguna)
	// deepseek_v4's learned routing (with a correction bias) in the first layer.
	{"mlp_layer_types", []string{"moe", "hash_moe", "moe"}, nil, "deepseek_v4", ""},
	// gemma4_text's per-layer inputs, MoE block and shared KV layers with double-wide MLPs.
	{"hidden_size_per_layer_input", 8, nil, "", ""},
	{"enable_moe_block", true, map[string]any{"num_experts": 4, "top_k_experts": 2, "moe_intermediate_size": 8}, "", ""},
	{"num_kv_shared_layers", 2, map[string]any{"num_hidden_layers": 4, "use_double_wide_mlp": true,
		"layer_types": []string{"sliding_attention", "full_attention", "sliding_attention", "full_attention"}}, "", ""},
}

// variant is one structural variant of a family's tiny model.
type variant struct {
	cfg   *config.Config
	specs []ParamSpec
}

// tinyVariants returns fam's tiny model and each structural variant of it, by name.
func tinyVariants(t *testing.T, fam string) map[string]variant {
	t.Helper()
	base, err := config.Preset(fam, "tiny")
	if err != nil {
		t.Fatal(err)
	}
	cf, err := config.Lookup(fam)
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]variant{}
	add := func(name string, c *config.Config) {
		m, err := New(c, newCPU(), Options{})
		if err != nil {
			t.Fatalf("%s %s: %v", fam, name, err)
		}
		defer m.Close()
		out[name] = variant{c, m.Specs}
	}
	add("tiny", base)
	for _, v := range structuralVariants {
		if !slices.Contains(cf.Keys, v.key) || v.only != "" && v.only != fam || v.not == fam {
			continue
		}
		set := map[string]any{v.key: v.value}
		for k, x := range v.more {
			set[k] = x
		}
		c, err := base.Override(set, "variant")
		if err != nil {
			t.Fatal(err)
		}
		add(fmt.Sprintf("%s=%v", v.key, v.value), c)
	}
	return out
}

// TestSpecTableCountsAsShape checks that the parameter table a model is built with holds the
// parameters its config.Shape counts, for every family and structural variant.
func TestSpecTableCountsAsShape(t *testing.T) {
	for _, fam := range Families() {
		for name, v := range tinyVariants(t, fam) {
			n := int64(0)
			for _, s := range v.specs {
				// Routers' correction biases are checkpoint buffers, not parameters, to
				// transformers' count (except ernie4_5_moe's correction bias, a parameter).
				if !isBuffer(s.Name) || v.cfg.Shape().RouterBiasParam {
					n += int64(s.Numel())
				}
			}
			if want := v.cfg.Shape().NumParameters(); n != want {
				t.Errorf("%s %s: the parameter table holds %d parameters, the shape counts %d", fam, name, n, want)
			}
		}
	}
}

// checkCoverage checks a table against parameter tables: every parameter is placed by exactly
// one entry, every entry places some parameter, and the entries marked Expert place exactly
// the routed experts' parameters (expertOf, the family's weight layout), with their index.
func checkCoverage(f *Family, variants map[string]variant, expertOf func(string) (int, bool)) error {
	used := map[string]bool{}
	var errs []string
	for _, v := range slices.Sorted(maps.Keys(variants)) {
		for _, s := range variants[v].specs {
			pp, err := f.Place(s.Name)
			if err != nil {
				errs = append(errs, fmt.Sprintf("%s: %v", v, err))
				continue
			}
			used[pp.Module] = true
			x, isExpert := expertOf(s.Name)
			if isExpert != (pp.Expert >= 0) || (isExpert && x != pp.Expert) {
				errs = append(errs, fmt.Sprintf("%s: %s is placed as expert %d by %q; the family's layout says expert %v (%d)", v, s.Name, pp.Expert, pp.Module, isExpert, x))
			}
		}
	}
	for _, p := range f.Placements {
		if !used[p.Module] {
			errs = append(errs, fmt.Sprintf("entry %q places no parameter of any variant", p.Module))
		}
	}
	if len(errs) > 0 {
		return fmt.Errorf("%s", strings.Join(errs, "\n"))
	}
	return nil
}

// TestPlacementsCoverEveryWeight checks every registered family's tensor-parallel table
// against the weights of its tiny models: none unplaced, none placed twice, no entry that
// matches nothing, and expert entries exactly on the routed experts.
func TestPlacementsCoverEveryWeight(t *testing.T) {
	for _, fam := range Families() {
		t.Run(fam, func(t *testing.T) {
			f, err := Lookup(fam)
			if err != nil {
				t.Fatal(err)
			}
			variants := tinyVariants(t, fam)
			// A sequence classifier (reward model) has a score head in place of the LM head.
			cm, err := New(variants["tiny"].cfg, newCPU(), Options{NumLabels: 1})
			if err != nil {
				t.Fatalf("%s classifier: %v", fam, err)
			}
			variants["classifier"] = variant{variants["tiny"].cfg, cm.Specs}
			cm.Close()
			m := &Model{Family: f}
			if err := checkCoverage(f, variants, m.ExpertOf); err != nil {
				t.Error(err)
			}
		})
	}
}

// TestPlacementCoverageFindsBadTables checks that the coverage check refuses a table with a
// missing entry, an entry that matches nothing, overlapping entries, and expert entries that
// are not on the experts.
func TestPlacementCoverageFindsBadTables(t *testing.T) {
	f, err := Lookup("qwen3_moe")
	if err != nil {
		t.Fatal(err)
	}
	variants := tinyVariants(t, "qwen3_moe")
	m := &Model{Family: f}
	edit := func(fn func([]Placement) []Placement) *Family {
		g := *f
		g.Placements = fn(slices.Clone(f.Placements))
		return &g
	}
	index := func(ps []Placement, module string) int {
		i := slices.IndexFunc(ps, func(p Placement) bool { return p.Module == module })
		if i < 0 {
			t.Fatalf("no entry %q", module)
		}
		return i
	}
	for _, tc := range []struct {
		name string
		f    *Family
		want string
	}{
		{"missing entry", edit(func(ps []Placement) []Placement {
			return slices.Delete(ps, index(ps, "model.layers.*.self_attn.o_proj"), index(ps, "model.layers.*.self_attn.o_proj")+1)
		}), `places no module matching parameter "model.layers.0.self_attn.o_proj.weight"`},
		{"entry matching nothing", edit(func(ps []Placement) []Placement {
			return append(ps, Placement{Module: "model.layers.*.self_attn.qkv_proj", Split: Column})
		}), `entry "model.layers.*.self_attn.qkv_proj" places no parameter`},
		{"overlap", edit(func(ps []Placement) []Placement {
			return append(ps, Placement{Module: "model.layers.0.self_attn.q_proj", Split: Replicated})
		}), "matches two entries"},
		{"expert not marked", edit(func(ps []Placement) []Placement {
			ps[index(ps, "model.layers.*.mlp.experts.*.up_proj")].Expert = false
			return ps
		}), "model.layers.0.mlp.experts.0.up_proj.weight is placed as expert -1"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := checkCoverage(tc.f, variants, m.ExpertOf)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("error %v, want one containing %q", err, tc.want)
			}
		})
	}
}

func TestPlace(t *testing.T) {
	f, err := Lookup("qwen3_moe")
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name   string
		split  Split
		expert int
	}{
		{"model.embed_tokens.weight", Replicated, -1},
		{"model.layers.3.self_attn.q_proj.weight", Column, -1},
		{"model.layers.3.self_attn.q_proj.bias", Column, -1},
		{"model.layers.3.self_attn.o_proj.weight", Row, -1},
		{"model.layers.3.self_attn.o_proj.bias", Replicated, -1}, // added once after the row sum
		{"model.layers.3.self_attn.k_norm.weight", PerHead, -1},
		{"model.layers.3.mlp.gate.weight", Replicated, -1},
		{"model.layers.3.mlp.gate_proj.weight", Replicated, -1},
		{"model.layers.3.mlp.experts.17.up_proj.weight", Column, 17},
		{"model.layers.12.mlp.experts.0.down_proj.weight", Row, 0},
	} {
		pp, err := f.Place(tc.name)
		if err != nil || pp.Split != tc.split || pp.Expert != tc.expert {
			t.Errorf("%s: %+v, %v; want %v, expert %d", tc.name, pp, err, tc.split, tc.expert)
		}
	}
	for _, bad := range []string{
		"model.layers.x.self_attn.q_proj.weight", // not an index
		"model.layers.01.self_attn.q_proj.weight",
		"model.layers.0.self_attn.q_proj.scale",
		"model.layers.0.self_attn.q_proj",
		"weight",
	} {
		if _, err := f.Place(bad); err == nil {
			t.Errorf("%s: placed", bad)
		}
	}
}

func TestSplitLocal(t *testing.T) {
	for _, tc := range []struct {
		split Split
		full  []int
		n     int
		want  []int
		err   string
	}{
		{Column, []int{64, 32}, 2, []int{32, 32}, ""},
		{Column, []int{64}, 4, []int{16}, ""},
		{Row, []int{32, 64}, 4, []int{32, 16}, ""},
		{Replicated, []int{7, 3}, 2, []int{7, 3}, ""},
		{PerHead, []int{16}, 2, []int{16}, ""},
		{Column, []int{6, 4}, 4, nil, "dim 0 into 4 equal parts"},
		{Row, []int{8}, 2, nil, "dim 1 of a matrix"},
		{Row, []int{8, 6}, 4, nil, "dim 1 of a matrix into 4"},
	} {
		got, err := tc.split.Local(tc.full, tc.n)
		if tc.err != "" {
			if err == nil || !strings.Contains(err.Error(), tc.err) {
				t.Errorf("%v %v / %d: %v, want error %q", tc.split, tc.full, tc.n, err, tc.err)
			}
			continue
		}
		if err != nil || !slices.Equal(got, tc.want) {
			t.Errorf("%v %v / %d: %v, %v; want %v", tc.split, tc.full, tc.n, got, err, tc.want)
		}
	}
}

// TestRegisterRefusesMalformedTables checks the table checks that need no model.
func TestRegisterRefusesMalformedTables(t *testing.T) {
	for _, tc := range []struct {
		name string
		ps   []Placement
		want string
	}{
		{"empty", nil, "no tensor-parallel Placements"},
		{"duplicate", []Placement{{Module: "lm_head"}, {Module: "lm_head"}}, "duplicate"},
		{"parameter name", []Placement{{Module: "lm_head.weight"}}, "without .weight"},
		{"empty component", []Placement{{Module: "model..norm"}}, "empty path component"},
		{"expert without index", []Placement{{Module: "model.experts", Expert: true, Split: Column}}, "expert index"},
		{"per-head expert", []Placement{{Module: "model.experts.*.w1", Expert: true, Split: PerHead}}, "column or row"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			defer func() {
				v := recover()
				if v == nil || !strings.Contains(fmt.Sprint(v), tc.want) {
					t.Errorf("panic %v, want one containing %q", v, tc.want)
				}
			}()
			checkPlacements("test", tc.ps)
		})
	}
}

// isBuffer reports whether a parameter-table entry is a checkpoint buffer transformers does not
// count as a parameter: a router's selection bias (DeepSeek's e_score_correction_bias,
// LFM2-MoE's expert_bias) or Gemma 4's layer_scalar.
func isBuffer(name string) bool {
	for _, s := range []string{".e_score_correction_bias", ".expert_bias", ".layer_scalar"} {
		if strings.HasSuffix(name, s) {
			return true
		}
	}
	return false
}
