// Package config reads and writes Hugging Face config.json files for the decoder families that
// halo-shell trains: llama, mistral, qwen2, qwen3, olmo2, olmo3, phi3, granite, smollm3, glm4
// (dense) and qwen3_moe, mixtral, olmoe, flex_olmo, granitemoe, hunyuan_v1_moe, ernie4_5_moe, minimax_m2, laguna, phimoe, cohere2_moe, jetmoe, qwen2_moe, glm4_moe (mixture of experts).
//
// Parse and Load turn a config.json into a typed Config with Hugging Face's defaults filled in
// for absent keys, exactly as transformers 5.17 resolves them for that model_type. Both dialects
// found on the Hub load into the same struct: transformers 4.x files (rope_theta + rope_scaling,
// torch_dtype, num_experts) and transformers 5.x files (rope_parameters, dtype,
// num_local_experts, layer_types). Keys the package does not understand are kept, in order, and
// written back; Unknown lists them. A key of the wrong JSON type, an unsupported model_type or
// an impossible shape is an error that names the key and says what to change.
//
// MarshalJSON and Write produce config.json the way transformers 5.17 save_pretrained writes
// it: the same key set and names for the family, sorted keys, two-space indent, Python's float
// and string formatting. The package is tested against files that transformers itself loaded
// and saved (testdata/make_reference.py).
//
// Each family is one small file that registers a Family (names, keys, defaults, validation,
// presets) and the structural rules of its models: which attention projections carry biases,
// whether and how queries and keys are normalised, where the layer norms sit, which weights are
// fused, which layers are mixtures of experts and whether they have shared experts. Keys of the
// families that depart from Llama's decoder (multipliers, NoPE layers, expert groups) are the
// Features embedded in Config. These
// files are the one place where a family's structure is written. Preset returns a tiny debug
// configuration per family and the real shapes used in benchmarks; Override changes keys of a
// Config as a file edit would.
//
// Shape resolves the rules into the model's structure (sizes, which optional weights exist,
// expert layout, parameter counts). engine/models builds its models from it and engine/mesh
// checks layouts against it, so neither repeats a family's rules. IsMoELayer, IsSlidingLayer,
// QKVBias, OProjBias and QKNormKind answer the per-layer and per-weight questions directly.
//
// The package knows nothing about tensors, weights or devices: it describes a model's shape;
// engine/models builds the model from it.
package config
