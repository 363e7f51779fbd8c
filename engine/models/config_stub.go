package models

// configSource is the config.json a model was built from (typed once engine/hf/config lands).
type configSource = any
