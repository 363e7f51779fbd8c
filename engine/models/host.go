package models

import (
	"fmt"
	"slices"

	"github.com/halo-shell/halo-shell/engine/backend"
	"github.com/halo-shell/halo-shell/engine/hf/safetensors"
	"github.com/halo-shell/halo-shell/engine/nn"
	"github.com/halo-shell/halo-shell/engine/tensor"
)

// hostDecoder is a family whose decoder runs on the host tape (nn.HostTape): its parameters
// live in the model's arenas as every family's do, and each pass downloads them, runs the
// documents on the tape and adds the gradients back into the gradient arena.
type hostDecoder interface {
	// specs lists every parameter in transformers' state_dict order.
	specs(a *Arch) []ParamSpec
	// buffers are the checkpoint tensors that are not parameters (integer tables).
	buffers(a *Arch) []hostBuffer
	// loadName and saveName map a checkpoint name to a parameter name and back.
	loadName(disk string) string
	saveName(name string) string
	// check refuses what the decoder does not implement, before allocation.
	check(a *Arch, b backend.Backend) error
	// decoder builds the decoder over the parameter leaves.
	decoder(m *Model, param func(string) *nn.HVar) (*nn.DSV4, error)
}

// hostBuffer is an integer checkpoint tensor of a host decoder, stored as int64.
type hostBuffer struct {
	name  string
	shape []int
}

// errHostOnly is returned by the paths a host decoder does not have.
func (m *Model) errHostOnly(what string) error {
	return fmt.Errorf("models: %s runs its decoder on the host, which has no %s yet", m.Arch.ModelType, what)
}

// initHostBuffers zeroes the host decoder's buffers (transformers' initial tables).
func (m *Model) initHostBuffers() {
	m.hostBufs = map[string][]int64{}
	for _, b := range m.Family.Host.buffers(&m.Arch) {
		n := 1
		for _, d := range b.shape {
			n *= d
		}
		m.hostBufs[b.name] = make([]int64, n)
	}
}

// hostRun runs the documents of b on a fresh tape. It returns each token's log-probability of
// its target (0 where ignored). With seed set, seed(lp) gives each token's gradient with
// respect to its log-probability, which is back-propagated and added into the gradient arena.
func (m *Model) hostRun(b *Batch, seed func(lp []float32) ([]float64, error)) ([]float32, error) {
	if m.IsClassifier() {
		return nil, m.errHostOnly("sequence-classification head")
	}
	if m.lora != nil || m.quant != nil {
		return nil, m.errHostOnly("adapters or 4-bit base")
	}
	r, err := m.resolve(b)
	if err != nil {
		return nil, err
	}
	if m.hostOnDevice() {
		return m.deviceRun(r, seed)
	}
	var tape nn.HostTape
	leaves, dec, err := m.hostTapeDecoder(&tape)
	if err != nil {
		return nil, err
	}
	lp := make([]float32, len(r.tokens))
	var outs []*nn.HVar
	for d := 0; d+1 < len(r.cu); d++ {
		lo, hi := int(r.cu[d]), int(r.cu[d+1])
		for i := lo; i < hi; i++ {
			if int(r.positions[i]) != i-lo {
				return nil, fmt.Errorf("models: %s: token %d has position %d; the host decoder numbers each document's tokens from 0", m.Arch.ModelType, i, r.positions[i])
			}
		}
		ids := make([]int, hi-lo)
		tg := make([]int, hi-lo)
		for i := range ids {
			ids[i] = int(r.tokens[lo+i])
			tg[i] = -1
			if r.targets != nil && r.targets[lo+i] != backend.IgnoreIndex {
				tg[i] = int(r.targets[lo+i])
				if tg[i] < 0 || tg[i] >= m.Arch.Vocab {
					return nil, fmt.Errorf("models: target %d at token %d is outside the vocabulary of %d", tg[i], lo+i, m.Arch.Vocab)
				}
			}
		}
		logits, err := dec.Logits(&tape, ids)
		if err != nil {
			return nil, err
		}
		o := tape.TokenLogprobs(logits, tg)
		for i, v := range o.V {
			lp[lo+i] = float32(v)
		}
		outs = append(outs, o)
	}
	if seed == nil {
		return lp, nil
	}
	g, err := seed(lp)
	if err != nil {
		return nil, err
	}
	for d, o := range outs {
		copy(o.G, g[r.cu[d]:r.cu[d+1]])
	}
	tape.Backward()
	if err := m.EnableGrads(); err != nil {
		return nil, err
	}
	for _, s := range m.Specs {
		l := leaves[s.Name] // a tied head shares the embedding's leaf, so its gradient too
		cur, err := m.GradFloat32(s.Name)
		if err != nil {
			return nil, err
		}
		for i := range cur {
			cur[i] += float32(l.G[i])
		}
		t, _ := m.Grads.Get(s.Name)
		raw, err := tensor.EncodeFloat32(t.DType(), cur)
		if err != nil {
			return nil, err
		}
		if err := m.b.Upload(t, raw); err != nil {
			return nil, err
		}
	}
	return lp, nil
}

// hostTapeDecoder downloads every parameter as a leaf of tape (the tied head sharing the
// embedding's) and builds the host decoder over them.
func (m *Model) hostTapeDecoder(tape *nn.HostTape) (map[string]*nn.HVar, *nn.DSV4, error) {
	leaves := make(map[string]*nn.HVar, len(m.Specs))
	for _, s := range m.Specs {
		v, err := m.ParamFloat32(s.Name)
		if err != nil {
			return nil, nil, err
		}
		d := make([]float64, len(v))
		for i, x := range v {
			d[i] = float64(x)
		}
		rows, cols := 1, len(d)
		if len(s.Shape) == 2 {
			rows, cols = s.Shape[0], s.Shape[1]
		}
		leaves[s.Name] = tape.Leaf(d, rows, cols)
	}
	if m.Arch.Tied {
		leaves[nameLMHead] = leaves[nameEmbed]
	}
	dec, err := m.Family.Host.decoder(m, func(n string) *nn.HVar { return leaves[n] })
	return leaves, dec, err
}

// hostForwardBackward is ForwardBackward on the host decoder.
func (m *Model) hostForwardBackward(b Batch, lossScale float32) (float64, int, error) {
	sum, n := 0.0, 0
	_, err := m.hostRun(&b, func(lp []float32) ([]float64, error) {
		g := make([]float64, len(lp))
		for i, t := range b.Targets {
			if t != backend.IgnoreIndex {
				sum -= float64(lp[i])
				n++
				g[i] = -float64(lossScale)
			}
		}
		return g, nil
	})
	return sum, n, err
}

// hostWeighted is ForwardBackwardWeighted on the host decoder.
func (m *Model) hostWeighted(b Batch, weigh func(logprob []float32) ([]float32, error)) error {
	_, err := m.hostRun(&b, func(lp []float32) ([]float64, error) {
		scale, err := weigh(lp)
		if err != nil {
			return nil, err
		}
		if len(scale) != len(lp) {
			return nil, fmt.Errorf("models: ForwardBackwardWeighted: weigh returned %d scales for %d tokens", len(scale), len(lp))
		}
		g := make([]float64, len(lp))
		for i, t := range b.Targets {
			if t != backend.IgnoreIndex {
				g[i] = -float64(scale[i])
			}
		}
		return g, nil
	})
	return err
}

// hostSource reads a checkpoint with the host decoder's names: every parameter under its
// transformers name; the buffers are read by loadHostBuffers.
type hostSource struct {
	safetensors.Source
	names []string
	alias map[string]string
}

func (m *Model) hostSource(src safetensors.Source) *hostSource {
	w := &hostSource{Source: src, alias: map[string]string{}}
	for _, n := range src.Names() {
		hf := m.Family.Host.loadName(n)
		if _, dup := w.alias[hf]; dup {
			continue
		}
		w.alias[hf] = n
		w.names = append(w.names, hf)
	}
	slices.Sort(w.names)
	return w
}

func (w *hostSource) Names() []string { return w.names }

func (w *hostSource) Tensor(name string) (safetensors.TensorInfo, bool) {
	n, ok := w.alias[name]
	if !ok {
		return safetensors.TensorInfo{}, false
	}
	info, ok := w.Source.Tensor(n)
	info.Name = name
	return info, ok
}

// loadHostBuffers reads the decoder's integer tables from src (already renamed).
func (m *Model) loadHostBuffers(src safetensors.Source) error {
	for _, b := range m.Family.Host.buffers(&m.Arch) {
		info, ok := src.Tensor(b.name)
		if !ok {
			return fmt.Errorf("models: checkpoint has no tensor %q (needed by %s; shape %v)", b.name, m.Arch.ModelType, b.shape)
		}
		if !slices.Equal(info.Shape, b.shape) {
			return fmt.Errorf("models: tensor %q in %s has shape %v, config.json implies %v", b.name, info.File, info.Shape, b.shape)
		}
		vals, err := intValues(info)
		if err != nil {
			return fmt.Errorf("models: tensor %q in %s: %w", b.name, info.File, err)
		}
		m.hostBufs[b.name] = vals
	}
	return nil
}

// intValues decodes an integer tensor.
func intValues(info safetensors.TensorInfo) ([]int64, error) {
	switch info.DType {
	case safetensors.I64, safetensors.I32:
	default:
		return nil, fmt.Errorf("stored as %s: an index table is an integer tensor (I64 or I32)", info.DType)
	}
	size := 8
	if info.DType == safetensors.I32 {
		size = 4
	}
	if len(info.Data)%size != 0 {
		return nil, fmt.Errorf("%d bytes do not hold %s values", len(info.Data), info.DType)
	}
	out := make([]int64, len(info.Data)/size)
	for i := range out {
		var u uint64
		for k := 0; k < size; k++ {
			u |= uint64(info.Data[i*size+k]) << (8 * k)
		}
		if size == 4 {
			out[i] = int64(int32(uint32(u)))
		} else {
			out[i] = int64(u)
		}
	}
	return out, nil
}

// hostTensors are the parameters under the decoder's checkpoint names, then its buffers
// (int64).
func (m *Model) hostTensors(ts []safetensors.Tensor) []safetensors.Tensor {
	for i := range ts {
		ts[i].Name = m.Family.Host.saveName(ts[i].Name)
	}
	for _, b := range m.Family.Host.buffers(&m.Arch) {
		vals := m.hostBufs[b.name]
		raw := make([]byte, 8*len(vals))
		for i, v := range vals {
			u := uint64(v)
			for k := 0; k < 8; k++ {
				raw[8*i+k] = byte(u >> (8 * k))
			}
		}
		ts = append(ts, safetensors.Tensor{Name: m.Family.Host.saveName(b.name), DType: safetensors.I64, Shape: slices.Clone(b.shape), Data: raw})
	}
	return ts
}
