package models

import (
	"math"
	"os"
	"path/filepath"
	"testing"

	"github.com/halo-shell/halo-shell/engine/hf/config"
	"github.com/halo-shell/halo-shell/engine/hf/safetensors"
	"github.com/halo-shell/halo-shell/engine/tensor"
)

// ossRef is gpt-oss's decoder written out in float64 from its definition (transformers'
// GptOssForCausalLM, eager attention): the oracle of TestGptOssMatchesReference.
type ossRef struct {
	m     *Model
	p     func(name string) []float64
	alpha float64
	limit float64
}

func (g ossRef) norm(x, w []float64) []float64 {
	c := len(w)
	out := make([]float64, len(x))
	for r := 0; r < len(x)/c; r++ {
		s := 0.0
		for _, v := range x[r*c : (r+1)*c] {
			s += v * v
		}
		rs := 1 / math.Sqrt(s/float64(c)+float64(g.m.Arch.NormEps))
		for j := 0; j < c; j++ {
			out[r*c+j] = x[r*c+j] * rs * w[j]
		}
	}
	return out
}

// linb is x [T,in] @ W^T + b.
func linb(x, w, b []float64, in int) []float64 {
	y := lin(x, w, in)
	for i := range y {
		y[i] += b[i%len(b)]
	}
	return y
}

func (g ossRef) logprobs(ids []int32) []float64 {
	a := g.m.Arch
	c, hd, nh, nkv, n := a.Hidden, a.HeadDim, a.Heads, a.KVHeads, len(ids)
	emb := g.p(nameEmbed)
	x := make([]float64, n*c)
	for i, id := range ids {
		copy(x[i*c:(i+1)*c], emb[int(id)*c:(int(id)+1)*c])
	}
	inv, scale, err := a.Rope.Compute(a.Rope.MaxPositionEmbeddings)
	if err != nil {
		panic(err)
	}
	rot := func(v []float64, heads int) {
		half := len(inv)
		for t := 0; t < n; t++ {
			for h := 0; h < heads; h++ {
				row := v[(t*heads+h)*hd : (t*heads+h+1)*hd]
				for i := 0; i < half; i++ {
					ang := float64(float32(t) * inv[i])
					co, si := math.Cos(ang)*float64(scale), math.Sin(ang)*float64(scale)
					x1, x2 := row[i], row[i+half]
					row[i], row[i+half] = x1*co-x2*si, x2*co+x1*si
				}
			}
		}
	}
	for l := 0; l < a.Layers; l++ {
		pn := func(s string) []float64 { return g.p(layerName(l, s)) }
		h := g.norm(x, pn("input_layernorm.weight"))
		q := linb(h, pn("self_attn.q_proj.weight"), pn("self_attn.q_proj.bias"), c)
		k := linb(h, pn("self_attn.k_proj.weight"), pn("self_attn.k_proj.bias"), c)
		v := linb(h, pn("self_attn.v_proj.weight"), pn("self_attn.v_proj.bias"), c)
		rot(q, nh)
		rot(k, nkv)
		sinks := pn("self_attn.sinks")
		att := make([]float64, n*nh*hd)
		for t := 0; t < n; t++ {
			for hh := 0; hh < nh; hh++ {
				kh := hh / (nh / nkv)
				lo := 0
				if w := a.Windows[l]; w > 0 {
					lo = max(0, t-w+1)
				}
				var sc []float64
				m := sinks[hh]
				for j := lo; j <= t; j++ {
					s := 0.0
					for d := 0; d < hd; d++ {
						s += q[(t*nh+hh)*hd+d] * k[(j*nkv+kh)*hd+d]
					}
					s /= math.Sqrt(float64(hd))
					sc = append(sc, s)
					m = math.Max(m, s)
				}
				z := math.Exp(sinks[hh] - m)
				for _, s := range sc {
					z += math.Exp(s - m)
				}
				for i, j := 0, lo; j <= t; i, j = i+1, j+1 {
					for d := 0; d < hd; d++ {
						att[(t*nh+hh)*hd+d] += math.Exp(sc[i]-m) / z * v[(j*nkv+kh)*hd+d]
					}
				}
			}
		}
		o := linb(att, pn("self_attn.o_proj.weight"), pn("self_attn.o_proj.bias"), nh*hd)
		for i := range x {
			x[i] += o[i]
		}
		h2 := g.norm(x, pn("post_attention_layernorm.weight"))
		logits := linb(h2, pn("mlp.router.weight"), pn("mlp.router.bias"), c)
		e, iw := a.Experts, a.ExpertIntermediate
		gu, gub := pn("mlp.experts.gate_up_proj"), pn("mlp.experts.gate_up_proj_bias")
		dn, dnb := pn("mlp.experts.down_proj"), pn("mlp.experts.down_proj_bias")
		for t := 0; t < n; t++ {
			row := logits[t*e : (t+1)*e]
			// top-k by logit, ties to the lower index, then softmax over them
			sel := []int{}
			for len(sel) < a.TopK {
				best := -1
				for j := range row {
					taken := false
					for _, s := range sel {
						taken = taken || s == j
					}
					if !taken && (best < 0 || row[j] > row[best]) {
						best = j
					}
				}
				sel = append(sel, best)
			}
			m, z := row[sel[0]], 0.0
			for _, s := range sel {
				z += math.Exp(row[s] - m)
			}
			for _, ex := range sel {
				w := math.Exp(row[ex]-m) / z
				act := make([]float64, iw)
				for i := 0; i < iw; i++ {
					gate, up := gub[ex*2*iw+2*i], gub[ex*2*iw+2*i+1]
					for cc := 0; cc < c; cc++ {
						gate += h2[t*c+cc] * gu[(ex*c+cc)*2*iw+2*i]
						up += h2[t*c+cc] * gu[(ex*c+cc)*2*iw+2*i+1]
					}
					gate = math.Min(gate, g.limit)
					up = math.Max(-g.limit, math.Min(up, g.limit))
					act[i] = (up + 1) * gate / (1 + math.Exp(-g.alpha*gate))
				}
				for cc := 0; cc < c; cc++ {
					y := dnb[ex*c+cc]
					for i := 0; i < iw; i++ {
						y += act[i] * dn[(ex*iw+i)*c+cc]
					}
					x[t*c+cc] += w * y
				}
			}
		}
	}
	hf := g.norm(x, g.p(nameFinalNorm))
	logits := lin(hf, g.p(nameLMHead), c)
	v := a.Vocab
	out := make([]float64, n-1)
	for t := 0; t+1 < n; t++ {
		row := logits[t*v : (t+1)*v]
		m := math.Inf(-1)
		for _, l := range row {
			m = math.Max(m, l)
		}
		z := 0.0
		for _, l := range row {
			z += math.Exp(l - m)
		}
		out[t] = row[ids[t+1]] - m - math.Log(z)
	}
	return out
}

// tinyOSS is gpt_oss's tiny preset with weights drawn with standard deviation initRange
// (when large enough, the expert projections pass the clamp at 7.0), built on the CPU with
// non-trivial norms, biases and sinks.
func tinyOSS(t *testing.T, initRange float64) *Model {
	cfg, err := config.Preset("gpt_oss", "tiny")
	if err != nil {
		t.Fatal(err)
	}
	cfg.InitializerRange = initRange
	m, err := New(cfg, newCPU(), Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Close() })
	if err := m.InitRandom(4); err != nil {
		t.Fatal(err)
	}
	perturb(t, m, 4)
	return m
}

func float64s(t *testing.T, m *Model) func(string) []float64 {
	return func(name string) []float64 {
		v, err := m.ParamFloat32(name)
		if err != nil {
			t.Fatal(err)
		}
		out := make([]float64, len(v))
		for i, x := range v {
			out[i] = float64(x)
		}
		return out
	}
}

// TestGptOssMatchesReference: the model's logprobs equal the float64 reference decoder's on a
// document longer than the sliding window, with yarn RoPE, sinks, biases, the router bias and
// weights large enough that the clamps at 7.0 hold; without the clamps the reference differs,
// so they are exercised. swiglu_limit is set far from 7.0 and changes nothing, as in
// transformers, whose experts clamp at 7.0 whatever the config says.
func TestGptOssMatchesReference(t *testing.T) {
	m := tinyOSS(t, 0.4)
	ids := []int32{3, 17, 0, 36, 5, 5, 21, 9, 30, 200, 255, 1, 7}
	got, err := m.Logprobs(ids)
	if err != nil {
		t.Fatal(err)
	}
	ref := ossRef{m: m, p: float64s(t, m), alpha: 1.702, limit: 7}
	want := ref.logprobs(ids)
	for i := range want {
		// The large weights give logprobs of -10 and below: float32's relative error counts.
		if d := math.Abs(float64(got[i]) - want[i]); d > 2e-5+2e-6*math.Abs(want[i]) {
			t.Errorf("logprob %d: model %.7f, reference %.7f", i, got[i], want[i])
		}
	}
	ref.limit = math.Inf(1)
	diff := 0.0
	for i, v := range ref.logprobs(ids) {
		diff = math.Max(diff, math.Abs(v-want[i]))
	}
	if diff < 1e-4 {
		t.Errorf("the clamp at 7.0 moved no logprob by 1e-4 (max %g): the case does not exercise it", diff)
	}

	// The same weights under a config with swiglu_limit 0.5 give the same logprobs.
	cfg := m.Config().Clone()
	cfg.SwigluLimit = 0.5
	m2, err := New(cfg, newCPU(), Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer m2.Close()
	dir := t.TempDir()
	if err := m.Save(dir, SaveOptions{}); err != nil {
		t.Fatal(err)
	}
	f, err := safetensors.OpenCheckpoint(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := m2.LoadWeights(f); err != nil {
		t.Fatal(err)
	}
	got2, err := m2.Logprobs(ids)
	if err != nil {
		t.Fatal(err)
	}
	for i := range got {
		if got2[i] != got[i] {
			t.Errorf("logprob %d: %.7f with swiglu_limit 0.5, %.7f with 7.0", i, got2[i], got[i])
		}
	}
}

// TestDequantMXFP4: hand-made blocks and scales give the FP4 values times the groups' powers
// of two, low nibble first, transposed into [in, out].
func TestDequantMXFP4(t *testing.T) {
	// One expert, 2 output rows, one group of 32 inputs: row 0's first byte 0x21 holds codes
	// 1 (0.5) then 2 (1.0), its scale 128 (x2); row 1's first byte 0xF9 holds codes 9 (-0.5)
	// then 15 (-6), its scale 125 (x1/4).
	blocks := make([]byte, 2*16)
	blocks[0], blocks[16] = 0x21, 0xF9
	blocks[1] = 0x07 // row 0, inputs 2 and 3: codes 7 (6.0) and 0
	scales := []byte{128, 125}
	vals, shape, err := DequantMXFP4(blocks, []int{1, 2, 1, 16}, scales, []int{1, 2, 1})
	if err != nil {
		t.Fatal(err)
	}
	if len(shape) != 3 || shape[0] != 1 || shape[1] != 32 || shape[2] != 2 {
		t.Fatalf("shape %v, want [1 32 2]", shape)
	}
	at := func(in, out int) float32 { return vals[in*2+out] }
	for _, c := range []struct {
		in, out int
		want    float32
	}{{0, 0, 1}, {1, 0, 2}, {2, 0, 12}, {3, 0, 0}, {0, 1, -0.125}, {1, 1, -1.5}, {31, 1, 0}} {
		if got := at(c.in, c.out); got != c.want {
			t.Errorf("value (in %d, out %d) = %g, want %g", c.in, c.out, got, c.want)
		}
	}
	if _, _, err := DequantMXFP4(blocks, []int{1, 2, 1, 16}, scales, []int{1, 2, 2}); err == nil {
		t.Error("mismatched scales were accepted")
	}
}

// TestGptOssLoadsMXFP4: a checkpoint whose experts are stored as MXFP4 blocks and scales (the
// Hub layout) loads with the experts dequantised, and Save writes them back as plain tensors
// without the quantization_config.
func TestGptOssLoadsMXFP4(t *testing.T) {
	m := tinyOSS(t, 0.2)
	dir := t.TempDir()
	if err := m.Save(dir, SaveOptions{}); err != nil {
		t.Fatal(err)
	}
	f, err := safetensors.OpenCheckpoint(dir)
	if err != nil {
		t.Fatal(err)
	}
	var ts []safetensors.Tensor
	e := m.Arch.Experts
	want := map[string][]float32{}
	for _, n := range f.Names() {
		info, _ := f.Tensor(n)
		if mxfp4Name.MatchString(n+"_blocks") && (len(info.Shape) == 3) {
			// Code every value of the [E, in, out] tensor as FP4 code 2 (1.0) or 10 (-1.0) by
			// sign, with a scale of 1/2 on every group: the loaded value is ±0.5.
			rows, cols := info.Shape[2], info.Shape[1] // out, in
			vals, _ := safetensors.ToFloat32(info)
			blocks := make([]byte, e*rows*cols/2)
			scales := make([]byte, e*rows*cols/32)
			exp := make([]float32, len(vals))
			for x := 0; x < e; x++ {
				for o := 0; o < rows; o++ {
					for i := 0; i < cols; i++ {
						code, v := byte(2), float32(0.5)
						if vals[(x*cols+i)*rows+o] < 0 {
							code, v = 10, -0.5
						}
						exp[(x*cols+i)*rows+o] = v
						k := (x*rows+o)*cols + i
						blocks[k/2] |= code << (4 * (k % 2))
					}
					for gi := 0; gi < cols/32; gi++ {
						scales[(x*rows+o)*cols/32+gi] = 126
					}
				}
			}
			want[n] = exp
			ts = append(ts, safetensors.Tensor{Name: n + "_blocks", DType: safetensors.U8, Shape: []int{e, rows, cols / 32, 16}, Data: blocks},
				safetensors.Tensor{Name: n + "_scales", DType: safetensors.U8, Shape: []int{e, rows, cols / 32}, Data: scales})
			continue
		}
		ts = append(ts, safetensors.Tensor{Name: n, DType: info.DType, Shape: info.Shape, Data: append([]byte(nil), info.Data...)})
	}
	f.Close()
	if len(want) != 2*m.Arch.Layers {
		t.Fatalf("%d expert tensors coded, want %d", len(want), 2*m.Arch.Layers)
	}
	q := t.TempDir()
	if _, err := safetensors.SaveCheckpoint(q, ts, safetensors.CheckpointOptions{}); err != nil {
		t.Fatal(err)
	}
	raw, _ := os.ReadFile(filepath.Join(dir, "config.json"))
	qcfg := string(raw[:len(raw)-2]) + ",\n  \"quantization_config\": {\"quant_method\": \"mxfp4\"}\n}\n"
	if err := os.WriteFile(filepath.Join(q, "config.json"), []byte(qcfg), 0o644); err != nil {
		t.Fatal(err)
	}
	l, err := Load(q, newCPU(), Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	if len(l.Unused) != 0 {
		t.Errorf("unused tensors %v", l.Unused)
	}
	for n, w := range want {
		got, _ := l.ParamFloat32(n)
		for i := range w {
			if got[i] != w[i] {
				t.Fatalf("%s[%d] = %g, want %g", n, i, got[i], w[i])
			}
		}
	}
	out := t.TempDir()
	if err := l.Save(out, SaveOptions{DType: tensor.BF16}); err != nil {
		t.Fatal(err)
	}
	back, err := config.Load(out)
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := back.Extra("quantization_config"); ok {
		t.Error("the saved config.json keeps the mxfp4 quantization_config of dequantised weights")
	}
}

// TestGptOssDevicePathMatchesHostPath: the experts' device path (routing, sort and combine ops,
// grouped products over the checkpoint's [in, out] layout, biases by expert id) gives the
// host-routed path's loss and every gradient, the biases' and the router's included, on a
// packed batch; the CPU backend offers both (HALO_MOE_PATH=composed forces the host path).
func TestGptOssDevicePathMatchesHostPath(t *testing.T) {
	run := func(path string) (float64, map[string][]float32) {
		t.Setenv("HALO_MOE_PATH", path)
		m := tinyOSS(t, 0.4)
		if err := m.EnableGrads(); err != nil {
			t.Fatal(err)
		}
		b := packedBatch(m.Config().VocabSize, []int{9, 14, 5}, 3)
		sum, n, err := m.ForwardBackward(b, 1)
		if err != nil {
			t.Fatalf("%s: %v", path, err)
		}
		return sum / float64(n), allGrads(t, m)
	}
	hostLoss, hostGrads := run("composed")
	devLoss, devGrads := run("device")
	if d := math.Abs(devLoss - hostLoss); d > 1e-5*math.Abs(hostLoss) {
		t.Errorf("loss: device path %.7f, host path %.7f", devLoss, hostLoss)
	}
	for name, want := range hostGrads {
		got := devGrads[name]
		if r := relDiff(got, want); r > 1e-4 || math.IsNaN(r) {
			t.Errorf("%s: relative difference %.2g between the device and host paths' gradients", name, r)
		}
	}
	for _, name := range []string{"model.layers.0.mlp.experts.gate_up_proj_bias", "model.layers.0.mlp.experts.down_proj_bias", "model.layers.0.mlp.router.bias"} {
		if g, ok := hostGrads[name]; !ok || maxAbs(g) == 0 {
			t.Errorf("%s: no gradient on the host path, so the comparison says nothing about it", name)
		}
	}
}

func maxAbs(v []float32) float64 {
	m := 0.0
	for _, x := range v {
		m = math.Max(m, math.Abs(float64(x)))
	}
	return m
}
