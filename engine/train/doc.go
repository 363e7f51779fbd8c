// Package train runs training: a typed configuration read from strict YAML (Hugging Face
// TrainingArguments names), the step loop as a library (Trainer.Step returns each optimizer
// step's metrics; hyperparameters change between steps), evaluation, and checkpoints that hold
// a Hugging Face model plus the trainer state needed to resume exactly.
//
// Methods: pretrain (every token is a target) and sft (only assistant or completion tokens are
// targets). The loss of an optimizer step is the mean over all non-ignored target tokens of all
// its micro-batches, so gradient accumulation does not change the result.
//
// The package is not a model (engine/models), an optimizer (engine/optim) or a data pipeline
// (engine/data); it wires them together. It knows nothing about RPC, terminals or notebooks: the
// session, the REPL and `halo-shell launch` drive a Trainer.
package train
