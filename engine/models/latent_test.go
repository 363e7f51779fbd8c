package models

import (
	"testing"

	"github.com/halo-shell/halo-shell/engine/hf/config"
)

// TestLatentNormsKeepTheDefaultEpsilon: the latent projections' norms use RMSNorm's default
// 1e-6 whatever rms_norm_eps says (transformers builds them without it); the decoder's norms
// take rms_norm_eps.
func TestLatentNormsKeepTheDefaultEpsilon(t *testing.T) {
	for _, fam := range []string{"deepseek_v3", "glm4_moe_lite"} {
		m := tinyMoE(t, fam, latentMoE(func(c *config.Config) { c.RMSNormEps = 1e-2 }))
		for i, b := range m.blocks {
			la := b.Attn.Latent
			if la == nil {
				t.Fatalf("%s layer %d: no latent attention", fam, i)
			}
			if la.QANorm.Eps != 1e-6 || la.KVANorm.Eps != 1e-6 || b.Norm1.Eps != 1e-2 {
				t.Errorf("%s layer %d: q_a/kv_a norm eps %g/%g, input norm %g; want 1e-6, 1e-6, 1e-2", fam, i, la.QANorm.Eps, la.KVANorm.Eps, b.Norm1.Eps)
			}
		}
	}
}
