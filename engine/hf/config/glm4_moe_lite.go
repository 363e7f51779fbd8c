package config

import "slices"

// glm4_moe_lite: Glm4MoeLiteConfig (GLM-4.7-Flash). DeepSeek-V3's decoder (multi-head latent
// attention, sigmoid router with a correction bias and expert groups, shared experts) with the
// dense and sparse layers given by mlp_layer_types ("dense" or "sparse" per layer; one dense
// layer then sparse ones when absent). The Hub checkpoints also carry first_k_dense_replace,
// which transformers keeps but does not read; a value that disagrees with mlp_layer_types is
// refused.
func init() {
	Register(Family{
		ModelType:     "glm4_moe_lite",
		Architectures: []string{"Glm4MoeLiteForCausalLM", "Glm4MoeLiteModel"},
		// transformers' Glm4MoeLiteConfig has no head_dim: it writes one only when the file
		// gave it (which Validate checks equals qk_rope_head_dim).
		Keys:             append([]string{"mlp_layer_types"}, latentKeys...),
		Optional:         []string{"head_dim"},
		Aliases:          map[string]string{"num_local_experts": "n_routed_experts"},
		HeadDimFloor:     true,
		DefaultRopeTheta: 10000.0,
		Defaults: func(c *Config) {
			c.VocabSize = 154880
			c.HiddenSize = 2048
			c.IntermediateSize = 10240
			c.MoEIntermediateSize = 1536
			c.NumHiddenLayers = 47
			c.NumAttentionHeads = 20
			c.NumKeyValueHeads = 20
			c.NSharedExperts = 1
			c.NumExperts = 64
			c.RoutedScalingFactor = 1.8
			c.KVLoRARank, c.QLoRARank = 512, 768
			c.QKRopeHeadDim, c.VHeadDim, c.QKNopeHeadDim = 64, 256, 192
			c.NGroup, c.TopKGroup = 1, 1
			c.NumExpertsPerTok = 4
			c.NormTopKProb = true
			c.MaxPositionEmbeddings = 202752
			c.RMSNormEps = 1e-5
			c.BOSTokenID, c.EOSTokenIDs = IntPtr(0), []int{1}
			c.PretrainingTP = 1
			c.RopeInterleave = true
		},
		Resolve: func(c *Config) {
			resolveLatent(c)
			// transformers derives one dense layer then sparse ones; a derived list follows
			// num_hidden_layers.
			if c.MLPLayerTypes == nil || (c.Latent.mlpDerived && slices.Equal(c.MLPLayerTypes, c.Latent.mlpFrom)) {
				lt := make([]string, c.NumHiddenLayers)
				for i := range lt {
					lt[i] = "sparse"
				}
				if len(lt) > 0 {
					lt[0] = "dense"
				}
				c.MLPLayerTypes, c.Latent.mlpDerived, c.Latent.mlpFrom = lt, true, slices.Clone(lt)
			}
		},
		Validate: func(c *Config) error {
			if len(c.MLPLayerTypes) != c.NumHiddenLayers {
				return errorf("mlp_layer_types has %d entries but num_hidden_layers is %d: give one entry per layer", len(c.MLPLayerTypes), c.NumHiddenLayers)
			}
			dense := 0
			for i, t := range c.MLPLayerTypes {
				if t != "dense" && t != "sparse" {
					return errorf("mlp_layer_types[%d] is %q; use \"dense\" or \"sparse\"", i, t)
				}
				if t == "dense" && dense == i {
					dense++
				}
			}
			k, ok, err := c.extraInt("first_k_dense_replace")
			if err != nil {
				return err
			}
			if ok {
				want := slices.Repeat([]string{"sparse"}, c.NumHiddenLayers)
				for i := 0; i < min(k, len(want)); i++ {
					want[i] = "dense"
				}
				if !slices.Equal(want, c.MLPLayerTypes) {
					return errorf("first_k_dense_replace (%d) disagrees with mlp_layer_types (%d leading dense layers): transformers builds the layers from mlp_layer_types alone; set mlp_layer_types to the layers you mean and drop first_k_dense_replace", k, dense)
				}
			}
			return validateLatent(c)
		},
		MoELayer: func(c *Config, i int) bool {
			return c.NumExperts > 0 && i < len(c.MLPLayerTypes) && c.MLPLayerTypes[i] == "sparse"
		},
		OProjBias: func(c *Config) bool { return c.AttentionBias },
		SharedExpert: func(c *Config) (int, bool) {
			return c.NSharedExperts * c.MoEIntermediateSize, false
		},
		Presets: map[string]func(*Config){"tiny": tinyLatent},
	})
}
