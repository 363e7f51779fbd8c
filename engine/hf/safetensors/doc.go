// Package safetensors reads and writes the safetensors tensor file format of Hugging Face, and
// the sharded checkpoints (model-0000i-of-0000n.safetensors + model.safetensors.index.json)
// that transformers' save_pretrained writes.
//
// Reading is zero-copy: Open memory-maps a file (on Unix; elsewhere it reads it) and hands out
// TensorInfo values whose Data are views of the mapping, valid until Close. OpenCheckpoint
// presents a directory's shards as one set of tensors. Every header is validated the way the
// reference implementation validates it (tensors tile the data section contiguously, shapes
// match byte counts, the data ends the file) and a malformed file gives a *FormatError naming
// the file, the tensor and the problem, never a panic or an allocation larger than the input.
// ToFloat32 and DecodeFloat32 convert every numeric dtype to float32 with torch's results.
//
// Writing (Serialize, Save, SaveCheckpoint) produces files byte-identical to the Python
// safetensors library and transformers: the same tensor order (by dtype, widest first, then
// by name), header JSON layout and padding, shard naming, index JSON and sharding rule.
//
// The package knows nothing of models, devices or training: it maps names to dtypes, shapes
// and bytes. It does not convert between dtypes other than to float32 (see engine/tensor for
// float32 to bfloat16/float16), and it does not read PyTorch pickles (.bin).
package safetensors
