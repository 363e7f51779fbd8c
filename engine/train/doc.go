// Package train runs training: a typed configuration read from strict YAML (Hugging Face
// TrainingArguments names), the step loop as a library (Trainer.Step returns each optimizer
// step's metrics; hyperparameters change between steps), evaluation, and checkpoints that hold
// a Hugging Face model plus the trainer state needed to resume exactly.
//
// A step has one path whatever the layout: Trainer.Step reads the data and the schedule, a
// stepper does the device work (the single model on one device, or a parallel.Plan), and one
// builder turns what it measured into StepMetrics. Run is the one batch loop, on every node.
//
// Methods are registered MethodSpecs, each an Objective called by the one step loop (see
// method.go): pretrain (every token is a target) and sft (only assistant or completion tokens
// are targets), whose step loss is the mean over all non-ignored target tokens of all its
// micro-batches, so gradient accumulation does not change the result; and the preference
// methods dpo, smpo and kto (pref.go, formulas in docs/methods.md), whose step loss is the
// mean over the step's pairs or examples, with the gradient reaching the tokens through
// per-token scales (models.ForwardBackwardWeighted); and reward, a one-label sequence
// classifier (models.ForwardBackwardScores) trained with the Bradley-Terry loss
// (reward_model.go). grpo
// (grpo.go, grpo_loss.go, grpo_rollout.go, reward.go) makes its own micro-batches each step:
// it samples completions of the step's prompts with the policy (models.GenerateBatch), scores
// them with reward functions (built-in ones, or the one a session's client supplies through
// SetClientReward) and trains on them with TRL's clipped surrogate through the same per-token
// scales and the common device step. These methods (rowObjective) run on a parallel plan too:
// each micro-batch is prepared on the trainer's goroutine and run by the data rank that holds
// it; their losses read whole sequences, so context parallelism is refused (rule
// cp-sequence-loss).
//
// Parallel layouts: the config keys devices (cpu:4, cuda:0-7), tensor_parallel_size,
// context_parallel_size, expert_parallel_size, expert_tensor_parallel_size and fsdp (the
// data-parallel size follows) are checked with mesh.Check against config.json before any
// weight loads. On more than one device a parallel.Plan drives the steps: the step's
// micro-batches are dealt over the data ranks (gradient_accumulation_steps must be a multiple
// of the data-parallel size) and padded for context parallelism with ignored filler, so a
// step computes the same mean loss as on one device. The single model stays the host view,
// filled lazily: a step leaves the parameters on the devices, and whatever reads them next
// (Eval, generation, checkpoints, Trainer.HostModel, a move back to one device) gathers them
// first. Checkpoints are ordinary single-device ones whose optimizer
// state is layout-free, so a run resumes into any layout. SetLayout moves a live run to
// another layout between steps, in memory.
//
// Across nodes (NewOnNodes): one process per node drives devices cpu:K over TCP
// (engine/comm/tcp), or K GPUs over one NCCL world, as its share of a mesh of N·K ranks; the
// metrics are the world's and only node 0 writes files. Dense and mixture-of-experts models
// run in dp, fsdp, tp (inside a node), cp, ep and etp layouts; SetLayout is refused, and
// nodes whose configs disagree stop with the differing parts named. Save and SaveStep there
// are collectives that gather the optimizer shards from every node (node 0 writes the
// checkpoint, optimizer state included), and every node resumes from the same checkpoint;
// SyncGrads is a collective under FSDP or when an expert group spans nodes, and so is the
// parameter gather of HostModel, Eval and generation in the latter case. Every node must call
// them between the same steps, as Run does.
//
// Callers outside the package read the model's shape with Trainer.Arch, ParamSpecs,
// NumParams and ModelDType, and its values only through Trainer.HostModel (after SyncGrads for
// gradients), on the goroutine that drives the trainer.
//
// The package is not a model (engine/models), an optimizer (engine/optim) or a data pipeline
// (engine/data); it wires them together. It knows nothing about RPC, terminals or notebooks: the
// session, the REPL and `halo-shell launch` drive a Trainer.
package train
