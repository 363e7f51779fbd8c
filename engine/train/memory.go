package train

import (
	"fmt"
	"strings"

	"github.com/halo-shell/halo-shell/engine/hf/config"
	"github.com/halo-shell/halo-shell/engine/hf/tokenizer"
	"github.com/halo-shell/halo-shell/engine/models"
)

// MemoryEstimate is the device memory a run needs, per device, in bytes. It is an estimate from
// the shapes: parameters, gradients and optimizer state are exact; activations count the
// tensors each layer keeps for backward at one micro-batch and ignore allocator overhead and
// backend workspaces.
type MemoryEstimate struct {
	Params      int64 // number of parameters
	ParamBytes  int64
	GradBytes   int64
	OptimBytes  int64 // AdamW moments (+ fp32 master weights with bf16 and adamw_torch)
	ActBytes    int64 // activations kept for backward at one micro-batch
	LogitsBytes int64 // the loss head's working logits
	Tokens      int   // tokens per micro-batch
}

// Total is the sum of every part.
func (m MemoryEstimate) Total() int64 {
	return m.ParamBytes + m.GradBytes + m.OptimBytes + m.ActBytes + m.LogitsBytes
}

func (m MemoryEstimate) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "memory estimate per device (%d tokens per micro-batch):\n", m.Tokens)
	for _, r := range []struct {
		name string
		v    int64
	}{{fmt.Sprintf("parameters (%.2fM)", float64(m.Params)/1e6), m.ParamBytes}, {"gradients", m.GradBytes},
		{"optimizer state", m.OptimBytes}, {"activations", m.ActBytes}, {"loss head logits", m.LogitsBytes}, {"total", m.Total()}} {
		fmt.Fprintf(&b, "  %-22s %10s\n", r.name, humanBytes(r.v))
	}
	return strings.TrimRight(b.String(), "\n")
}

func humanBytes(n int64) string {
	switch {
	case n >= 1<<30:
		return fmt.Sprintf("%.2f GiB", float64(n)/(1<<30))
	case n >= 1<<20:
		return fmt.Sprintf("%.1f MiB", float64(n)/(1<<20))
	case n >= 1<<10:
		return fmt.Sprintf("%.1f KiB", float64(n)/(1<<10))
	}
	return fmt.Sprintf("%d B", n)
}

// ModelConfigFor returns the config.json the run will train, without loading weights.
func ModelConfigFor(cfg *Config) (*config.Config, error) {
	if cfg.Model.Init == nil {
		c, err := config.Load(cfg.Model.ModelNameOrPath)
		if err != nil {
			return nil, fmt.Errorf("train: model_name_or_path: %w", err)
		}
		return c, nil
	}
	tok, err := tokenizer.FromDir(cfg.Model.TokenizerNameOrPath)
	if err != nil {
		return nil, fmt.Errorf("train: %w", err)
	}
	return InitModelConfig(cfg.Model.Init, tok.VocabSize())
}

// EstimateMemory computes the memory estimate of a run of cfg on the model mc.
func EstimateMemory(cfg *Config, mc *config.Config) (MemoryEstimate, error) {
	a, err := models.ArchFromConfig(mc)
	if err != nil {
		return MemoryEstimate{}, err
	}
	var e MemoryEstimate
	C, I, V, L := int64(a.Hidden), int64(a.Intermediate), int64(a.Vocab), int64(a.Layers)
	q, kv := int64(a.Heads*a.HeadDim), int64(a.KVHeads*a.HeadDim)
	e.Params = a.NumParameters()
	el := int64(4)
	if cfg.Run.BF16 {
		el = 2
	}
	e.ParamBytes, e.GradBytes = e.Params*el, e.Params*el
	switch {
	case bf16Optim(cfg.Optim.Optim):
		e.OptimBytes = e.Params * 4
	case cfg.Run.BF16:
		e.OptimBytes = e.Params * 12
	default:
		e.OptimBytes = e.Params * 8
	}
	T := int64(cfg.Batch.PerDeviceTrainBatchSize * cfg.Batch.MaxLength)
	e.Tokens = int(T)
	// Kept per layer: input, two norm outputs, q, k, v, attention output, gate, up, SwiGLU
	// output (dtype), plus fp32 rstd and attention log-sum-exp rows.
	layerAct := T*(4*C+2*q+2*kv+3*I)*el + T*4*(2+int64(a.Heads))
	if cfg.Run.GradientCheckpointing {
		e.ActBytes = L*T*C*el + layerAct
	} else {
		e.ActBytes = L * layerAct
	}
	e.ActBytes += T * C * el // final hidden state
	chunk := min(T, 1024)
	e.LogitsBytes = chunk * V * 4 * 2
	return e, nil
}
