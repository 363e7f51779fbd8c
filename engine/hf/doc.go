// Package hf is the home of halo-shell's Hugging Face formats. It holds no code of its own:
// each format lives in a subpackage. safetensors reads (memory-mapped, zero-copy) and writes
// (single files and sharded checkpoints, byte-identical to the Python library) tensor files;
// config reads and writes config.json for the supported model families; tokenizer implements
// tokenizer.json (byte-level BPE) encode and decode; chat renders tokenizer_config.json chat
// templates and the assistant-token masks used for supervised fine-tuning. inspect summarises a
// checkpoint for the `halo-shell run inspect` command.
//
// These packages know nothing about devices, training or sessions: they turn files into bytes,
// shapes and typed values, and back.
package hf
