// Package optim holds the optimizers and their companions: AdamW with fp32 master weights,
// AdamW-BF16 (bf16 weights and moments with stochastic rounding, 6 bytes per parameter),
// global gradient-norm computation and clipping, and learning-rate schedules with warmup.
//
// Updates run on the device through the backend's optional AdamW (backend.Optional) when it has
// one (the CPU and CUDA backends do); otherwise each parameter is updated on host copies by the
// CPU reference implementation. Optimizer state exports to and imports from
// named host tensors so checkpoints can store it.
//
// It is not a training loop: the caller computes gradients, chooses which parameters get
// weight decay (1-D parameters such as norms and biases usually do not), asks the schedule for
// the step's learning rate and calls Step.
package optim
