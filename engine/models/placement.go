package models

import (
	"fmt"
	"slices"
	"strconv"
	"strings"
)

// Split is how a parameter is laid out over a tensor-parallel group of n ranks.
type Split uint8

const (
	// Replicated: every tensor rank holds the whole parameter, and its gradient is the same on
	// each (embeddings, layer norms, routers, the LM head).
	Replicated Split = iota
	// Column: a column-parallel linear. Its output features are split: the weight [out, in]
	// and the bias [out] are cut along out (dim 0), so each rank computes out/n of the
	// outputs from the whole input; the input gradient is a partial sum over the group.
	Column
	// Row: a row-parallel linear. Its input features are split: the weight [out, in] is cut
	// along in (dim 1) and the partial products are summed over the group; the bias [out]
	// is whole (added once, after the sum).
	Row
	// PerHead: a norm applied to each head separately (q/k norm of width head_dim). Every
	// rank holds the whole weight and applies it to its own heads, so the weight's gradient
	// is a partial sum over the group.
	PerHead
)

func (s Split) String() string {
	switch s {
	case Replicated:
		return "replicated"
	case Column:
		return "column"
	case Row:
		return "row"
	case PerHead:
		return "per-head"
	}
	return fmt.Sprintf("Split(%d)", uint8(s))
}

// Local returns the shape one of n tensor ranks holds of a parameter of shape full under s, or
// an error that says why full does not split that way.
func (s Split) Local(full []int, n int) ([]int, error) {
	local := slices.Clone(full)
	switch s {
	case Replicated, PerHead:
		return local, nil
	case Column:
		if len(full) < 1 || full[0]%n != 0 {
			return nil, fmt.Errorf("a column split cuts dim 0 into %d equal parts, which %v does not allow", n, full)
		}
		local[0] /= n
	case Row:
		if len(full) != 2 || full[1]%n != 0 {
			return nil, fmt.Errorf("a row split cuts dim 1 of a matrix into %d equal parts, which %v does not allow", n, full)
		}
		local[1] /= n
	default:
		return nil, fmt.Errorf("unknown split %v", s)
	}
	return local, nil
}

// Placement is one entry of a family's tensor-parallel table: how the parameters of the
// modules whose path matches Module are laid out under tensor and expert parallelism.
type Placement struct {
	// Module is a module path in the Hugging Face naming, with "*" standing for one layer or
	// expert index: "model.layers.*.self_attn.q_proj" places q_proj's weight and bias in every
	// layer.
	Module string
	// Split is the layout over the tensor-parallel group. A Row module's bias is whole.
	Split Split
	// Expert marks a routed expert's module; the last "*" of Module is the expert index.
	// Under expert parallelism the module lives only on the rank of each expert group that
	// owns that expert. Split applies under expert-tensor parallelism (etp = tp); with etp = 1
	// the module is whole on every tensor rank.
	Expert bool
}

// ParamPlacement is the placement of one parameter, resolved from its family's table.
type ParamPlacement struct {
	// Split is the parameter's own split (Replicated for the bias of a Row module).
	Split Split
	// Expert is the routed expert the parameter belongs to, or -1.
	Expert int
	// Module is the table entry that placed it.
	Module string
}

// paramKinds are the last components of the parameter names Place resolves.
var paramKinds = map[string]bool{"weight": true, "bias": true, "e_score_correction_bias": true, "sinks": true,
	"gate_up_proj": true, "gate_up_proj_bias": true, "down_proj": true, "down_proj_bias": true,
	"dt_bias": true, "A_log": true,
	"expert_bias": true, "layer_scalar": true, "per_expert_scale": true,
	// DeepSeek-V4's hyper-connections and compressors.
	"fn": true, "base": true, "hc_fn": true, "hc_base": true, "hc_scale": true, "position_bias": true}

// classifierHead is the module of a sequence classifier's score head (Arch.NumLabels > 0).
const classifierHead = "score"

// Place resolves the placement of parameter name (an HF name ending in .weight or .bias) from
// the family's table. It is an error when no entry or more than one matches: the table must
// place every parameter exactly once. A classifier's score head needs no entry: it is whole
// on every rank.
func (f *Family) Place(name string) (ParamPlacement, error) {
	module, kind, ok := cutLast(name)
	// A router's selection bias (DeepSeek's e_score_correction_bias), gpt-oss's attention sinks
	// and its stacked experts' tensors are placed with their modules.
	// Gemma 4's router holds a scale beside its projection.
	routerScale := kind == "scale" && (strings.HasSuffix(module, ".router") || strings.HasSuffix(module, "_hc"))
	if !ok || !paramKinds[kind] && !routerScale {
		return ParamPlacement{}, fmt.Errorf("models: %s: parameter %q is not a module's weight or bias", f.ModelType, name)
	}
	var found *Placement
	var index []int
	for i := range f.Placements {
		p := &f.Placements[i]
		idx, ok := matchModule(p.Module, module)
		if !ok {
			continue
		}
		if found != nil {
			return ParamPlacement{}, fmt.Errorf("models: %s: parameter %q matches two entries of the tensor-parallel table, %q and %q; make the patterns disjoint",
				f.ModelType, name, found.Module, p.Module)
		}
		found, index = p, idx
	}
	if found == nil && module == classifierHead {
		// A sequence classifier's score head, which any family's model can have in place of
		// its LM head, is whole on every tensor rank, as the LM head is.
		return ParamPlacement{Split: Replicated, Expert: -1, Module: classifierHead}, nil
	}
	if found == nil {
		return ParamPlacement{}, fmt.Errorf("models: %s: the tensor-parallel table places no module matching parameter %q; add an entry for %q to the family's Placements",
			f.ModelType, name, starIndices(module))
	}
	pp := ParamPlacement{Split: found.Split, Expert: -1, Module: found.Module}
	if found.Split == Row && kind != "weight" {
		pp.Split = Replicated
	}
	if found.Expert {
		pp.Expert = index[len(index)-1]
	}
	return pp, nil
}

// checkPlacements panics on a table that is malformed regardless of the model: empty, an empty
// path component, a duplicate pattern, an expert entry without an index, a parameter name
// where a module path belongs, a per-head split of an expert.
func checkPlacements(modelType string, ps []Placement) {
	if len(ps) == 0 {
		panic("models: Register " + modelType + ": the family declares no tensor-parallel Placements")
	}
	seen := map[string]bool{}
	for _, p := range ps {
		bad := func(why string) {
			panic(fmt.Sprintf("models: Register %s: placement %q: %s", modelType, p.Module, why))
		}
		if seen[p.Module] {
			bad("duplicate entry")
		}
		seen[p.Module] = true
		parts := strings.Split(p.Module, ".")
		if slices.Contains(parts, "") {
			bad("empty path component")
		}
		if last := parts[len(parts)-1]; last == "weight" || last == "bias" {
			bad("give the module path, without .weight or .bias")
		}
		if p.Split > PerHead {
			bad("unknown split")
		}
		if p.Expert && !slices.Contains(parts, "*") {
			bad("an expert entry needs a * for the expert index")
		}
		if p.Expert && p.Split == PerHead {
			bad("experts hold linears, which split by column or row")
		}
	}
}

// matchModule reports whether module matches pattern ("*" matches one decimal index) and
// returns the indices the stars matched.
func matchModule(pattern, module string) ([]int, bool) {
	pp, mp := strings.Split(pattern, "."), strings.Split(module, ".")
	if len(pp) != len(mp) {
		return nil, false
	}
	var idx []int
	for i, p := range pp {
		if p != "*" {
			if p != mp[i] {
				return nil, false
			}
			continue
		}
		n, err := strconv.Atoi(mp[i])
		if err != nil || n < 0 || strconv.Itoa(n) != mp[i] {
			return nil, false
		}
		idx = append(idx, n)
	}
	return idx, true
}

// cutLast splits "a.b.c" into "a.b" and "c".
func cutLast(name string) (head, tail string, ok bool) {
	i := strings.LastIndexByte(name, '.')
	if i <= 0 || i == len(name)-1 {
		return "", "", false
	}
	return name[:i], name[i+1:], true
}

// starIndices writes module with every index replaced by "*", as table entries spell it.
func starIndices(module string) string {
	parts := strings.Split(module, ".")
	for i, p := range parts {
		if _, err := strconv.Atoi(p); err == nil {
			parts[i] = "*"
		}
	}
	return strings.Join(parts, ".")
}

// decoderPlacements is a family's table from the entries every decoder here shares — the
// embeddings, both layer norms, the final norm and the LM head whole; q, k and v split by
// heads (Column) and o_proj by input features (Row), as Megatron splits attention — followed by
// the family's own entries (its q/k norms and its feed-forward block).
func decoderPlacements(own ...[]Placement) []Placement {
	ps := []Placement{
		{Module: "model.embed_tokens", Split: Replicated},
		{Module: "model.layers.*.input_layernorm", Split: Replicated},
		{Module: "model.layers.*.self_attn.q_proj", Split: Column},
		{Module: "model.layers.*.self_attn.k_proj", Split: Column},
		{Module: "model.layers.*.self_attn.v_proj", Split: Column},
		{Module: "model.layers.*.self_attn.o_proj", Split: Row},
		{Module: "model.layers.*.post_attention_layernorm", Split: Replicated},
		{Module: "model.norm", Split: Replicated},
		{Module: "lm_head", Split: Replicated},
	}
	for _, o := range own {
		ps = append(ps, o...)
	}
	return ps
}

// qkNormPlacements places the query and key norms (q_norm, k_norm) with split.
func qkNormPlacements(split Split) []Placement {
	return []Placement{
		{Module: "model.layers.*.self_attn.q_norm", Split: split},
		{Module: "model.layers.*.self_attn.k_norm", Split: split},
	}
}

// denseMLPPlacements places a SwiGLU block's projections under model.layers.*.block with
// split (Megatron's: gate and up by output features, down by input features, for Column).
func denseMLPPlacements(block, gate, up, down string, split Split) []Placement {
	gu, d := split, split
	if split == Column {
		d = Row
	}
	pre := "model.layers.*." + block + "."
	return []Placement{
		{Module: pre + gate, Split: gu},
		{Module: pre + up, Split: gu},
		{Module: pre + down, Split: d},
	}
}

// expertPlacements places an MoE block: the router whole and each expert's gate and up split
// by output features, its down projection by input features; the last "*" is the expert index
// that expert parallelism spreads.
func expertPlacements(block, router, gate, up, down string) []Placement {
	pre := "model.layers.*." + block + "."
	return []Placement{
		{Module: pre + router, Split: Replicated},
		{Module: pre + "experts.*." + gate, Split: Column, Expert: true},
		{Module: pre + "experts.*." + up, Split: Column, Expert: true},
		{Module: pre + "experts.*." + down, Split: Row, Expert: true},
	}
}
