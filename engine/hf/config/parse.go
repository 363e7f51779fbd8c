package config

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"unicode/utf8"
)

// MaxFileSize bounds the size of a config.json this package reads (real ones are a few KiB).
const MaxFileSize = 16 << 20

// FileName is the name of the config file inside a checkpoint directory.
const FileName = "config.json"

// baseDefaults are transformers' PreTrainedConfig attributes that any config.json may carry;
// they are written back only when they differ from these defaults, as save_pretrained does.
var baseDefaults = map[string]string{
	"output_hidden_states":    "false",
	"output_attentions":       "false",
	"return_dict":             "true",
	"chunk_size_feed_forward": "0",
	"is_encoder_decoder":      "false",
	"problem_type":            "null",
	"id2label":                `{"0":"LABEL_0","1":"LABEL_1"}`,
	"label2id":                `{"LABEL_0":0,"LABEL_1":1}`,
}

// droppedKeys are keys transformers consumes on load and never writes back.
var droppedKeys = map[string]bool{"_name_or_path": true, "name_or_path": true, "_commit_hash": true}

// generationParams are GenerationConfig's parameters (transformers 5.17): transformers drops
// them from a model config on load (they belong in generation_config.json) unless the family
// has a field of that name (use_cache).
var generationParams = map[string]bool{
	"assistant_confidence_threshold": true, "assistant_lookbehind": true, "bad_words_ids": true,
	"begin_suppress_tokens": true, "diversity_penalty": true, "do_sample": true, "early_stopping": true,
	"encoder_no_repeat_ngram_size": true, "encoder_repetition_penalty": true, "epsilon_cutoff": true,
	"eta_cutoff": true, "exponential_decay_length_penalty": true, "forced_bos_token_id": true,
	"forced_eos_token_id": true, "length_penalty": true, "max_length": true, "min_length": true,
	"no_repeat_ngram_size": true, "num_assistant_tokens": true, "num_assistant_tokens_schedule": true,
	"num_beam_groups": true, "num_beams": true, "num_return_sequences": true, "output_scores": true,
	"remove_invalid_values": true, "repetition_penalty": true, "return_dict_in_generate": true,
	"suppress_tokens": true, "target_lookbehind": true, "temperature": true, "top_k": true, "top_p": true,
	"typical_p": true, "use_cache": true,
}

// Load reads config.json from a file, or from a directory containing one.
func Load(pathOrDir string) (*Config, error) {
	path := pathOrDir
	if st, err := os.Stat(path); err == nil && st.IsDir() {
		path = filepath.Join(path, FileName)
	}
	if st, err := os.Stat(path); err == nil && !st.Mode().IsRegular() {
		// Opening a named pipe would wait for a writer; a device never ends.
		return nil, fmt.Errorf("config: %s is not a regular file (%v)", path, st.Mode().Type())
	}
	f, err := os.Open(path)
	if errors.Is(err, fs.ErrNotExist) {
		if _, derr := os.Stat(filepath.Dir(path)); path != pathOrDir && derr == nil {
			return nil, fmt.Errorf("config: %s has no %s (a Hugging Face model directory holds one)", pathOrDir, FileName)
		}
		return nil, fmt.Errorf("config: %s does not exist (give a model directory or its %s)", pathOrDir, FileName)
	}
	if err != nil {
		return nil, fmt.Errorf("config: %w", err)
	}
	defer f.Close()
	data, err := io.ReadAll(io.LimitReader(f, MaxFileSize+1))
	if err != nil {
		return nil, fmt.Errorf("config: %s: %w", path, err)
	}
	if len(data) > MaxFileSize {
		return nil, fmt.Errorf("config: %s: larger than %d bytes; this is not a config.json", path, MaxFileSize)
	}
	return Parse(data, path)
}

// Parse reads a config.json. source names the input in errors (a path, or e.g. "<stdin>").
// The result has every default and derived value resolved and has passed Validate.
func Parse(data []byte, source string) (*Config, error) {
	c, err := parse(data)
	if err != nil {
		return nil, fmt.Errorf("config: %s: %w", source, err)
	}
	return c, nil
}

func parse(data []byte) (*Config, error) {
	if len(data) > MaxFileSize {
		return nil, fmt.Errorf("larger than %d bytes; this is not a config.json", MaxFileSize)
	}
	if !utf8.Valid(data) {
		i := 0
		for i < len(data) {
			r, n := utf8.DecodeRune(data[i:])
			if r == utf8.RuneError && n <= 1 {
				break
			}
			i += n
		}
		return nil, fmt.Errorf("invalid UTF-8 at byte %d: config.json must be UTF-8 text", i)
	}
	kvs, err := topLevel(data)
	if err != nil {
		return nil, err
	}
	byKey := make(map[string][]byte, len(kvs))
	for _, kv := range kvs {
		byKey[kv.Key] = kv.Value
	}

	f, err := familyOf(byKey)
	if err != nil {
		return nil, err
	}
	c := newDefaults(f)
	c.src = map[string]bool{}
	c.intLit = map[string]bool{}

	var ropeScaling, ropeParams, ropeTheta, topPartial, localTheta []byte
	for _, kv := range kvs {
		key, raw := kv.Key, kv.Value
		switch key {
		case "model_type":
			continue // read by familyOf
		case "architectures":
			if isNull(raw) {
				c.Architectures = nil
			} else if c.Architectures, err = decodeStringList(key, raw); err != nil {
				return nil, err
			}
			continue
		case "transformers_version":
			if !isNull(raw) {
				if c.TransformersVersion, err = decodeString(key, raw); err != nil {
					return nil, err
				}
			}
			continue
		case "dtype", "torch_dtype":
			if isNull(raw) {
				continue
			}
			s, err := decodeString(key, raw)
			if err != nil {
				return nil, err
			}
			// dtype wins over torch_dtype when both are present, as in transformers.
			if key == "dtype" || byKey["dtype"] == nil || isNull(byKey["dtype"]) {
				c.DType = s
			}
			continue
		case "rope_scaling":
			if !isNull(raw) {
				ropeScaling = raw
			}
			continue
		case "rope_parameters":
			if !isNull(raw) {
				ropeParams = raw
			}
			continue
		case "rope_theta":
			if !isNull(raw) {
				ropeTheta = raw
			}
			continue
		case "rope_local_base_freq":
			if key == f.SlidingRopeThetaKey {
				// 4.x files: the sliding layers' rope_theta (transformers consumes the key).
				if !isNull(raw) {
					localTheta = raw
				}
				continue
			}
		case "partial_rotary_factor":
			// transformers copies it into rope_parameters and also keeps the attribute.
			if !isNull(raw) {
				topPartial = raw
			}
			c.extra = append(c.extra, rawKey{Key: key, Value: raw, understood: true})
			continue
		}
		if droppedKeys[key] {
			continue
		}
		if def, ok := baseDefaults[key]; ok {
			if !jsonEqual(raw, []byte(def)) {
				c.extra = append(c.extra, rawKey{Key: key, Value: raw, understood: true})
			}
			continue
		}
		if slices.Contains(f.Kept, key) {
			c.extra = append(c.extra, rawKey{Key: key, Value: raw, understood: true})
			continue
		}
		canon, ok := f.knows(key)
		if !ok {
			if generationParams[key] {
				c.dropped = append(c.dropped, key)
				continue
			}
			c.extra = append(c.extra, rawKey{Key: key, Value: raw})
			continue
		}
		if c.src[canon] {
			return nil, fmt.Errorf("keys %q and %q both set %s; keep one", key, otherKey(f, canon, key), canon)
		}
		fl, _ := f.field(canon)
		if err := c.setField(key, fl, raw); err != nil {
			return nil, err
		}
		if key != canon {
			c.intLit[canon] = c.intLit[key]
			delete(c.intLit, key)
		}
		c.src[canon] = true
		if isNull(raw) {
			c.src["null:"+canon] = true
		}
	}
	c.layerTypesFromFile = c.LayerTypes != nil
	for _, kv := range c.extra {
		if _, err := decodePy(kv.Value); err != nil {
			return nil, fmt.Errorf("key %q: %v", kv.Key, err)
		}
	}
	if err := c.readRope(ropeScaling, ropeParams, ropeTheta, topPartial, localTheta); err != nil {
		return nil, err
	}
	if err := c.resolve(); err != nil {
		return nil, err
	}
	if err := c.validate(); err != nil {
		return nil, err
	}
	return c, nil
}

// otherKey names the key that set canon before key did (the alias or the canonical name).
func otherKey(f *Family, canon, key string) string {
	if key != canon {
		return canon
	}
	for a, k := range f.Aliases {
		if k == canon {
			return a
		}
	}
	return canon
}

// topLevel splits a JSON object into its entries, in order, refusing duplicates.
func topLevel(data []byte) ([]rawKey, error) {
	dec := json.NewDecoder(bytes.NewReader(data))
	tok, err := dec.Token()
	if err != nil {
		return nil, fmt.Errorf("not valid JSON: %v", syntaxPos(err, dec))
	}
	if d, ok := tok.(json.Delim); !ok || d != '{' {
		return nil, fmt.Errorf("expected a JSON object at the top level, got %v", describeToken(tok))
	}
	var kvs []rawKey
	seen := map[string]bool{}
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			return nil, fmt.Errorf("not valid JSON: %v", syntaxPos(err, dec))
		}
		key, ok := tok.(string)
		if !ok {
			return nil, fmt.Errorf("not valid JSON: expected a key at byte %d", dec.InputOffset())
		}
		var raw json.RawMessage
		if err := dec.Decode(&raw); err != nil {
			return nil, fmt.Errorf("key %q: not valid JSON: %v", key, syntaxPos(err, dec))
		}
		if seen[key] {
			return nil, fmt.Errorf("key %q appears twice; keep one", key)
		}
		seen[key] = true
		kvs = append(kvs, rawKey{Key: key, Value: raw})
	}
	if _, err := dec.Token(); err != nil {
		return nil, fmt.Errorf("not valid JSON: %v", syntaxPos(err, dec))
	}
	if _, err := dec.Token(); err != io.EOF {
		return nil, fmt.Errorf("not valid JSON: unexpected data after the top-level object at byte %d", dec.InputOffset())
	}
	return kvs, nil
}

func syntaxPos(err error, dec *json.Decoder) string {
	var se *json.SyntaxError
	if errors.As(err, &se) {
		return fmt.Sprintf("%v (at byte %d)", se, se.Offset)
	}
	if err == io.EOF || err == io.ErrUnexpectedEOF {
		return fmt.Sprintf("unexpected end of input at byte %d", dec.InputOffset())
	}
	return err.Error()
}

func describeToken(tok json.Token) string {
	switch t := tok.(type) {
	case json.Delim:
		if t == '[' {
			return "an array"
		}
		return string(t)
	case string:
		return "a string"
	case nil:
		return "null"
	case bool:
		return "a boolean"
	default:
		return "a number"
	}
}

func jsonEqual(a, b []byte) bool {
	va, err1 := decodePy(a)
	vb, err2 := decodePy(b)
	if err1 != nil || err2 != nil {
		return false
	}
	ea, err1 := encodePy(va)
	eb, err2 := encodePy(vb)
	return err1 == nil && err2 == nil && bytes.Equal(ea, eb)
}

// familyOf finds the family from model_type, or from architectures when model_type is absent.
func familyOf(byKey map[string][]byte) (*Family, error) {
	if raw, ok := byKey["model_type"]; ok {
		mt, err := decodeString("model_type", raw)
		if err != nil {
			return nil, err
		}
		f, err := Lookup(mt)
		if err != nil {
			return nil, err
		}
		return f, nil
	}
	if raw, ok := byKey["architectures"]; ok && !isNull(raw) {
		archs, err := decodeStringList("architectures", raw)
		if err != nil {
			return nil, err
		}
		for _, a := range archs {
			if f := familyForArchitecture(a); f != nil {
				return f, nil
			}
		}
	}
	return nil, fmt.Errorf("model_type is missing: add \"model_type\" (one of %s)", strings.Join(Families(), ", "))
}

// ropeKinds are the rope_parameters keys this package reads.
var ropeKinds = map[string]kind{
	"rope_type": kString, "type": kString, "rope_theta": kFloat, "factor": kFloat,
	"original_max_position_embeddings": kInt, "low_freq_factor": kFloat, "high_freq_factor": kFloat,
	"beta_fast": kFloat, "beta_slow": kFloat, "attention_factor": kFloat, "mscale": kFloat,
	"mscale_all_dim": kFloat, "truncate": kBool, "short_factor": kFloat, "long_factor": kFloat,
	"partial_rotary_factor": kFloat,
}

// readRope builds Rope the way transformers 5.17 standardises it: rope_scaling (4.x) wins over
// rope_parameters (5.x); rope_theta comes from the dictionary, else the top-level rope_theta,
// else the family default; the type from rope_type, else the legacy "type", else "default".
//
// For a family with RopePerLayerType, rope_parameters holds one dictionary per layer type:
// full_attention into Rope, sliding_attention into SlidingRope. A 4.x file's rope_scaling
// updates the full-attention parameters, its rope_theta is theirs and rope_local_base_freq
// (localTheta) is the sliding layers' theta.
func (c *Config) readRope(scaling, params, topTheta, topPartial, localTheta []byte) error {
	r := &c.Rope
	r.src = map[string]bool{}
	perType := c.family != nil && c.family.RopePerLayerType
	fullKey, slidingKey := c.family.ropeKeys()
	if perType {
		c.SlidingRope.src = map[string]bool{}
	}
	name := "rope_parameters"
	raw := params
	if scaling != nil {
		name, raw = "rope_scaling", scaling
	}
	if raw != nil {
		kvs, err := ropeDict(name, raw)
		if err != nil {
			return err
		}
		nested := false
		for _, kv := range kvs {
			if kv.Key == fullKey || kv.Key == slidingKey {
				nested = true
			}
		}
		switch {
		case nested && !perType:
			return fmt.Errorf("key %q: per-layer-type rope parameters (%q) are not supported for model_type %s; give one set of parameters", name, fullKey, c.ModelType)
		case nested:
			for _, kv := range kvs {
				target, prefix := r, "rope_parameters."+fullKey
				switch kv.Key {
				case fullKey:
				case slidingKey:
					target, prefix = &c.SlidingRope, "rope_parameters."+slidingKey
				default:
					return fmt.Errorf("key %q: %q is not a layer type; model_type %s gives one dictionary per layer type (%q, %q)",
						name, kv.Key, c.ModelType, fullKey, slidingKey)
				}
				if isNull(kv.Value) {
					continue
				}
				sub, err := ropeDict(name+"."+kv.Key, kv.Value)
				if err != nil {
					return err
				}
				for _, e := range sub {
					if err := c.setRopeKey(target, prefix, name+"."+kv.Key, e.Key, e.Value); err != nil {
						return err
					}
				}
			}
		case perType && name == "rope_parameters":
			return fmt.Errorf("key \"rope_parameters\": model_type %s gives one dictionary per layer type: {%q: {...}, %q: {...}}", c.ModelType, fullKey, slidingKey)
		default:
			prefix := "rope_parameters"
			if perType {
				prefix += "." + fullKey
			}
			for _, kv := range kvs {
				if err := c.setRopeKey(r, prefix, name, kv.Key, kv.Value); err != nil {
					return err
				}
			}
		}
	}
	fullPrefix := "rope_parameters"
	if perType {
		fullPrefix += "." + fullKey
	}
	if !r.src["rope_theta"] && topTheta != nil {
		if err := c.setRopeKey(r, fullPrefix, "", "rope_theta", topTheta); err != nil {
			return err
		}
	}
	if perType && !c.SlidingRope.src["rope_theta"] && localTheta != nil {
		if err := c.setRopeKey(&c.SlidingRope, "rope_parameters."+slidingKey, "", "rope_theta", localTheta); err != nil {
			return fmt.Errorf("rope_local_base_freq: %w", err)
		}
	}
	if !r.src["partial_rotary_factor"] && topPartial != nil {
		v, _, err := decodeFloat("partial_rotary_factor", topPartial)
		if err != nil {
			return err
		}
		r.PartialRotaryFactor = v
		r.src["partial_rotary_factor"] = true
		c.intLit[fullPrefix+".partial_rotary_factor"] = isIntLiteral(string(bytes.TrimSpace(topPartial)))
	}
	if r.Type == "" {
		r.Type = "default"
	}
	if perType && c.SlidingRope.Type == "" {
		c.SlidingRope.Type = "default"
	}
	return nil
}

// ropeDict splits a rope dictionary (name is its key, for errors) into its entries.
func ropeDict(name string, raw []byte) ([]rawKey, error) {
	t := bytes.TrimSpace(raw)
	if len(t) == 0 || t[0] != '{' {
		return nil, typeError(name, "an object (or null)", raw)
	}
	kvs, err := topLevel(t)
	if err != nil {
		return nil, fmt.Errorf("key %q: %w", name, err)
	}
	return kvs, nil
}

// setRopeKey sets one rope parameter on r. prefix is the output path of r's dictionary
// ("rope_parameters", or "rope_parameters.<layer type>"), for the integer-literal record;
// dict names the source dictionary in errors ("" for a top-level key).
func (c *Config) setRopeKey(r *Rope, prefix, dict, key string, raw []byte) error {
	k, ok := ropeKinds[key]
	name := key
	if dict != "" {
		name = dict + "." + key
	}
	if !ok {
		if _, err := decodePy(raw); err != nil {
			return fmt.Errorf("key %q: %v", name, err)
		}
		kept := c.family != nil && slices.Contains(c.family.RopeKept, key)
		r.extra = append(r.extra, rawKey{Key: key, Value: raw, understood: kept})
		return nil
	}
	if isNull(raw) {
		return nil // transformers treats a null entry as absent
	}
	switch k {
	case kString:
		s, err := decodeString(name, raw)
		if err != nil {
			return err
		}
		if key == "type" {
			r.legacyType = s
			if !r.src["rope_type"] {
				r.Type = s
			}
		} else {
			r.Type = s
		}
	case kInt:
		v, err := decodeInt(name, raw)
		if err != nil {
			return err
		}
		r.OriginalMaxPositionEmbeddings = v
	case kBool:
		v, err := decodeBool(name, raw)
		if err != nil {
			return err
		}
		r.Truncate = &v
	case kFloat:
		if key == "short_factor" || key == "long_factor" {
			l, err := decodeFloatList(name, raw)
			if err != nil {
				return err
			}
			if key == "short_factor" {
				r.ShortFactor = l
			} else {
				r.LongFactor = l
			}
			break
		}
		v, isInt, err := decodeFloat(name, raw)
		if err != nil {
			return err
		}
		*r.floatPtr(key) = v
		c.intLit[prefix+"."+key] = isInt
	}
	r.src[key] = true
	return nil
}

func (r *Rope) floatPtr(key string) *float64 {
	switch key {
	case "rope_theta":
		return &r.Theta
	case "factor":
		return &r.Factor
	case "low_freq_factor":
		return &r.LowFreqFactor
	case "high_freq_factor":
		return &r.HighFreqFactor
	case "beta_fast":
		return &r.BetaFast
	case "beta_slow":
		return &r.BetaSlow
	case "attention_factor":
		return &r.AttentionFactor
	case "mscale":
		return &r.MScale
	case "mscale_all_dim":
		return &r.MScaleAllDim
	case "partial_rotary_factor":
		return &r.PartialRotaryFactor
	}
	panic("config: internal error: no rope float " + key)
}

// maxLayers bounds num_hidden_layers before anything per layer is allocated.
const maxLayers = 1 << 16

// resolve fills derived values, as transformers' __post_init__ does.
func (c *Config) resolve() error {
	f := c.Family()
	if f == nil {
		_, err := Lookup(c.ModelType)
		return err
	}
	c.family = f
	if c.NumHiddenLayers < 0 || c.NumHiddenLayers > maxLayers {
		return fmt.Errorf("num_hidden_layers (%d) must be between 1 and %d", c.NumHiddenLayers, maxLayers)
	}
	if c.NumKeyValueHeads == 0 {
		c.NumKeyValueHeads = c.NumAttentionHeads
	}
	if c.HeadDim == 0 {
		if c.NumAttentionHeads <= 0 {
			return fmt.Errorf("num_attention_heads (%d) must be positive", c.NumAttentionHeads)
		}
		if c.HiddenSize%c.NumAttentionHeads != 0 && !f.HeadDimFloor {
			return fmt.Errorf("hidden_size (%d) is not a multiple of num_attention_heads (%d) and head_dim is not set: set head_dim, or make hidden_size a multiple of %d",
				c.HiddenSize, c.NumAttentionHeads, c.NumAttentionHeads)
		}
		c.HeadDim = c.HiddenSize / c.NumAttentionHeads
	}
	if f.Resolve != nil {
		f.Resolve(c)
	}
	for _, r := range []*Rope{&c.Rope, &c.SlidingRope} {
		switch r.Type {
		case "llama3", "yarn", "longrope":
			if r.OriginalMaxPositionEmbeddings == 0 {
				r.OriginalMaxPositionEmbeddings = c.MaxPositionEmbeddings
			}
		}
	}
	return nil
}

// deriveLayerTypes is qwen2/qwen3's rule: sliding attention for layers at or past
// max_window_layers when a sliding window is in use. A list this function derived earlier
// follows later changes of the fields it depends on, and so does a list read from the file
// that is exactly what the rule gives (transformers 5 writes the derived list); any other list
// read from the file or set by the caller is kept as it is.
func deriveLayerTypes(c *Config) {
	deriveLayerTypesBy(c, func(i int) bool { return c.SlidingWindow > 0 && i >= c.MaxWindowLayers })
}

// deriveLayerTypesBy is deriveLayerTypes for a family's own rule: layer i is sliding when
// sliding(i) holds.
func deriveLayerTypesBy(c *Config, sliding func(i int) bool) {
	deriveLayerTypesAs(c, func(i int) string {
		if sliding(i) {
			return SlidingAttention
		}
		return FullAttention
	})
}

// deriveLayerTypesAs is deriveLayerTypesBy for families with other layer types: layer i's
// type is kind(i).
func deriveLayerTypesAs(c *Config, kind func(i int) string) {
	lt := make([]string, c.NumHiddenLayers)
	for i := range lt {
		lt[i] = kind(i)
	}
	fromFile := c.layerTypesFromFile
	c.layerTypesFromFile = false
	if c.LayerTypes != nil && !(c.layerTypesDerived && slices.Equal(c.LayerTypes, c.derivedLayerTypes)) &&
		!(fromFile && slices.Equal(c.LayerTypes, lt)) {
		c.layerTypesDerived = false
		return
	}
	c.layerTypesDerived = true
	c.LayerTypes = lt
	c.derivedLayerTypes = slices.Clone(lt)
}
