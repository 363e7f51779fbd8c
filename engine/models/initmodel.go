package models

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/halo-shell/halo-shell/engine/backend"
	"github.com/halo-shell/halo-shell/engine/hf/config"
	"github.com/halo-shell/halo-shell/engine/hf/tokenizer"
	"github.com/halo-shell/halo-shell/engine/tensor"
)

// TokenizerFiles are the files of a Hugging Face tokenizer directory that InitCheckpoint copies
// next to a new model, when present.
var TokenizerFiles = []string{
	"tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "chat_template.jinja",
	"chat_template.json", "vocab.json", "merges.txt", "added_tokens.json", "generation_config.json",
}

// InitSpec describes a randomly initialised checkpoint.
type InitSpec struct {
	// Arch is the model_type (llama, mistral, qwen2, qwen3, ...).
	Arch string
	// Preset is a config preset of that family ("tiny", "qwen3-0.6b", ...).
	Preset string
	// TokenizerDir holds tokenizer.json (and usually tokenizer_config.json); vocab_size is set
	// to the tokenizer's size and the tokenizer files are copied into OutDir. Empty: keep the
	// preset's vocabulary and copy nothing.
	TokenizerDir string
	// OutDir receives config.json, the safetensors weights and the tokenizer files.
	OutDir string
	// Seed of the random initialisation.
	Seed uint64
	// Set are config.json overrides "key=value", applied last; value is JSON (numbers, true,
	// null, objects) or else a plain string.
	Set []string
	// DType of the stored weights (default F32).
	DType tensor.DType
}

// InitCheckpoint writes a random-init Hugging Face checkpoint built from a preset, sized to a
// tokenizer, initialised as transformers does. It returns the config written.
func InitCheckpoint(b backend.Backend, s InitSpec) (*config.Config, error) {
	if s.OutDir == "" {
		return nil, errors.New("models: init: an output directory is required")
	}
	cfg, err := config.Preset(s.Arch, s.Preset)
	if err != nil {
		return nil, err
	}
	var tok *tokenizer.Tokenizer
	if s.TokenizerDir != "" {
		if tok, err = tokenizer.FromDir(s.TokenizerDir); err != nil {
			return nil, err
		}
		cfg.VocabSize = tok.VocabSize()
		setSpecialIDs(cfg, tok, s.TokenizerDir)
	}
	if cfg, err = ApplyOverrides(cfg, s.Set); err != nil {
		return nil, err
	}
	if tok != nil && cfg.VocabSize < tok.VocabSize() {
		return nil, fmt.Errorf("models: init: vocab_size %d is smaller than the tokenizer's %d tokens", cfg.VocabSize, tok.VocabSize())
	}
	dt := s.DType
	if dt == tensor.Invalid {
		dt = tensor.F32
	}
	m, err := New(cfg, b, Options{DType: dt})
	if err != nil {
		return nil, err
	}
	defer m.Close()
	if err := m.InitRandom(s.Seed); err != nil {
		return nil, err
	}
	if err := m.Save(s.OutDir, SaveOptions{}); err != nil {
		return nil, err
	}
	if s.TokenizerDir != "" {
		for _, name := range TokenizerFiles {
			if err := copyIfExists(filepath.Join(s.TokenizerDir, name), filepath.Join(s.OutDir, name)); err != nil {
				return nil, err
			}
		}
	}
	return m.Config(), nil
}

// setSpecialIDs sets bos/eos/pad token ids from tokenizer_config.json's token strings when the
// tokenizer knows them.
func setSpecialIDs(cfg *config.Config, tok *tokenizer.Tokenizer, dir string) {
	raw, err := os.ReadFile(filepath.Join(dir, "tokenizer_config.json"))
	if err != nil {
		return
	}
	var tc map[string]json.RawMessage
	if json.Unmarshal(raw, &tc) != nil {
		return
	}
	id := func(key string) (int, bool) {
		var s string
		if json.Unmarshal(tc[key], &s) == nil && s != "" {
			return tok.TokenToID(s)
		}
		var obj struct{ Content string }
		if json.Unmarshal(tc[key], &obj) == nil && obj.Content != "" {
			return tok.TokenToID(obj.Content)
		}
		return 0, false
	}
	if v, ok := id("bos_token"); ok {
		cfg.BOSTokenID = config.IntPtr(v)
	}
	if v, ok := id("eos_token"); ok {
		cfg.EOSTokenIDs = []int{v}
	}
	if v, ok := id("pad_token"); ok {
		cfg.PadTokenID = config.IntPtr(v)
	}
}

// ApplyOverrides returns cfg with "key=value" settings applied through config.json, so every
// override is validated exactly as a file would be (unknown keys are kept, as transformers
// does).
func ApplyOverrides(cfg *config.Config, sets []string) (*config.Config, error) {
	if len(sets) == 0 {
		return cfg, nil
	}
	data, err := cfg.MarshalJSON()
	if err != nil {
		return nil, err
	}
	var obj map[string]json.RawMessage
	if err := json.Unmarshal(data, &obj); err != nil {
		return nil, err
	}
	if f := cfg.Family(); f != nil && len(f.Consumed) > 0 {
		// An edit of a key transformers folds into another (gemma4_text's global_head_dim
		// into per_layer_config) replaces the folded key with the unfolded ones.
		for _, kv := range sets {
			k, _, _ := strings.Cut(kv, "=")
			if !slices.Contains(f.Consumed, strings.TrimSpace(k)) {
				continue
			}
			flat, folded := cfg.UnfoldConsumed()
			delete(obj, folded)
			for fk, fv := range flat {
				raw, _ := json.Marshal(fv)
				obj[fk] = raw
			}
			break
		}
	}
	setKeys := map[string]bool{}
	for _, kv := range sets {
		k, v, ok := strings.Cut(kv, "=")
		k = strings.TrimSpace(k)
		if !ok || k == "" {
			return nil, fmt.Errorf("models: --set %q: want key=value, e.g. num_hidden_layers=4", kv)
		}
		raw := json.RawMessage(v)
		if !json.Valid(raw) {
			raw, _ = json.Marshal(v)
		}
		// An override by another name of a field (num_experts for num_local_experts) replaces
		// the written key rather than colliding with it.
		if f := cfg.Family(); f != nil {
			for _, syn := range f.Synonyms(k) {
				if setKeys[syn] {
					return nil, fmt.Errorf("models: --set %s and --set %s name the same field; keep one", syn, k)
				}
				delete(obj, syn)
			}
		}
		obj[k] = raw
		setKeys[k] = true
	}
	// layer_types is derived from these keys; drop the written one so it is derived again
	// unless it was set explicitly.
	if !setKeys["layer_types"] && (setKeys["num_hidden_layers"] || setKeys["sliding_window"] ||
		setKeys["use_sliding_window"] || setKeys["max_window_layers"] || setKeys["sliding_window_pattern"]) {
		delete(obj, "layer_types")
	}
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	if err := enc.Encode(obj); err != nil {
		return nil, err
	}
	out, err := config.Parse(buf.Bytes(), "--set overrides")
	if err != nil {
		return nil, err
	}
	return out, nil
}

func copyIfExists(src, dst string) error {
	in, err := os.Open(src)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("models: copy tokenizer file: %w", err)
	}
	defer in.Close()
	out, err := os.Create(dst)
	if err != nil {
		return fmt.Errorf("models: copy tokenizer file: %w", err)
	}
	if _, err := io.Copy(out, in); err != nil {
		out.Close()
		return fmt.Errorf("models: copy %s: %w", src, err)
	}
	return out.Close()
}
