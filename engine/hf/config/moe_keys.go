package config

// MoEKeys are the config.json keys of further mixture-of-experts families that no other family
// has: HunYuan's extra token ids. Config embeds it; a family that lacks a key leaves its field
// at the zero value, which is not written.
type MoEKeys struct {
	// EODTokenID and SEPTokenID are HunYuan's end-of-document and separator token ids, which
	// the model does not read (tokenizer metadata kept in config.json). Default 3 and 4.
	EODTokenID, SEPTokenID *int
}

func (k MoEKeys) clone() MoEKeys {
	for _, p := range []**int{&k.EODTokenID, &k.SEPTokenID} {
		if *p != nil {
			*p = IntPtr(**p)
		}
	}
	return k
}

// The keys of MoEKeys and the further spellings of shared fields, added to the package's field
// table before any family registers.
var _ = addFields(map[string]field{
	"eod_token_id": {kOptInt, true, func(c *Config) any { return &c.EODTokenID }},
	"sep_token_id": {kOptInt, true, func(c *Config) any { return &c.SEPTokenID }},
	// HunYuan's top-k (num_experts_per_tok is its attribute_map alias).
	"moe_topk": {kInt, false, func(c *Config) any { return &c.NumExpertsPerTok }},
})
