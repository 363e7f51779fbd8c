package models

import (
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/halo-shell/halo-shell/engine/backend"
	"github.com/halo-shell/halo-shell/engine/hf/config"
	"github.com/halo-shell/halo-shell/engine/hf/safetensors"
	"github.com/halo-shell/halo-shell/engine/nn"
	"github.com/halo-shell/halo-shell/engine/quant"
	"github.com/halo-shell/halo-shell/engine/tensor"
)

// quantState holds a model's 4-bit base (QLoRA): the NF4 weights by parameter name and the
// scratch their layers dequantise into, one buffer for the whole model.
type quantState struct {
	config  quant.Config
	weights map[string]*nn.QuantWeight // by weight name ("...q_proj.weight")
	params  int                        // elements they hold
	scratch nn.WeightScratch
}

// QuantizeBase stores the weights of the linear layers c selects (every one but the LM head,
// as transformers' load_in_4bit does; routed experts are not linear layers here) in NF4 and
// frees their full-precision copies: the parameter arena is rebuilt without them. The base
// becomes frozen for good: a quantised model trains adapters only (AttachLoRA) and is not
// saved, merged or loaded into again (its adapter is saved). Passes then dequantise each
// weight into one scratch buffer shared by the layers.
func (m *Model) QuantizeBase(c quant.Config) error {
	if err := c.Validate(); err != nil {
		return fmt.Errorf("models: %w", err)
	}
	if !c.LoadIn4bit {
		return nil
	}
	if m.Family.Host != nil {
		return fmt.Errorf("models: a 4-bit base of %s is not supported: its decoder runs on the host tape", m.Arch.ModelType)
	}
	if m.quant != nil {
		return errors.New("models: the base is already quantised")
	}
	if m.fullIndex != nil {
		return errors.New("models: a model holding a subset of the experts cannot be quantised (quantise the whole model on one device)")
	}
	if m.Grads != nil {
		return errors.New("models: the base has gradients; a quantised base is frozen: quantise before enabling gradients, and train adapters (use_peft)")
	}
	q := &quantState{config: c, weights: map[string]*nn.QuantWeight{}}
	fail := func(err error) error {
		for _, w := range q.weights {
			w.Free(m.b)
		}
		return fmt.Errorf("models: quantising the base: %w", err)
	}
	for _, l := range m.linearLayers() {
		if !c.Quantizes(l.Name) || l.W.IsNil() {
			continue
		}
		vals, err := backend.ToFloat32(m.b, l.W)
		if err != nil {
			return fail(err)
		}
		w, err := quant.QuantizeNF4(vals, l.W.Shape(), quant.Options{DoubleQuant: c.DoubleQuant})
		if err != nil {
			return fail(fmt.Errorf("%s: %w", l.Name, err))
		}
		qw, err := nn.NewQuantWeight(m.b, w)
		if err != nil {
			return fail(fmt.Errorf("%s: %w", l.Name, err))
		}
		q.weights[l.Name+".weight"] = qw
		q.params += w.N()
	}
	// The arena without the quantised weights: the others are copied over and the old one freed.
	var keep []ParamSpec
	for _, s := range m.Specs {
		if _, ok := q.weights[s.Name]; !ok {
			keep = append(keep, s)
		}
	}
	arena, err := newArena(m.b, m.opts.DType, keep)
	if err != nil {
		return fail(err)
	}
	for i, s := range keep {
		old, _ := m.Params.Get(s.Name)
		if err := m.b.Copy(arena.Views[i], old); err != nil {
			_ = arena.free(m.b)
			return fail(err)
		}
	}
	if err := m.Params.free(m.b); err != nil {
		_ = arena.free(m.b)
		return fail(err)
	}
	m.Params, m.Specs, m.quant = arena, keep, q
	m.build()
	return nil
}

// Quantized reports whether the base is stored in 4 bits, and the bytes its NF4 weights and
// the shared scratch take on the device.
func (m *Model) Quantized() (ok bool, weightBytes, scratchBytes int64) {
	if m.quant == nil {
		return false, 0, 0
	}
	for _, w := range m.quant.weights {
		weightBytes += w.Bytes()
	}
	return true, weightBytes, m.quant.scratch.Bytes()
}

// QuantizedNames lists the weights stored in NF4, sorted.
func (m *Model) QuantizedNames() []string {
	if m.quant == nil {
		return nil
	}
	var out []string
	for n := range m.quant.weights {
		out = append(out, n)
	}
	slices.Sort(out)
	return out
}

// bindQuant gives the quantised linears their NF4 weights (build leaves their W unset: the
// arena no longer holds them).
func (m *Model) bindQuant() {
	if m.quant == nil {
		return
	}
	for _, l := range m.linearLayers() {
		if w, ok := m.quant.weights[l.Name+".weight"]; ok {
			l.Quant, l.W, l.GW = w, tensor.Tensor{}, tensor.Tensor{}
		}
	}
}

// scratch is the pass's weight scratch (nil for a model without a quantised base).
func (m *Model) scratch() *nn.WeightScratch {
	if m.quant == nil {
		return nil
	}
	return &m.quant.scratch
}

// freeQuant releases the NF4 weights and the scratch.
func (m *Model) freeQuant() error {
	if m.quant == nil {
		return nil
	}
	for _, w := range m.quant.weights {
		w.Free(m.b)
	}
	err := m.quant.scratch.Free(m.b)
	m.quant = nil
	return err
}

// QuantizedParamCount is what QuantizeBase with c stores in NF4 for a model of shape s: the
// elements of the quantised weights, their device bytes (quant.StorageBytes each) and the
// largest one's elements (the scratch). The linears are linearLayers': the attention
// projections of every layer and the MLP projections of the dense layers.
func QuantizedParamCount(s config.Shape, c quant.Config) (params, bytes, largest int64, err error) {
	if err := c.Validate(); err != nil {
		return 0, 0, 0, fmt.Errorf("models: %w", err)
	}
	if !c.LoadIn4bit {
		return 0, 0, 0, nil
	}
	q, kv := s.QDim(), s.KVDim()
	dense := s.Layers - s.MoELayers
	if !s.MoE() {
		dense = s.Layers
	}
	type mod struct {
		name    string
		out, in int
	}
	for i := range s.Layers {
		mods := []mod{{"self_attn.q_proj", q, s.Hidden}, {"self_attn.k_proj", kv, s.Hidden}, {"self_attn.v_proj", kv, s.Hidden}, {"self_attn.o_proj", s.Hidden, q}}
		if i < dense {
			mods = append(mods, mod{"mlp.gate_proj", s.Intermediate, s.Hidden}, mod{"mlp.up_proj", s.Intermediate, s.Hidden}, mod{"mlp.down_proj", s.Hidden, s.Intermediate})
		}
		for _, md := range mods {
			if !c.Quantizes(layerName(i, md.name)) {
				continue
			}
			n := int64(md.out) * int64(md.in)
			params += n
			bytes += quant.StorageBytes(n, c.DoubleQuant)
			largest = max(largest, n)
		}
	}
	return params, bytes, largest, nil
}

// readPrequantized reads the NF4 weights of a bitsandbytes 4-bit checkpoint (its config.json
// has a bitsandbytes quantization_config, its linears a quant_state) and uploads them to b; nil
// for any other checkpoint.
func readPrequantized(cfg *config.Config, ck safetensors.Source, b backend.Backend) (*quantState, error) {
	names := quant.QuantizedWeights(ck)
	raw, has := cfg.Extra("quantization_config")
	var qc *quant.Config
	if has {
		var probe struct {
			Method string `json:"quant_method"`
		}
		if json.Unmarshal(raw, &probe) == nil && probe.Method == "bitsandbytes" {
			var err error
			if qc, err = quant.FromHFConfig(raw); err != nil {
				return nil, fmt.Errorf("models: %w", err)
			}
		}
	}
	if len(names) == 0 {
		if qc != nil {
			return nil, errors.New("models: config.json asks for bitsandbytes 4-bit weights but no tensor has a quant_state.bitsandbytes__nf4 beside it")
		}
		return nil, nil
	}
	q := &quantState{weights: map[string]*nn.QuantWeight{}}
	if qc != nil {
		q.config = *qc
	}
	for _, n := range names {
		w, err := quant.ReadBitsandbytes(ck, n)
		if err == nil {
			var qw *nn.QuantWeight
			if qw, err = nn.NewQuantWeight(b, w); err == nil {
				q.weights[n] = qw
				q.params += w.N()
				continue
			}
		}
		q.free(b)
		return nil, fmt.Errorf("models: %w", err)
	}
	return q, nil
}

// quantizeOnLoad reads from ck, one at a time on the host, the weights of the linear layers c
// selects (the attention projections of every layer and the projections of dense MLPs, as
// QuantizeBase), rounds them to dt (the model's dtype: F32 when Invalid), and stores them in
// NF4 on b. The model is then built without them, as for a pre-quantised checkpoint.
func quantizeOnLoad(cfg *config.Config, ck safetensors.Source, b backend.Backend, dt tensor.DType, c quant.Config) (*quantState, error) {
	if err := c.Validate(); err != nil {
		return nil, fmt.Errorf("models: %w", err)
	}
	f, err := Lookup(cfg.ModelType)
	if err != nil {
		return nil, err
	}
	a, err := ArchFromConfig(cfg.Clone())
	if err != nil {
		return nil, err
	}
	if dt == tensor.Invalid {
		dt = tensor.F32
	}
	inSpecs := map[string][]int{}
	for _, s := range specsFor(f, &a) {
		inSpecs[s.Name] = s.Shape
	}
	q := &quantState{config: c, weights: map[string]*nn.QuantWeight{}}
	fail := func(name string, err error) (*quantState, error) {
		q.free(b)
		return nil, fmt.Errorf("models: load_in_4bit: %s: %w", name, err)
	}
	for i := 0; i < a.Layers; i++ {
		var modules []string
		for _, p := range []string{"q_proj", "k_proj", "v_proj", "o_proj"} {
			modules = append(modules, fmt.Sprintf("model.layers.%d.self_attn.%s", i, p))
		}
		for _, p := range []string{"gate_proj", "up_proj", "down_proj"} {
			modules = append(modules, fmt.Sprintf("model.layers.%d.mlp.%s", i, p))
		}
		for _, mod := range modules {
			name := mod + ".weight"
			shape, ok := inSpecs[name]
			if !ok || !c.Quantizes(mod) {
				continue // not a layer of this model (an MoE layer's MLP), or not selected
			}
			info, ok := ck.Tensor(name)
			if !ok {
				return fail(name, errors.New("the checkpoint has no such tensor"))
			}
			if !slices.Equal(info.Shape, shape) {
				return fail(name, fmt.Errorf("shape %v in %s, config.json implies %v", info.Shape, info.File, shape))
			}
			if err := weightDType(info.DType); err != nil {
				return fail(name, err)
			}
			vals, err := safetensors.ToFloat32(info)
			if err != nil {
				return fail(name, err)
			}
			if dt != tensor.F32 && !(dt == tensor.BF16 && info.DType == safetensors.BF16) {
				// The values the model would hold, as QuantizeBase reads them (a bf16 tensor
				// loaded as bf16 already is).
				raw, err := tensor.EncodeFloat32(dt, vals)
				if err == nil {
					vals, err = tensor.DecodeFloat32(dt, raw)
				}
				if err != nil {
					return fail(name, err)
				}
			}
			w, err := quant.QuantizeNF4(vals, shape, quant.Options{DoubleQuant: c.DoubleQuant})
			if err != nil {
				return fail(name, err)
			}
			qw, err := nn.NewQuantWeight(b, w)
			if err != nil {
				return fail(name, err)
			}
			q.weights[name] = qw
			q.params += w.N()
		}
	}
	if len(q.weights) == 0 {
		return nil, nil
	}
	return q, nil
}

// checkPrequantized refuses NF4 weights that are not linear layers of the model.
func (m *Model) checkPrequantized() error {
	if m.quant == nil {
		return nil
	}
	bound := map[string]bool{}
	for _, l := range m.linearLayers() {
		if l.Quant != nil {
			bound[l.Name+".weight"] = true
		}
	}
	for n, w := range m.quant.weights {
		if !bound[n] {
			return fmt.Errorf("models: %s is stored in 4 bits but is not a linear layer of %s that this package can quantise (attention and dense MLP projections)", n, m.Arch.ModelType)
		}
		if s, ok := m.specShape(n); ok && (s[0] != w.O || s[1] != w.I) {
			return fmt.Errorf("models: %s has shape [%d %d] in its quant_state, config.json implies %v", n, w.O, w.I, s)
		}
	}
	return nil
}

// specShape is the shape config.json implies for parameter name.
func (m *Model) specShape(name string) ([]int, bool) {
	for _, s := range specsFor(m.Family, &m.Arch) {
		if s.Name == name {
			return s.Shape, true
		}
	}
	return nil, false
}

// holds reports whether tensor name of a checkpoint belongs to one of the NF4 weights (the
// packed weight or one of its state tensors).
func (q *quantState) holds(name string) bool {
	if q == nil {
		return false
	}
	for n := range q.weights {
		if name == n || strings.HasPrefix(name, n+".") {
			return true
		}
	}
	return false
}

// free releases the NF4 weights (of a state not yet owned by a model).
func (q *quantState) free(b backend.Backend) {
	for _, w := range q.weights {
		w.Free(b)
	}
}
