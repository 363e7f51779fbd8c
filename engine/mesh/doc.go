// Package mesh describes how a run is spread over devices: the device list (`cpu:4`,
// `cuda:0-7`), the parallel Layout (data parallel with optional FSDP sharding, tensor, context,
// expert and expert-tensor parallelism), the Mesh that maps each rank to its coordinates and its
// groups, the validation rules a layout must pass before any weight is loaded, and the
// per-device memory estimate of a layout.
//
// It is not the code that moves data (engine/comm) nor the plan that applies a layout to a model
// (engine/parallel); it knows a model only through ModelShape, which is the config.Shape that
// the model's engine/hf/config family resolves (sizes, optional weights, expert layout), the
// same value engine/models builds the model from.
//
// # Mesh order
//
// World ranks are laid out as DP × CP × TP with TP innermost: rank = (dp·CP + cp)·TP + tp, so the
// ranks of one tensor-parallel group are neighbours (on GPUs: the same NVLink island). The
// "data" group of a rank is every rank with the same tp coordinate (DP·CP ranks); gradients are
// summed over it, and FSDP shards parameters, gradients and optimizer state over it. Expert
// parallelism borrows its ranks from the data group (EP divides DP·CP), expert-tensor parallelism
// from the tensor group (ETP is 1 or TP).
//
// # Support matrix
//
// Which combinations are accepted (Check enforces it; each accepted row has an equivalence test
// in engine/parallel, each refused one a refusal test here):
//
//	layout                    dense models          MoE models
//	dp (replicated)           yes                   yes (aux loss per micro-batch row, as on one device)
//	dp + fsdp                 yes                   yes
//	tp                        yes                   yes (attention split, experts and MLPs replicated)
//	cp                        yes (packing and      no: the router's load-balancing loss is per sequence
//	                          sliding windows)
//	dp/fsdp + tp + cp         yes                   no (cp)
//	ep (+ dp)                 no (no experts)       yes (experts sharded over the expert group)
//	ep + fsdp                 no                    yes
//	ep + tp, etp=1            no                    yes (experts replicated over the tensor group)
//	etp=tp (with or without   no                    yes (each expert's FFN split over the tensor
//	ep, fsdp)                                       group: gate/up by columns, down by rows)
//	ep or etp + cp            no                    no (cp)
//
// Rules every accepted layout passes (each refusal names the rule and a layout that passes all
// of them on the same devices):
//
//   - every degree is >= 1 and TP·CP divides the device count (DP = devices / (TP·CP));
//   - TP divides the attention heads, the key/value heads and the MLP width, and q/k norms
//     over the whole projection (not per head), fused projections, multi-head latent
//     attention and short-convolution layers are not split (TP = 1 then); with Gemma 4's
//     full-attention layers TP also divides their key/value heads;
//   - short-convolution layers (lfm2_moe) read the tokens before each one, so CP = 1 for them;
//   - CP splits every sequence into 2·CP equal chunks (load balancing of causal attention), so
//     2·CP divides the sequence length;
//   - EP divides the number of experts and DP·CP; ETP is 1 or TP and divides the expert width.
//
// # Expert groups
//
// Expert parallelism cuts each data group (data index d = dp·CP + cp) into blocks of EP
// consecutive ranks (DimEP): rank d mod EP of a block owns experts [j·E/EP, (j+1)·E/EP) with
// j = d mod EP, and tokens travel within the block. The ranks of a data group with the same
// d mod EP (DimEData, DP·CP/EP of them) hold the same experts and sum their gradients. A rank
// allocates only its experts (weights, gradients, optimizer state); with FSDP its experts are
// sharded over DimEData and its other parameters over the data group, as Estimate counts.
package mesh
