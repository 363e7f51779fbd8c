package quant

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"

	"github.com/halo-shell/halo-shell/engine/hf/safetensors"
)

// A bitsandbytes 4-bit checkpoint (transformers' save_pretrained of a model loaded with
// load_in_4bit) stores each quantised linear weight W of shape [O, I] as these tensors:
//
//	<W>                                      U8  [ceil(O*I/2), 1]  packed codes
//	<W>.absmax                               F32 [B], or U8 [B] with double quantisation
//	<W>.quant_map                            F32 [16]  the NF4 code book
//	<W>.nested_absmax                        F32 [ceil(B/256)]     (double quantisation)
//	<W>.nested_quant_map                     F32 [256]             (double quantisation)
//	<W>.quant_state.bitsandbytes__nf4        U8  [len]  UTF-8 JSON: quant_type, blocksize,
//	                                         dtype, shape, and nested_blocksize, nested_dtype,
//	                                         nested_offset with double quantisation
//
// where <W> is the weight's name (model.layers.0.self_attn.q_proj.weight) and B = ceil(O*I/64).
// Everything else (embeddings, norms, the LM head) is stored as usual.

// Key suffixes of the quantisation state of a weight.
const (
	SuffixAbsmax         = ".absmax"
	SuffixQuantMap       = ".quant_map"
	SuffixNestedAbsmax   = ".nested_absmax"
	SuffixNestedQuantMap = ".nested_quant_map"
	SuffixQuantStateNF4  = ".quant_state.bitsandbytes__nf4"
	quantStatePrefix     = ".quant_state.bitsandbytes__"
)

// QuantState is the JSON blob of a weight's quant_state tensor.
type QuantState struct {
	QuantType       string   `json:"quant_type"`
	Blocksize       int      `json:"blocksize"`
	DType           string   `json:"dtype"`
	Shape           []int    `json:"shape"`
	NestedBlocksize int      `json:"nested_blocksize,omitempty"`
	NestedDType     string   `json:"nested_dtype,omitempty"`
	NestedOffset    *float64 `json:"nested_offset,omitempty"`
}

// maxStateBytes bounds the JSON blob: a real one is about 200 bytes.
const maxStateBytes = 1 << 16

// ParseQuantState reads and checks a quant_state blob: NF4 only (fp4 is refused), blocks of 64,
// a positive shape, and either all or none of the nested fields with blocks of 256.
func ParseQuantState(blob []byte) (QuantState, error) {
	var qs QuantState
	if len(blob) > maxStateBytes {
		return qs, fmt.Errorf("quant: quant_state is %d bytes; a bitsandbytes state is a small JSON object", len(blob))
	}
	dec := json.NewDecoder(bytes.NewReader(blob))
	if err := dec.Decode(&qs); err != nil {
		return qs, fmt.Errorf("quant: quant_state is not bitsandbytes' JSON object: %w", err)
	}
	if dec.More() {
		return qs, fmt.Errorf("quant: quant_state has data after its JSON object")
	}
	switch qs.QuantType {
	case "nf4":
	case "fp4":
		return qs, fmt.Errorf("quant: quant_type fp4 is not supported (only nf4): re-quantise the model with bnb_4bit_quant_type=\"nf4\", or load its bf16 checkpoint with load_in_4bit")
	default:
		return qs, fmt.Errorf("quant: quant_type %q is not supported (only nf4)", qs.QuantType)
	}
	if qs.Blocksize != Blocksize {
		return qs, fmt.Errorf("quant: blocksize %d is not supported (only %d, the default of transformers' 4-bit loading)", qs.Blocksize, Blocksize)
	}
	switch qs.DType {
	case "bfloat16", "float16", "float32":
	default:
		return qs, fmt.Errorf("quant: dtype %q of the original weight is not one of bfloat16, float16, float32", qs.DType)
	}
	if len(qs.Shape) == 0 || len(qs.Shape) > 8 {
		return qs, fmt.Errorf("quant: shape %v: want the weight's 1 to 8 dimensions", qs.Shape)
	}
	n := int64(1)
	for _, d := range qs.Shape {
		if d <= 0 || d > 1<<31 {
			return qs, fmt.Errorf("quant: shape %v has a dimension out of range", qs.Shape)
		}
		if n *= int64(d); n > 1<<40 {
			return qs, fmt.Errorf("quant: shape %v holds more than 2^40 elements", qs.Shape)
		}
	}
	nested := qs.NestedBlocksize != 0 || qs.NestedDType != "" || qs.NestedOffset != nil
	if nested {
		if qs.NestedBlocksize != NestedBlocksize {
			return qs, fmt.Errorf("quant: nested_blocksize %d is not supported (bitsandbytes uses %d)", qs.NestedBlocksize, NestedBlocksize)
		}
		if qs.NestedDType != "float32" {
			return qs, fmt.Errorf("quant: nested_dtype %q: want float32", qs.NestedDType)
		}
		if qs.NestedOffset == nil || math.IsNaN(*qs.NestedOffset) || math.IsInf(*qs.NestedOffset, 0) || math.Abs(*qs.NestedOffset) > math.MaxFloat32 {
			return qs, fmt.Errorf("quant: nested_offset is missing or not a finite float32")
		}
	}
	return qs, nil
}

// Nested reports whether the state describes double quantisation.
func (qs QuantState) Nested() bool { return qs.NestedBlocksize != 0 }

// QuantizedWeights lists the weights of a checkpoint stored in bitsandbytes' 4-bit layout: the
// names that have a quant_state tensor beside them.
func QuantizedWeights(src safetensors.Source) []string {
	var out []string
	for _, n := range src.Names() {
		if i := strings.Index(n, quantStatePrefix); i > 0 {
			out = append(out, n[:i])
		}
	}
	slices.Sort(out)
	return slices.Compact(out)
}

// ReadBitsandbytes reads the NF4 weight name (e.g. "model.layers.0.mlp.up_proj.weight") and its
// quantisation state from a checkpoint in bitsandbytes' layout, checking every tensor's dtype and
// size against the state. The returned weight's slices are copies (valid after src closes).
func ReadBitsandbytes(src safetensors.Source, name string) (*Weight, error) {
	get := func(suffix string, dt safetensors.DType) (safetensors.TensorInfo, error) {
		t, ok := src.Tensor(name + suffix)
		if !ok {
			return t, fmt.Errorf("quant: %s: the checkpoint has no %s%s", name, name, suffix)
		}
		if t.DType != dt {
			return t, fmt.Errorf("quant: %s%s is %s, want %s", name, suffix, t.DType, dt)
		}
		return t, nil
	}
	if _, ok := src.Tensor(name + quantStatePrefix + "fp4"); ok {
		return nil, fmt.Errorf("quant: %s is quantised as fp4; only nf4 is supported: re-quantise with bnb_4bit_quant_type=\"nf4\", or load the bf16 checkpoint with load_in_4bit", name)
	}
	st, err := get(SuffixQuantStateNF4, safetensors.U8)
	if err != nil {
		return nil, err
	}
	qs, err := ParseQuantState(st.Data)
	if err != nil {
		return nil, fmt.Errorf("%w (in %s%s)", err, name, SuffixQuantStateNF4)
	}
	w := &Weight{Shape: slices.Clone(qs.Shape)}
	n := int64(w.N())
	blocks := (n + Blocksize - 1) / Blocksize
	packed, err := get("", safetensors.U8)
	if err != nil {
		return nil, err
	}
	if int64(len(packed.Data)) != (n+1)/2 {
		return nil, fmt.Errorf("quant: %s holds %d packed bytes (shape %v); its quant_state shape %v needs %d", name, len(packed.Data), packed.Shape, qs.Shape, (n+1)/2)
	}
	w.Packed = slices.Clone(packed.Data)
	qmap, err := get(SuffixQuantMap, safetensors.F32)
	if err != nil {
		return nil, err
	}
	if m := f32s(qmap.Data); !slices.Equal(m, NF4Code[:]) {
		return nil, fmt.Errorf("quant: %s%s is not the NF4 code book (got %d values %v)", name, SuffixQuantMap, len(m), head(m))
	}
	if !qs.Nested() {
		am, err := get(SuffixAbsmax, safetensors.F32)
		if err != nil {
			return nil, err
		}
		if int64(len(am.Data)) != 4*blocks {
			return nil, fmt.Errorf("quant: %s%s has %d values; %d elements in blocks of %d need %d", name, SuffixAbsmax, len(am.Data)/4, n, Blocksize, blocks)
		}
		w.Absmax = f32s(am.Data)
		return w, nil
	}
	codes, err := get(SuffixAbsmax, safetensors.U8)
	if err != nil {
		return nil, fmt.Errorf("%w (the quant_state says double quantisation)", err)
	}
	if int64(len(codes.Data)) != blocks {
		return nil, fmt.Errorf("quant: %s%s has %d codes; %d elements in blocks of %d need %d", name, SuffixAbsmax, len(codes.Data), n, Blocksize, blocks)
	}
	na, err := get(SuffixNestedAbsmax, safetensors.F32)
	if err != nil {
		return nil, err
	}
	if want := (blocks + NestedBlocksize - 1) / NestedBlocksize; int64(len(na.Data)) != 4*want {
		return nil, fmt.Errorf("quant: %s%s has %d values; %d blocks in nested blocks of %d need %d", name, SuffixNestedAbsmax, len(na.Data)/4, blocks, NestedBlocksize, want)
	}
	nm, err := get(SuffixNestedQuantMap, safetensors.F32)
	if err != nil {
		return nil, err
	}
	if len(nm.Data) != 4*256 {
		return nil, fmt.Errorf("quant: %s%s has %d values, want 256", name, SuffixNestedQuantMap, len(nm.Data)/4)
	}
	nd := &Nested{Codes: slices.Clone(codes.Data), Absmax: f32s(na.Data), Offset: float32(*qs.NestedOffset)}
	copy(nd.Map[:], f32s(nm.Data))
	w.Nested = nd
	return w, nil
}

// BitsandbytesTensors returns the tensors bitsandbytes stores for weight name (the layout
// above), for writing a pre-quantised checkpoint. dtype is the original weight's dtype name
// ("bfloat16").
func (w *Weight) BitsandbytesTensors(name, dtype string) ([]safetensors.Tensor, error) {
	if err := w.Validate(); err != nil {
		return nil, err
	}
	qs := QuantState{QuantType: "nf4", Blocksize: Blocksize, DType: dtype, Shape: w.Shape}
	out := []safetensors.Tensor{
		{Name: name, DType: safetensors.U8, Shape: []int{len(w.Packed), 1}, Data: slices.Clone(w.Packed)},
		{Name: name + SuffixQuantMap, DType: safetensors.F32, Shape: []int{16}, Data: f32bytes(NF4Code[:])},
	}
	if w.Nested == nil {
		out = append(out, safetensors.Tensor{Name: name + SuffixAbsmax, DType: safetensors.F32, Shape: []int{len(w.Absmax)}, Data: f32bytes(w.Absmax)})
	} else {
		nd := w.Nested
		off := float64(nd.Offset)
		qs.NestedBlocksize, qs.NestedDType, qs.NestedOffset = NestedBlocksize, "float32", &off
		out = append(out,
			safetensors.Tensor{Name: name + SuffixAbsmax, DType: safetensors.U8, Shape: []int{len(nd.Codes)}, Data: slices.Clone(nd.Codes)},
			safetensors.Tensor{Name: name + SuffixNestedAbsmax, DType: safetensors.F32, Shape: []int{len(nd.Absmax)}, Data: f32bytes(nd.Absmax)},
			safetensors.Tensor{Name: name + SuffixNestedQuantMap, DType: safetensors.F32, Shape: []int{256}, Data: f32bytes(nd.Map[:])})
	}
	blob, err := json.Marshal(qs)
	if err != nil {
		return nil, err
	}
	out = append(out, safetensors.Tensor{Name: name + SuffixQuantStateNF4, DType: safetensors.U8, Shape: []int{len(blob)}, Data: blob})
	return out, nil
}

func f32s(b []byte) []float32 {
	out := make([]float32, len(b)/4)
	for i := range out {
		out[i] = math.Float32frombits(binary.LittleEndian.Uint32(b[4*i:]))
	}
	return out
}

func f32bytes(v []float32) []byte {
	out := make([]byte, 4*len(v))
	for i, x := range v {
		binary.LittleEndian.PutUint32(out[4*i:], math.Float32bits(x))
	}
	return out
}

func head(v []float32) string {
	var parts []string
	for _, x := range v[:min(len(v), 4)] {
		parts = append(parts, strconv.FormatFloat(float64(x), 'g', 6, 32))
	}
	if len(v) > 4 {
		parts = append(parts, "...")
	}
	return "[" + strings.Join(parts, " ") + "]"
}
