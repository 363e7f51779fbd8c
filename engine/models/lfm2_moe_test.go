package models

import (
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"testing"

	"github.com/halo-shell/halo-shell/engine/hf/safetensors"
)

// lfm2Expert matches LFM2-MoE's per-expert Hub tensors.
var lfm2Expert = regexp.MustCompile(`^model\.layers\.(\d+)\.feed_forward\.experts\.(\d+)\.(w1|w3|w2)\.weight$`)

// TestLFM2LoadsFusedExperts: a checkpoint holding LFM2-MoE's experts as transformers 5 holds
// them in memory (feed_forward.experts.gate_up_proj [E, 2I, C], each expert's w1 rows then its
// w3 rows, and down_proj [E, C, I]) loads into the same weights as the Hub layout.
func TestLFM2LoadsFusedExperts(t *testing.T) {
	ref := tinyMoE(t, "lfm2_moe", nil)
	dir := t.TempDir()
	if err := ref.Save(dir, SaveOptions{}); err != nil {
		t.Fatal(err)
	}
	src, err := safetensors.Open(filepath.Join(dir, "model.safetensors"))
	if err != nil {
		t.Fatal(err)
	}
	defer src.Close()
	type part struct{ gu, down [][]byte }
	layers := map[string]*part{}
	var out []safetensors.Tensor
	shape := map[string][]int{}
	for _, n := range src.Names() {
		info, _ := src.Tensor(n)
		sm := lfm2Expert.FindStringSubmatch(n)
		if sm == nil {
			out = append(out, safetensors.Tensor{Name: n, DType: info.DType, Shape: info.Shape, Data: info.Data})
			continue
		}
		p := layers[sm[1]]
		if p == nil {
			p = &part{}
			layers[sm[1]] = p
		}
		x, _ := strconv.Atoi(sm[2])
		for len(p.gu) < 2*(x+1) {
			p.gu = append(p.gu, nil)
		}
		for len(p.down) < x+1 {
			p.down = append(p.down, nil)
		}
		switch sm[3] {
		case "w1":
			p.gu[2*x] = info.Data
		case "w3":
			p.gu[2*x+1] = info.Data
		case "w2":
			p.down[x] = info.Data
		}
		shape[sm[1]+sm[3]] = info.Shape
	}
	if len(layers) == 0 {
		t.Fatal("the saved checkpoint holds no per-expert tensors")
	}
	for l, p := range layers {
		gu, dn := slices.Concat(p.gu...), slices.Concat(p.down...)
		g, d := shape[l+"w1"], shape[l+"w2"]
		pre := fmt.Sprintf("model.layers.%s.feed_forward.experts.", l)
		out = append(out,
			safetensors.Tensor{Name: pre + "gate_up_proj", DType: safetensors.F32, Shape: []int{len(p.down), 2 * g[0], g[1]}, Data: gu},
			safetensors.Tensor{Name: pre + "down_proj", DType: safetensors.F32, Shape: []int{len(p.down), d[0], d[1]}, Data: dn})
	}
	fdir := t.TempDir()
	if err := safetensors.Save(filepath.Join(fdir, "model.safetensors"), out, nil); err != nil {
		t.Fatal(err)
	}
	cfg, err := os.ReadFile(filepath.Join(dir, "config.json"))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(fdir, "config.json"), cfg, 0o644); err != nil {
		t.Fatal(err)
	}
	m, err := Load(fdir, newCPU(), Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	if len(m.Unused) != 0 {
		t.Errorf("unused tensors %v", m.Unused)
	}
	for _, s := range ref.Specs {
		a, _ := ref.ParamFloat32(s.Name)
		c, _ := m.ParamFloat32(s.Name)
		if !slices.Equal(a, c) {
			t.Errorf("%s differs between the fused and the Hub layout", s.Name)
		}
	}
}
