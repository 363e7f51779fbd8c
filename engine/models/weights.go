package models

import (
	"fmt"
	"slices"

	"github.com/halo-shell/halo-shell/engine/backend"
	"github.com/halo-shell/halo-shell/engine/hf/safetensors"
	"github.com/halo-shell/halo-shell/engine/tensor"
)

// LoadWeights copies every parameter from a safetensors source (a file or a checkpoint), by HF
// name, converting any stored float dtype to the model's dtype. A missing tensor or a shape
// mismatch is an error naming the tensor; tensors the model does not use (lm_head.weight of a
// tied model, rotary inv_freq buffers of old checkpoints) are returned as unused.
//
// A model holding a subset of the experts (Options.Experts) loads those experts only; the
// checkpoint's other experts are not reported unused.
//
// Mixture-of-experts weights load from the Hub layout (one tensor per expert) or from
// transformers 5's fused in-memory layout (mlp.experts.gate_up_proj, mlp.experts.down_proj).
func (m *Model) LoadWeights(src safetensors.Source) (unused []string, err error) {
	if m.quant != nil {
		return nil, fmt.Errorf("models: LoadWeights: the base is quantised to 4 bits; load the checkpoint into a new model and quantise that")
	}
	return m.loadWeights(src)
}

// loadWeights is LoadWeights for the model's arena; the tensors of its NF4 weights (read by
// Load from a bitsandbytes checkpoint) are not reported unused.
func (m *Model) loadWeights(src safetensors.Source) (unused []string, err error) {
	if m.Family.Host != nil {
		hs := m.hostSource(src)
		if err := m.loadHostBuffers(hs); err != nil {
			return nil, err
		}
		src = hs
	}
	if m.Family.GatedDeltaNet == GDNSplit {
		src = withLanguageModelPrefix(src)
	}
	if f := expertHooks(m.Family); f != nil {
		src = withFusedExperts(src, f)
	}
	if _, ok := m.Family.FFN.(ossFFN); ok {
		src = withMXFP4(src)
	}
	want := make(map[string]bool, len(m.Specs))
	for i, s := range m.Specs {
		want[s.Name] = true
		info, ok := src.Tensor(s.Name)
		if !ok && s.Name == nameScore {
			// A classifier made from a causal LM: transformers initialises the new head
			// from normal(0, initializer_range), as InitRandom does.
			if err := m.initParam(i, 0); err != nil {
				return nil, err
			}
			m.Initialized = append(m.Initialized, s.Name)
			continue
		}
		if !ok {
			return nil, fmt.Errorf("models: checkpoint has no tensor %q (needed by %s; shape %v)", s.Name, m.Arch.ModelType, s.Shape)
		}
		if !slices.Equal(info.Shape, s.Shape) {
			return nil, fmt.Errorf("models: tensor %q in %s has shape %v, config.json implies %v", s.Name, info.File, info.Shape, s.Shape)
		}
		if err := m.uploadTensor(m.Params.Views[i], info); err != nil {
			return nil, fmt.Errorf("models: tensor %q in %s: %w", s.Name, info.File, err)
		}
	}
	held := m.Arch.HeldExperts
	for n := range m.hostBufs {
		want[n] = true
	}
	for _, n := range src.Names() {
		if want[n] || m.quant.holds(n) {
			continue
		}
		if x, ok := m.ExpertOf(n); ok && !held.Contains(x) && x < m.Arch.NumExperts() {
			continue // another instance's expert (a model holding a subset)
		}
		unused = append(unused, n)
	}
	return unused, nil
}

// weightDType refuses a stored dtype that is not a floating-point weight: ToFloat32 would
// turn an integer, boolean or FP8 tensor into numbers without saying so.
func weightDType(d safetensors.DType) error {
	switch d {
	case safetensors.F32, safetensors.BF16, safetensors.F16, safetensors.F64:
		return nil
	case safetensors.F8_E4M3, safetensors.F8_E5M2, safetensors.F8_E8M0:
		return fmt.Errorf("stored as %s: an FP8 checkpoint keeps per-block scales beside its weights that this loader does not apply; dequantize it to BF16 first", d)
	}
	return fmt.Errorf("stored as %s: a model weight is a floating-point tensor (F32, BF16, F16 or F64); this looks like a quantized checkpoint or a tensor that is not a weight", d)
}

func (m *Model) uploadTensor(dst tensor.Tensor, info safetensors.TensorInfo) error {
	if err := weightDType(info.DType); err != nil {
		return err
	}
	switch {
	case dst.DType() == tensor.F32 && info.DType == safetensors.F32,
		dst.DType() == tensor.BF16 && info.DType == safetensors.BF16:
		return m.b.Upload(dst, info.Data)
	}
	vals, err := safetensors.ToFloat32(info)
	if err != nil {
		return err
	}
	raw, err := tensor.EncodeFloat32(dst.DType(), vals)
	if err != nil {
		return err
	}
	return m.b.Upload(dst, raw)
}

// WeightTensors returns the parameters as safetensors tensors in state_dict order, converted to
// dt (F32 or BF16; Invalid means the model's dtype). A model holding a subset of the experts
// returns those experts only (its part of a checkpoint). Their bytes are downloaded lazily, when a
// writer asks for them.
func (m *Model) WeightTensors(dt tensor.DType) ([]safetensors.Tensor, error) {
	if dt == tensor.Invalid {
		dt = m.opts.DType
	}
	ts, err := arenaTensors(m, m.Specs, m.Params, dt)
	if err != nil {
		return nil, err
	}
	if m.Family.Host != nil {
		return m.hostTensors(ts), nil
	}
	return m.fuseExperts(ts, dt)
}

// arenaTensors returns the views of arena (laid out from specs) as safetensors tensors converted
// to dt, downloaded lazily.
func arenaTensors(m *Model, specs []ParamSpec, arena *Arena, dt tensor.DType) ([]safetensors.Tensor, error) {
	var sdt safetensors.DType
	switch dt {
	case tensor.F32:
		sdt = safetensors.F32
	case tensor.BF16:
		sdt = safetensors.BF16
	case tensor.F16:
		sdt = safetensors.F16
	default:
		return nil, fmt.Errorf("models: cannot save weights as %s (use f32, bf16 or f16)", dt)
	}
	out := make([]safetensors.Tensor, len(specs))
	for i, s := range specs {
		view := arena.Views[i]
		out[i] = safetensors.Tensor{Name: s.Name, DType: sdt, Shape: slices.Clone(s.Shape),
			Load: func() ([]byte, error) {
				if view.DType() == dt {
					raw := make([]byte, view.Bytes())
					return raw, m.b.Download(raw, view)
				}
				vals, err := backend.ToFloat32(m.b, view)
				if err != nil {
					return nil, err
				}
				return tensor.EncodeFloat32(dt, vals)
			}}
	}
	return out, nil
}
