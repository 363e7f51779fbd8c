package models

import (
	"fmt"
	"regexp"
	"slices"
	"strconv"
	"strings"

	"github.com/halo-shell/halo-shell/engine/hf/safetensors"
	"github.com/halo-shell/halo-shell/engine/tensor"
)

// fusedExpertName matches transformers 5's in-memory (fused) expert tensors.
var fusedExpertName = regexp.MustCompile(`^model\.layers\.(\d+)\.mlp\.experts\.(gate_up_proj|down_proj)$`)

// fusedRouterName matches the router under transformers 5's in-memory name (mlp.gate.weight),
// which Mixtral's Hub layout calls block_sparse_moe.gate.weight, and MiniMax-M2's correction
// bias (mlp.e_score_correction_bias, block_sparse_moe.e_score_correction_bias on the Hub).
var fusedRouterName = regexp.MustCompile(`^model\.layers\.(\d+)\.mlp\.(gate\.weight|e_score_correction_bias)$`)

// fusedExperts presents a checkpoint whose experts are stored the way transformers 5 holds them
// in memory — model.layers.L.mlp.experts.gate_up_proj [E, 2I, C] (each expert's gate rows, then
// its up rows) and model.layers.L.mlp.experts.down_proj [E, C, I] — under the Hub names of
// family f, one tensor per expert, as views of the fused bytes (no copy). Tensors the source
// has under their Hub names take precedence.
type fusedExperts struct {
	safetensors.Source
	extra map[string]safetensors.TensorInfo
	names []string
}

// withFusedExperts wraps src when it holds fused experts; otherwise it returns src. A fused
// tensor whose shape cannot be split is left alone: loading then fails naming the missing
// per-expert tensor, and the fused one is reported unused.
func withFusedExperts(src safetensors.Source, f *moeFFN) safetensors.Source {
	fe := &fusedExperts{Source: src, extra: map[string]safetensors.TensorInfo{}}
	replaced := map[string]bool{}
	add := func(name string, info safetensors.TensorInfo, shape []int, off, n int) {
		if _, ok := src.Tensor(name); ok {
			return
		}
		es := info.DType.Size()
		fe.extra[name] = safetensors.TensorInfo{Name: name, DType: info.DType, Shape: shape,
			Data: info.Data[off*es : (off+n)*es], File: info.File}
	}
	for _, name := range src.Names() {
		if to, ok := f.checkpointName(name); ok {
			info, _ := src.Tensor(name)
			add(to, info, info.Shape, 0, int(info.NumElements()))
			replaced[name] = true
			continue
		}
		if sm := fusedRouterName.FindStringSubmatch(name); sm != nil && f.block != "mlp" {
			info, _ := src.Tensor(name)
			add(fmt.Sprintf("model.layers.%s.%s.%s", sm[1], f.block, sm[2]), info, info.Shape, 0, int(info.NumElements()))
			replaced[name] = true
			continue
		}
		sm := fusedExpertName.FindStringSubmatch(name)
		if sm == nil {
			sm = f.ownFused(name)
		}
		if sm == nil {
			continue
		}
		info, _ := src.Tensor(name)
		if len(info.Shape) != 3 || info.DType.Size() == 0 || int64(len(info.Data)) != info.NumElements()*int64(info.DType.Size()) {
			continue
		}
		e, rows, cols := info.Shape[0], info.Shape[1], info.Shape[2]
		layer, _ := strconv.Atoi(sm[1])
		pre := fmt.Sprintf("%s.experts.", layerName(layer, f.block))
		switch sm[2] {
		case "gate_up_proj":
			if rows%2 != 0 {
				continue
			}
			in := rows / 2
			for x := 0; x < e; x++ {
				base := x * rows * cols
				add(fmt.Sprintf("%s%d.%s.weight", pre, x, f.gate), info, []int{in, cols}, base, in*cols)
				add(fmt.Sprintf("%s%d.%s.weight", pre, x, f.up), info, []int{in, cols}, base+in*cols, in*cols)
			}
		case "down_proj":
			for x := 0; x < e; x++ {
				add(fmt.Sprintf("%s%d.%s.weight", pre, x, f.down), info, []int{rows, cols}, x*rows*cols, rows*cols)
			}
		}
		replaced[name] = true
	}
	if len(fe.extra) == 0 {
		return src
	}
	for _, n := range src.Names() {
		if !replaced[n] {
			fe.names = append(fe.names, n)
		}
	}
	for n := range fe.extra {
		fe.names = append(fe.names, n)
	}
	slices.Sort(fe.names)
	return fe
}

// Names implements safetensors.Source.
func (fe *fusedExperts) Names() []string { return slices.Clone(fe.names) }

// Tensor implements safetensors.Source.
func (fe *fusedExperts) Tensor(name string) (safetensors.TensorInfo, bool) {
	if info, ok := fe.Source.Tensor(name); ok {
		return info, true
	}
	info, ok := fe.extra[name]
	if ok {
		info.Shape = slices.Clone(info.Shape)
	}
	return info, ok
}

// checkpointName returns the checkpoint name of a tensor that name holds under one of the
// family's in-memory names (moeFFN.inMemory), and whether it is one.
func (f *moeFFN) checkpointName(name string) (string, bool) {
	rest, ok := strings.CutPrefix(name, "model.layers.")
	if !ok {
		return "", false
	}
	num, tail, ok := strings.Cut(rest, ".")
	if !ok {
		return "", false
	}
	if _, err := strconv.Atoi(num); err != nil {
		return "", false
	}
	t, ok := strings.CutPrefix(tail, f.block+".")
	mem := false
	if !ok && f.memBlock != "" {
		t, ok = strings.CutPrefix(tail, f.memBlock+".")
		mem = ok
	}
	if !ok {
		return "", false
	}
	for _, r := range f.inMemory {
		if rest, ok := strings.CutPrefix(t, r.from); ok {
			return "model.layers." + num + "." + f.block + "." + r.to + rest, true
		}
	}
	if mem && !fusedExpertName.MatchString(name) {
		// The fused experts are split below, into the checkpoint names.
		return "model.layers." + num + "." + f.block + "." + t, true
	}
	return "", false
}

// ownFused matches name against the family's own fused expert tensors (moeFFN.fused) and
// returns it as fusedExpertName's submatches would (name, layer, "gate_up_proj" or
// "down_proj"), or nil.
func (f *moeFFN) ownFused(name string) []string {
	if f.fused == (fusedNames{}) {
		return nil
	}
	rest, ok := strings.CutPrefix(name, "model.layers.")
	if !ok {
		return nil
	}
	num, tail, ok := strings.Cut(rest, ".")
	if !ok {
		return nil
	}
	if _, err := strconv.Atoi(num); err != nil {
		return nil
	}
	switch tail {
	case f.block + "." + f.fused.GateUp:
		return []string{name, num, "gate_up_proj"}
	case f.block + "." + f.fused.Down:
		return []string{name, num, "down_proj"}
	}
	return nil
}

// fuseExperts replaces, in a checkpoint's tensors (WeightTensors' list, in spec order), each
// layer's per-expert tensors by the family's fused ones (moeFFN.fused): GateUp [E,2I,C] over
// every expert's gate and up, Down [E,C,I] over every down, as views of the arena (the parameter
// table lays them out so). A model holding a subset of the experts is left alone: its fused
// tensors would span experts it does not hold: its tensors stay per expert, under the names of
// the parameter table (its part of a checkpoint, which Save refuses to write alone).
func (m *Model) fuseExperts(ts []safetensors.Tensor, dt tensor.DType) ([]safetensors.Tensor, error) {
	f := expertHooks(m.Family)
	if f == nil || f.fused == (fusedNames{}) || f.fused.ReadOnly || len(m.moe.layers) == 0 || m.Arch.HeldExperts.Len() != m.Arch.NumExperts() {
		return ts, nil
	}
	fusedAt := map[string]safetensors.Tensor{} // first per-expert name of a run -> fused tensor
	drop := map[string]bool{}
	for j, blk := range m.moe.layers {
		pre := layerName(m.moe.index[j], f.block) + "."
		gu, dn := blk.GateUp, blk.Down
		if gu.W.IsNil() || dn.W.IsNil() {
			return nil, fmt.Errorf("models: %s layer %d: the experts are not laid out as one tensor; cannot write %s", m.Family.ModelType, m.moe.index[j], f.fused.GateUp)
		}
		specs := []ParamSpec{{Name: pre + f.fused.GateUp, Shape: gu.W.Shape()}, {Name: pre + f.fused.Down, Shape: dn.W.Shape()}}
		fused, err := arenaTensors(m, specs, &Arena{Views: []tensor.Tensor{gu.W, dn.W}}, dt)
		if err != nil {
			return nil, err
		}
		for x := range blk.Experts {
			ep := fmt.Sprintf("%sexperts.%d.", pre, blk.FirstExpert+x)
			for _, p := range []string{f.gate, f.up, f.down} {
				drop[ep+p+".weight"] = true
			}
		}
		fusedAt[fmt.Sprintf("%sexperts.%d.%s.weight", pre, blk.FirstExpert, f.gate)] = fused[0]
		fusedAt[fmt.Sprintf("%sexperts.%d.%s.weight", pre, blk.FirstExpert, f.down)] = fused[1]
	}
	out := make([]safetensors.Tensor, 0, len(ts))
	for _, t := range ts {
		if ft, ok := fusedAt[t.Name]; ok {
			out = append(out, ft)
			continue
		}
		if !drop[t.Name] {
			out = append(out, t)
		}
	}
	return out, nil
}
