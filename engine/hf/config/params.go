package config

// NumParameters is the number of parameters of the model the config describes (Shape's
// NumParameters): transformers' count of model.parameters(), a tied LM head counted once.
func (c *Config) NumParameters() int64 { return c.Shape().NumParameters() }

// ActiveParameters is the number of parameters one token passes through (Shape's
// ActiveParameters): only NumExpertsPerTok of each MoE layer's experts counted.
func (c *Config) ActiveParameters() int64 { return c.Shape().ActiveParameters() }
