package models

import (
	"fmt"

	"github.com/halo-shell/halo-shell/engine/nn"
	"github.com/halo-shell/halo-shell/engine/tensor"
	"sort"
	"strings"
	"sync"
)

// Family declares one Hugging Face model family: its names, what it supports, and the few
// places where it differs from the Llama-style dense decoder. Each family lives in its own file
// and registers itself in init.
type Family struct {
	// ModelType is config.json's model_type ("llama", "qwen3", ...).
	ModelType string
	// Architectures are the HF class names that load this family; the first one is written to
	// config.json by Save.
	Architectures []string
	// Caps lists what the family supports; used to refuse configurations early.
	Caps Caps
	// Tune adjusts the architecture derived from config.json for what this family does
	// differently (biases, q/k norm, sliding windows). Nil when nothing differs.
	Tune func(a *Arch) error
	// FFN replaces the dense SwiGLU MLP of some layers (mixture-of-experts families). Nil means
	// every layer is dense.
	FFN FFNHooks
}

// FFNHooks let a family give a layer its own feed-forward block. Both hooks are called for
// every layer; returning nil specs (Specs) and a nil block (Build) keeps the dense MLP.
type FFNHooks interface {
	// Specs lists layer i's feed-forward parameters (HF names), or nil for the dense MLP.
	Specs(a *Arch, i int) []ParamSpec
	// Build makes layer i's block from parameter and gradient views looked up by HF name
	// (a gradient lookup yields the zero tensor before gradients exist).
	Build(a *Arch, i int, param, grad func(name string) tensor.Tensor) nn.FFN
}

// Caps are the capabilities of a family. A false capability makes New refuse a config that
// needs it, with Reason naming why.
type Caps struct {
	// SlidingWindow: the family honours sliding_window / layer_types.
	SlidingWindow bool
	// TiedEmbeddings: lm_head may share the embedding matrix.
	TiedEmbeddings bool
	// Reason explains the family's limits in refusals (optional).
	Reason string
}

var (
	registryMu sync.RWMutex
	registry   = map[string]*Family{}
)

// Register adds a family; it panics on a duplicate model_type, which is a programming error in
// this package's init functions.
func Register(f *Family) {
	registryMu.Lock()
	defer registryMu.Unlock()
	if f.ModelType == "" || len(f.Architectures) == 0 {
		panic("models: Register: family needs ModelType and Architectures")
	}
	if _, dup := registry[f.ModelType]; dup {
		panic("models: Register: duplicate model_type " + f.ModelType)
	}
	registry[f.ModelType] = f
}

// Lookup returns the family registered for model_type, or an error listing the supported ones.
func Lookup(modelType string) (*Family, error) {
	registryMu.RLock()
	f, ok := registry[modelType]
	registryMu.RUnlock()
	if !ok {
		return nil, fmt.Errorf("models: model_type %q is not supported; supported: %s",
			modelType, strings.Join(Families(), ", "))
	}
	return f, nil
}

// Families lists the registered model_type names, sorted.
func Families() []string {
	registryMu.RLock()
	defer registryMu.RUnlock()
	names := make([]string, 0, len(registry))
	for n := range registry {
		names = append(names, n)
	}
	sort.Strings(names)
	return names
}
