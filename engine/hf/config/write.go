package config

import (
	"fmt"
	"os"
	"path/filepath"
)

// MarshalJSON returns config.json as transformers 5.17 save_pretrained writes it for the family:
// the family's keys, model_type, transformers_version (WriterVersion), architectures and dtype
// when set, rope_parameters, the keys kept from the source, sorted, with a two-space indent and
// Python's number and string formatting, ending in a newline. It validates c first.
func (c *Config) MarshalJSON() ([]byte, error) {
	if err := c.Validate(); err != nil {
		return nil, err
	}
	obj, err := c.toPy()
	if err != nil {
		return nil, fmt.Errorf("config: %s: %w", c.ModelType, err)
	}
	return encodePy(obj)
}

// Write writes config.json to path; when path is an existing directory, to path/config.json.
// The file is written to a temporary name in the same directory and renamed into place.
func (c *Config) Write(path string) error {
	if st, err := os.Stat(path); err == nil && st.IsDir() {
		path = filepath.Join(path, FileName)
	}
	data, err := c.MarshalJSON()
	if err != nil {
		return err
	}
	tmp, err := os.CreateTemp(filepath.Dir(path), ".config-*.json")
	if err != nil {
		return fmt.Errorf("config: write %s: %w", path, err)
	}
	defer os.Remove(tmp.Name())
	if _, err := tmp.Write(data); err != nil {
		tmp.Close()
		return fmt.Errorf("config: write %s: %w", path, err)
	}
	if err := tmp.Chmod(0o644); err != nil {
		tmp.Close()
		return fmt.Errorf("config: write %s: %w", path, err)
	}
	if err := tmp.Close(); err != nil {
		return fmt.Errorf("config: write %s: %w", path, err)
	}
	if err := os.Rename(tmp.Name(), path); err != nil {
		return fmt.Errorf("config: write %s: %w", path, err)
	}
	return nil
}

func (c *Config) toPy() (pyObject, error) {
	f := c.Family()
	out := pyObject{}
	// Keys kept from the source go in first so that the typed values below win.
	for _, kv := range c.extra {
		v, err := decodePy(kv.Value)
		if err != nil {
			return nil, fmt.Errorf("key %q: %w", kv.Key, err)
		}
		out[kv.Key] = v
	}
	out["model_type"] = c.ModelType
	out["transformers_version"] = WriterVersion
	if c.Architectures != nil {
		archs := make([]pyValue, len(c.Architectures))
		for i, a := range c.Architectures {
			archs[i] = a
		}
		out["architectures"] = archs
	}
	if c.DType != "" {
		out["dtype"] = c.DType
	}
	for _, k := range f.Keys {
		out[k] = c.fieldValue(k)
	}
	for _, k := range f.Optional {
		// A head_dim other than hidden_size / num_attention_heads is written even when derived;
		// latent attention's head_dim (the rotary width) only when the file gave it.
		if c.src[k] || (k == "head_dim" && !c.IsLatent() && c.HeadDim != c.HiddenSize/c.NumAttentionHeads) {
			out[k] = c.fieldValue(k)
		}
	}
	if f.WriteExtra != nil {
		f.WriteExtra(c, out)
	}
	if f.SlidingWindowZero && c.SlidingWindow == 0 {
		out["sliding_window"] = intValue(0)
	}
	if f.HeadDimNullWhenDerived && (!c.src["head_dim"] || c.src["null:head_dim"]) && c.HeadDim == c.HiddenSize/c.NumAttentionHeads {
		out["head_dim"] = nil
	}
	if f.RopePerLayerType {
		fullKey, slidingKey := f.ropeKeys()
		full, err := c.Rope.toPy(c.intLit, "rope_parameters."+fullKey)
		if err != nil {
			return nil, err
		}
		sliding, err := c.SlidingRope.toPy(c.intLit, "rope_parameters."+slidingKey)
		if err != nil {
			return nil, err
		}
		out["rope_parameters"] = pyObject{fullKey: full, slidingKey: sliding}
		return out, nil
	}
	rope, err := c.Rope.toPy(c.intLit, "rope_parameters")
	if err != nil {
		return nil, err
	}
	out["rope_parameters"] = rope
	return out, nil
}

// toPy writes one rope dictionary; prefix is its output path, for the integer-literal record.
func (r *Rope) toPy(intLit map[string]bool, prefix string) (pyObject, error) {
	out := pyObject{}
	for _, kv := range r.extra {
		v, err := decodePy(kv.Value)
		if err != nil {
			return nil, fmt.Errorf("key \"%s.%s\": %w", prefix, kv.Key, err)
		}
		out[kv.Key] = v
	}
	out["rope_type"] = r.Type
	out["rope_theta"] = floatValue(r.Theta, intLit[prefix+".rope_theta"])
	if r.legacyType != "" {
		out["type"] = r.Type // transformers keeps the 4.x key; it follows rope_type
	}
	for _, k := range []string{"factor", "low_freq_factor", "high_freq_factor", "beta_fast", "beta_slow",
		"attention_factor", "mscale", "mscale_all_dim", "partial_rotary_factor"} {
		if v := *r.floatPtr(k); v != 0 || r.src[k] {
			out[k] = floatValue(v, intLit[prefix+"."+k])
		}
	}
	if r.OriginalMaxPositionEmbeddings != 0 || r.src["original_max_position_embeddings"] {
		out["original_max_position_embeddings"] = intValue(r.OriginalMaxPositionEmbeddings)
	}
	if r.Truncate != nil {
		out["truncate"] = *r.Truncate
	}
	for k, l := range map[string][]float64{"short_factor": r.ShortFactor, "long_factor": r.LongFactor} {
		if l != nil || r.src[k] {
			vs := make([]pyValue, len(l))
			for i, v := range l {
				vs[i] = v
			}
			out[k] = vs
		}
	}
	return out, nil
}

// UnmarshalJSON parses config.json into c (see Parse), so a Config can sit inside other JSON
// documents; errors name the source as "json".
func (c *Config) UnmarshalJSON(data []byte) error {
	n, err := Parse(data, "json")
	if err != nil {
		return err
	}
	*c = *n
	return nil
}
