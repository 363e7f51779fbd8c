package models

import (
	"strings"
	"testing"

	"github.com/halo-shell/halo-shell/engine/quant"
	"github.com/halo-shell/halo-shell/engine/tensor"
)

// TestQuantizeBase: a model whose linears are quantised to NF4 computes exactly the loss and
// adapter gradients of the same model holding the dequantised (bf16-rounded) weights in full
// precision; the arena loses the quantised weights; the LM head, embeddings and norms stay.
func TestQuantizeBase(t *testing.T) {
	for _, nested := range []bool{false, true} {
		a := tinyArch("qwen3", nil)
		q := newTiny(t, newCPU(), a, Options{}, 3)
		ref := newTiny(t, newCPU(), a, Options{}, 3)
		total := q.NumParams()
		var quantised int
		for _, l := range ref.linearLayers() {
			name := l.Name + ".weight"
			v, err := ref.ParamFloat32(name)
			if err != nil {
				t.Fatal(err)
			}
			w, err := quant.QuantizeNF4(v, l.W.Shape(), quant.Options{DoubleQuant: nested})
			if err != nil {
				t.Fatal(err)
			}
			bits := make([]uint16, len(v))
			if err := w.DequantizeBF16(bits); err != nil {
				t.Fatal(err)
			}
			for i, b := range bits {
				v[i] = tensor.BF16ToF32(b)
			}
			if err := ref.SetParam(name, v); err != nil {
				t.Fatal(err)
			}
			quantised += len(v)
		}
		if err := q.QuantizeBase(quant.Config{LoadIn4bit: true, DoubleQuant: nested}); err != nil {
			t.Fatal(err)
		}
		names := q.QuantizedNames()
		if len(names) != 7*a.Layers {
			t.Fatalf("quantised %d weights, want the 7 linears of %d layers: %v", len(names), a.Layers, names)
		}
		for _, n := range names {
			if strings.Contains(n, "lm_head") || strings.Contains(n, "embed") || strings.Contains(n, "norm") {
				t.Errorf("%s was quantised", n)
			}
		}
		kept := 0
		for _, s := range q.Specs {
			kept += s.Numel()
		}
		if _, arena := ArenaLayout(q.Specs); kept != total-quantised || q.Params.Flat.Numel() != arena {
			t.Errorf("the arena holds %d elements for specs of %d, want %d without the quantised weights (%d with the alignment padding)", q.Params.Flat.Numel(), kept, total-quantised, arena)
		}
		qp, qb, largest, err := QuantizedParamCount(a.Shape, quant.Config{LoadIn4bit: true, DoubleQuant: nested})
		if err != nil || qp != int64(quantised) || largest != int64(a.Intermediate*a.Hidden) {
			t.Errorf("QuantizedParamCount = %d, %d, %d, %v; want %d quantised, largest %d", qp, qb, largest, err, quantised, a.Intermediate*a.Hidden)
		}
		if _, wb, _ := q.Quantized(); wb != qb {
			t.Errorf("the NF4 weights take %d bytes, QuantizedParamCount says %d", wb, qb)
		}
		if q.NumParams() != total {
			t.Errorf("NumParams = %d, want %d", q.NumParams(), total)
		}
		for _, m := range []*Model{q, ref} {
			if err := m.AttachLoRA(LoRAConfig{R: 2, Alpha: 4, Targets: []string{AllLinear}, Seed: 4}); err != nil {
				t.Fatal(err)
			}
			randomizeB(t, m, 5)
		}
		b := packedBatch(a.Vocab, []int{5, 3}, 9)
		l1, _, err := q.ForwardBackward(b, 1)
		if err != nil {
			t.Fatal(err)
		}
		l2, _, err := ref.ForwardBackward(b, 1)
		if err != nil {
			t.Fatal(err)
		}
		if l1 != l2 {
			t.Fatalf("nested=%v: loss %v with the NF4 base, %v with its dequantised weights", nested, l1, l2)
		}
		for _, s := range q.LoRA().Specs {
			g1, _ := q.AdapterGradFloat32(s.Name)
			g2, _ := ref.AdapterGradFloat32(s.Name)
			for i := range g1 {
				if g1[i] != g2[i] {
					t.Fatalf("%s[%d]: gradient %v with the NF4 base, %v with its dequantised weights", s.Name, i, g1[i], g2[i])
				}
			}
		}
		if ok, wb, sb := q.Quantized(); !ok || wb <= 0 || sb != int64(a.Intermediate*a.Hidden*(2+4)) {
			t.Errorf("Quantized() = %v, %d, %d; want the scratch to hold the largest weight in bf16 and f32", ok, wb, sb)
		}
		if err := q.Save(t.TempDir(), SaveOptions{}); err == nil || !strings.Contains(err.Error(), "quantised") {
			t.Errorf("Save of a quantised model: %v", err)
		}
		if err := q.QuantizeBase(quant.Config{LoadIn4bit: true}); err == nil {
			t.Error("quantising twice was accepted")
		}
	}
	m := newTiny(t, newCPU(), tinyArch("qwen3", nil), Options{}, 3)
	if err := m.QuantizeBase(quant.Config{LoadIn4bit: true, QuantType: "fp4"}); err == nil || !strings.Contains(err.Error(), "fp4") {
		t.Errorf("fp4: %v", err)
	}
}
