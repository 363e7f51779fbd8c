package config

import (
	"fmt"
	"slices"
	"strings"
)

// refuseUnknown is the Validate rule of the families that refuse keys they do not know
// (gemma3_text, gpt_oss, olmo2, olmo3, phi3, granite, smollm3, glm4, qwen2_moe, glm4_moe, flex_olmo, granitemoe, hunyuan_v1_moe, ernie4_5_moe, minimax_m2, laguna, phimoe, cohere2_moe, jetmoe): any
// such key could change the model, so it is an error naming the key rather than a key kept and
// ignored. quantization_config describes how the checkpoint's weights are stored, not the
// model, and is read by the weight loader; auto_map names the remote-code classes of Hub
// checkpoints that predate transformers' own implementation, which this package replaces.
func refuseUnknown(c *Config) error {
	for _, k := range c.Unknown() {
		if k == "quantization_config" || k == "auto_map" {
			continue
		}
		return fmt.Errorf("key %q is not a %s key (known: %s): remove it, or check its spelling", k, c.ModelType,
			strings.Join(c.Family().KnownKeys(), ", "))
	}
	return nil
}

// RemoveExtra drops a top-level key kept as read (Extra), such as a quantization_config that
// no longer describes weights that were dequantised on load. It reports whether the key was
// there.
func (c *Config) RemoveExtra(key string) bool {
	n := len(c.extra)
	c.extra = slices.DeleteFunc(c.extra, func(kv rawKey) bool { return kv.Key == key })
	return len(c.extra) != n
}
