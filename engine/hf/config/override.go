package config

import (
	"encoding/json"
	"fmt"
)

// Override returns a copy of c with config.json keys set from overrides (key -> value as
// encoding/json would marshal it; e.g. {"num_hidden_layers": 4, "rope_theta": 5e5}), parsed and
// validated as a file would be. Values c already has keep their JSON form (1000000 stays an
// integer). The 4.x spellings work: rope_theta and partial_rotary_factor update
// rope_parameters, rope_scaling replaces it (keeping rope_theta unless given), torch_dtype sets
// dtype. A layer_types that c derived is derived again when num_hidden_layers, sliding_window,
// use_sliding_window or max_window_layers change and layer_types is not given. source names
// the overrides in errors.
func (c *Config) Override(overrides map[string]any, source string) (*Config, error) {
	if err := c.Validate(); err != nil {
		return nil, err
	}
	obj, err := c.toPy()
	if err != nil {
		return nil, fmt.Errorf("config: %s: %w", c.ModelType, err)
	}
	rope, _ := obj["rope_parameters"].(pyObject)
	set := map[string]pyValue{}
	for k, v := range overrides {
		raw, err := json.Marshal(v)
		if err != nil {
			return nil, fmt.Errorf("config: %s: key %q: %w", source, k, err)
		}
		pv, err := decodePy(raw)
		if err != nil {
			return nil, fmt.Errorf("config: %s: key %q: %w", source, k, err)
		}
		set[k] = pv
	}
	// An override written under one of a field's names replaces the value the base config
	// holds under another (qwen3_moe's num_experts vs num_local_experts, for example).
	if f := c.Family(); f != nil {
		for k := range set {
			canon, ok := f.knows(k)
			if !ok {
				continue
			}
			for other := range obj {
				if other == k {
					continue
				}
				if c2, ok := f.knows(other); ok && c2 == canon {
					delete(obj, other)
				}
			}
		}
	}
	for k, v := range set {
		switch k {
		case "rope_theta", "partial_rotary_factor":
			if rope != nil && v != nil {
				rope[k] = v
			}
			if k == "rope_theta" {
				continue
			}
		case "rope_scaling", "rope_parameters":
			if m, ok := v.(pyObject); ok {
				if _, has := m["rope_theta"]; !has {
					if t, top := set["rope_theta"]; top {
						m["rope_theta"] = t
					} else if rope != nil {
						m["rope_theta"] = rope["rope_theta"]
					}
				}
			}
			delete(obj, "rope_parameters")
			rope = nil
		case "torch_dtype":
			if _, has := set["dtype"]; !has {
				delete(obj, "dtype")
			}
		}
		obj[k] = v
	}
	if _, given := set["layer_types"]; !given && c.layerTypesDerived {
		for _, k := range []string{"num_hidden_layers", "sliding_window", "use_sliding_window", "max_window_layers"} {
			if _, ok := set[k]; ok {
				delete(obj, "layer_types")
				break
			}
		}
	}
	data, err := encodePy(obj)
	if err != nil {
		return nil, fmt.Errorf("config: %s: %w", source, err)
	}
	n, err := parse(data)
	if err != nil {
		return nil, fmt.Errorf("config: %s: %w", source, err)
	}
	n.dropped = append(n.dropped, c.dropped...)
	return n, nil
}
