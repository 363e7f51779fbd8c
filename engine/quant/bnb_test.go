package quant

import (
	"encoding/json"
	"math"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/halo-shell/halo-shell/engine/hf/safetensors"
)

// writeCheckpoint saves tensors as one safetensors file and opens it.
func writeCheckpoint(t *testing.T, tensors []safetensors.Tensor) *safetensors.File {
	t.Helper()
	path := filepath.Join(t.TempDir(), "model.safetensors")
	if err := safetensors.Save(path, tensors, map[string]string{"format": "pt"}); err != nil {
		t.Fatal(err)
	}
	f, err := safetensors.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	return f
}

// TestPrequantisedCheckpointRoundTrip: weights written in bitsandbytes' layout (with an
// unquantised tensor beside them) are found, read back equal, and dequantise to the same bits.
func TestPrequantisedCheckpointRoundTrip(t *testing.T) {
	q, _ := QuantizeNF4(lcgInput(96*64, 5), []int{96, 64}, Options{DoubleQuant: true})
	o, _ := QuantizeNF4(lcgInput(33*7, 6), []int{33, 7}, Options{})
	var tensors []safetensors.Tensor
	for name, w := range map[string]*Weight{"model.layers.0.self_attn.q_proj.weight": q, "model.layers.0.mlp.down_proj.weight": o} {
		ts, err := w.BitsandbytesTensors(name, "bfloat16")
		if err != nil {
			t.Fatal(err)
		}
		tensors = append(tensors, ts...)
	}
	tensors = append(tensors, safetensors.Tensor{Name: "model.norm.weight", DType: safetensors.F32, Shape: []int{4}, Data: make([]byte, 16)})
	f := writeCheckpoint(t, tensors)
	if got := QuantizedWeights(f); !slices.Equal(got, []string{"model.layers.0.mlp.down_proj.weight", "model.layers.0.self_attn.q_proj.weight"}) {
		t.Fatalf("QuantizedWeights = %v", got)
	}
	if info, _ := f.Tensor("model.layers.0.self_attn.q_proj.weight"); !slices.Equal(info.Shape, []int{96 * 64 / 2, 1}) {
		t.Errorf("packed weight stored as %v, want transformers' [N/2, 1]", info.Shape)
	}
	for name, want := range map[string]*Weight{"model.layers.0.self_attn.q_proj.weight": q, "model.layers.0.mlp.down_proj.weight": o} {
		got, err := ReadBitsandbytes(f, name)
		if err != nil {
			t.Fatal(err)
		}
		a, b := make([]uint16, want.N()), make([]uint16, want.N())
		if err := want.DequantizeBF16(a); err != nil {
			t.Fatal(err)
		}
		if err := got.DequantizeBF16(b); err != nil {
			t.Fatal(err)
		}
		if !slices.Equal(a, b) || !slices.Equal(got.Shape, want.Shape) || (got.Nested == nil) != (want.Nested == nil) {
			t.Errorf("%s: the weight read back differs", name)
		}
	}
}

// The blob bitsandbytes writes (json.dumps of QuantState.as_dict's non-tensor items).
const bnbBlob = `{"quant_type": "nf4", "blocksize": 64, "dtype": "bfloat16", "shape": [4, 64], "nested_blocksize": 256, "nested_dtype": "float32", "nested_offset": 0.012345678918063641}`

func TestParseQuantState(t *testing.T) {
	qs, err := ParseQuantState([]byte(bnbBlob))
	if err != nil {
		t.Fatal(err)
	}
	if !qs.Nested() || !slices.Equal(qs.Shape, []int{4, 64}) || float32(*qs.NestedOffset) != float32(0.012345678918063641) {
		t.Errorf("parsed %+v", qs)
	}
	for _, tc := range []struct{ blob, want string }{
		{`{"quant_type": "fp4", "blocksize": 64, "dtype": "bfloat16", "shape": [4, 64]}`, "fp4 is not supported"},
		{`{"quant_type": "int8", "blocksize": 64, "dtype": "bfloat16", "shape": [4, 64]}`, `"int8" is not supported`},
		{`{"quant_type": "nf4", "blocksize": 128, "dtype": "bfloat16", "shape": [4, 64]}`, "blocksize 128"},
		{`{"quant_type": "nf4", "blocksize": 64, "dtype": "int8", "shape": [4, 64]}`, "dtype"},
		{`{"quant_type": "nf4", "blocksize": 64, "dtype": "bfloat16", "shape": []}`, "dimensions"},
		{`{"quant_type": "nf4", "blocksize": 64, "dtype": "bfloat16", "shape": [4, -1]}`, "out of range"},
		{`{"quant_type": "nf4", "blocksize": 64, "dtype": "bfloat16", "shape": [1048576, 1048576, 4]}`, "2^40"},
		{`{"quant_type": "nf4", "blocksize": 64, "dtype": "bfloat16", "shape": [4, 64], "nested_blocksize": 256, "nested_dtype": "float32"}`, "nested_offset"},
		{`{"quant_type": "nf4", "blocksize": 64, "dtype": "bfloat16", "shape": [4, 64], "nested_offset": 1}`, "nested_blocksize 0"},
		{`{"quant_type": "nf4", "blocksize": 64, "dtype": "bfloat16", "shape": [4, 64]} {}`, "after its JSON"},
		{`[1, 2]`, "not bitsandbytes' JSON"},
	} {
		if _, err := ParseQuantState([]byte(tc.blob)); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: err = %v, want one containing %q", tc.blob, err, tc.want)
		}
	}
}

// TestReadBitsandbytesRefuses: a damaged or unsupported checkpoint is refused with the tensor
// named.
func TestReadBitsandbytesRefuses(t *testing.T) {
	w, _ := QuantizeNF4(lcgInput(8*64, 7), []int{8, 64}, Options{DoubleQuant: true})
	const name = "m.weight"
	good, err := w.BitsandbytesTensors(name, "bfloat16")
	if err != nil {
		t.Fatal(err)
	}
	edit := func(suffix string, f func(*safetensors.Tensor)) []safetensors.Tensor {
		out := slices.Clone(good)
		for i := range out {
			if out[i].Name == name+suffix {
				f(&out[i])
			}
		}
		return out
	}
	drop := func(suffix string) []safetensors.Tensor {
		return slices.DeleteFunc(slices.Clone(good), func(t safetensors.Tensor) bool { return t.Name == name+suffix })
	}
	for _, tc := range []struct {
		name    string
		tensors []safetensors.Tensor
		want    string
	}{
		{"no state", drop(SuffixQuantStateNF4), "no m.weight.quant_state.bitsandbytes__nf4"},
		{"fp4", append(drop(SuffixQuantStateNF4), safetensors.Tensor{Name: name + ".quant_state.bitsandbytes__fp4", DType: safetensors.U8, Shape: []int{2}, Data: []byte("{}")}), "fp4"},
		{"short packed", edit("", func(t *safetensors.Tensor) { t.Data, t.Shape = t.Data[:10], []int{10, 1} }), "packed bytes"},
		{"not nf4 map", edit(SuffixQuantMap, func(t *safetensors.Tensor) { t.Data = f32bytes(make([]float32, 16)) }), "not the NF4 code book"},
		{"f32 absmax under nested", edit(SuffixAbsmax, func(t *safetensors.Tensor) {
			t.DType, t.Data, t.Shape = safetensors.F32, make([]byte, 32), []int{8}
		}), "double quantisation"},
		{"no nested map", drop(SuffixNestedQuantMap), "nested_quant_map"},
		{"short nested absmax", edit(SuffixNestedAbsmax, func(t *safetensors.Tensor) { t.Data, t.Shape = nil, []int{0} }), "nested_absmax has 0"},
	} {
		f := writeCheckpoint(t, tc.tensors)
		if _, err := ReadBitsandbytes(f, name); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: err = %v, want one containing %q", tc.name, err, tc.want)
		}
	}
}

func TestConfig(t *testing.T) {
	c := Config{LoadIn4bit: true, DoubleQuant: true}
	if err := c.Validate(); err != nil || c.QuantType != "nf4" || c.ComputeDType != "bfloat16" {
		t.Fatalf("defaults: %+v, %v", c, err)
	}
	for _, m := range []struct {
		module string
		want   bool
	}{
		{"model.layers.0.self_attn.q_proj", true},
		{"model.layers.3.mlp.down_proj", true},
		{"lm_head", false},
	} {
		if got := c.Quantizes(m.module); got != m.want {
			t.Errorf("Quantizes(%s) = %v", m.module, got)
		}
	}
	c.SkipModules = []string{"down_proj"}
	if c.Quantizes("model.layers.3.mlp.down_proj") {
		t.Error("a skipped module is quantised")
	}
	for _, bad := range []Config{
		{LoadIn4bit: true, QuantType: "fp4"},
		{LoadIn4bit: true, ComputeDType: "float16"},
		{DoubleQuant: true},
	} {
		if err := bad.Validate(); err == nil {
			t.Errorf("%+v was accepted", bad)
		}
	}
	hf := `{"quant_method": "bitsandbytes", "load_in_4bit": true, "load_in_8bit": false, "bnb_4bit_quant_type": "nf4", "bnb_4bit_use_double_quant": true, "bnb_4bit_compute_dtype": "bfloat16", "bnb_4bit_quant_storage": "uint8", "llm_int8_skip_modules": null}`
	got, err := FromHFConfig([]byte(hf))
	if err != nil || !got.DoubleQuant || got.QuantType != "nf4" {
		t.Fatalf("FromHFConfig: %+v, %v", got, err)
	}
	for _, bad := range []string{`{"quant_method": "gptq", "bits": 4}`, `{"quant_method": "bitsandbytes", "load_in_8bit": true}`, `{"quant_method": "bitsandbytes", "load_in_4bit": true, "bnb_4bit_quant_type": "fp4"}`} {
		if _, err := FromHFConfig([]byte(bad)); err == nil {
			t.Errorf("FromHFConfig(%s) was accepted", bad)
		}
	}
	if c, err := FromHFConfig(nil); c != nil || err != nil {
		t.Errorf("no quantization_config: %v, %v", c, err)
	}
}

// FuzzParseQuantState: any blob is refused or gives a state that satisfies the format's rules
// and survives a round trip through the writer's JSON.
func FuzzParseQuantState(f *testing.F) {
	f.Add([]byte(bnbBlob))
	f.Add([]byte(`{"quant_type": "nf4", "blocksize": 64, "dtype": "float16", "shape": [3, 5, 7]}`))
	f.Add([]byte(`{"quant_type": "fp4"}`))
	f.Add([]byte(`{"shape": [1e30]}`))
	f.Add([]byte{0xff, '{'})
	f.Fuzz(func(t *testing.T, blob []byte) {
		qs, err := ParseQuantState(blob)
		if err != nil {
			return
		}
		if qs.QuantType != "nf4" || qs.Blocksize != Blocksize || len(qs.Shape) == 0 {
			t.Fatalf("accepted %+v", qs)
		}
		n := int64(1)
		for _, d := range qs.Shape {
			if d <= 0 {
				t.Fatalf("accepted shape %v", qs.Shape)
			}
			n *= int64(d)
		}
		if n > 1<<40 {
			t.Fatalf("accepted %d elements", n)
		}
		if qs.Nested() && (qs.NestedOffset == nil || math.IsNaN(*qs.NestedOffset)) {
			t.Fatalf("accepted a nested state without an offset: %+v", qs)
		}
		again, err := json.Marshal(qs)
		if err != nil {
			t.Fatal(err)
		}
		back, err := ParseQuantState(again)
		if err != nil || !reflect.DeepEqual(back, qs) {
			t.Fatalf("round trip of %s: %+v, %v", again, back, err)
		}
	})
}
