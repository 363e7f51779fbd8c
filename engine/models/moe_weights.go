package models

import (
	"fmt"
	"regexp"
	"slices"
	"strconv"

	"github.com/halo-shell/halo-shell/engine/hf/safetensors"
)

// fusedExpertName matches transformers 5's in-memory (fused) expert tensors.
var fusedExpertName = regexp.MustCompile(`^model\.layers\.(\d+)\.mlp\.experts\.(gate_up_proj|down_proj)$`)

// fusedRouterName matches the router under transformers 5's in-memory name (mlp.gate.weight),
// which Mixtral's Hub layout calls block_sparse_moe.gate.weight.
var fusedRouterName = regexp.MustCompile(`^model\.layers\.(\d+)\.mlp\.gate\.weight$`)

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
		if sm := fusedRouterName.FindStringSubmatch(name); sm != nil && f.block != "mlp" {
			info, _ := src.Tensor(name)
			add(fmt.Sprintf("model.layers.%s.%s.gate.weight", sm[1], f.block), info, info.Shape, 0, int(info.NumElements()))
			replaced[name] = true
			continue
		}
		sm := fusedExpertName.FindStringSubmatch(name)
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
