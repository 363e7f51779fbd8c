// Package parallel applies a parallel layout (engine/mesh) to a model from outside, the way
// torchtitan parallelises an unmodified model: the model code (engine/models, engine/nn) never
// mentions ranks. Each rank gets an ordinary model built by its family code from a config with
// fewer heads and a narrower MLP (tensor parallel) and is fed fewer rows (data parallel) or
// fewer tokens (context parallel); a thin wrapper around the rank's backend inserts the
// collectives that complete the math, and the Plan synchronises gradients and runs the
// optimizer.
//
// What each degree does:
//
//   - DP: rows are dealt to the data ranks; gradients are all-reduced (summed, the loss being
//     the mean over every target of the step) over the data group, which is DP × CP ranks.
//   - FSDP (ZeRO-style): the flat parameter arena is cut into one shard per data rank (under
//     EP, its expert part into one per expert replica; see EP). The
//     optimizer state and the fp32 master of each element live only on its shard's rank;
//     gradients are reduce-scattered into the shards and, after the update, the parameters are
//     all-gathered into each rank's compute arena. The compute arena is whole during the step
//     (parameters are gathered per step, not per layer), so FSDP divides gradient-reduction
//     traffic and optimizer memory, not the memory of the forward pass.
//   - TP: each family declares where its parameters go in a table of module paths
//     (models.Family.Placements: column, row, replicated or per-head, and which modules are
//     routed experts); the plan lays the weights out by it, and binding checks every rank's
//     weight shapes against it, refusing a table that does not fit with the weight, its shape
//     and the split asked for. For the Llama-style families q/k/v and gate/up are
//     column-parallel (their output features are split by heads and MLP width); o_proj and
//     down_proj are row-parallel, their partial products all-reduced in the forward; the input
//     gradient of the column-parallel group is all-reduced in the backward. Per-head q/k norms
//     stay whole and their gradients are summed over the tensor group. Embedding, norms, routers,
//     the dense MLPs of mixtures of experts and the LM head are replicated.
//   - CP: each packed row is cut into 2·CP chunks and rank r gets chunks r and 2·CP-1-r (the
//     load-balanced order for causal attention). Attention all-gathers keys and values; each
//     query chunk attends over the keys of its own documents up to its end, so packing with
//     several documents per row is exact; key and value gradients are reduce-scattered back.
//   - EP: experts are sharded over the expert group (EP consecutive ranks of a data group;
//     expert e lives on its rank e / (E/EP)). Each rank's model is built holding only its
//     experts (models.Options.Experts): its parameter and gradient arenas, and so its optimizer
//     state, have E/EP experts per MoE layer under their HF names. The router stays replicated
//     and routes over every expert by global id; each MoE block hands its experts to a runner
//     (nn.ExpertRunner) that sends every token's rows to its experts' owners (ExpertRoute:
//     dispatch by uneven all-to-all), computes them there grouped by expert (nn.ExpertGroup,
//     global ids mapped to the rank's slots), and brings the results back (combine), where
//     they are weighted and summed; the backward runs the same exchanges in reverse. Where the
//     device has the MoE ops and grouped GEMM (and experts are whole, ETP = 1), the runner is an
//     nn.SortedRunner and the block stays on the device path: routing, the sort by expert and
//     the weighted combine are the device ops, the block's sorted rows go to their owners in
//     one all-to-all (after one of the per-expert counts and one host read of the split sizes,
//     the only one of the layer), are sorted there by local expert with MoEPermute, run as
//     grouped GEMMs, and come back in one all-to-all; the backward reuses the splits. Expert
//     gradients are summed over the expert's replicas (the expert-data group, DP·CP/EP ranks),
//     since the expert group's tokens already reached them through the dispatch; the other
//     parameters keep their data-group treatment. With FSDP the arena is sharded in two parts:
//     the dense parameters (and routers) over the data group and the rank's experts over the
//     expert-data group; parts that are not one block of the arena are staged through one
//     shared buffer for their collectives.
//   - ETP (= TP): each expert's gate and up are column-parallel and its down row-parallel over
//     the tensor group (the rank's model is built with moe_intermediate_size / TP), with the
//     same collectives as the dense MLP under TP; it composes with EP, FSDP and DP.
//
// Dispatch and combine are collectives of engine/comm (phases Dispatch and Combine), so they
// are counted in CommStats and recorded as profile spans of kinds all_to_all_dispatch and
// all_to_all_combine with their bytes and time.
//
// State moves between layouts without touching disk: OptimizerState exports the optimizer in
// the layout-free form of a single-device optim.AdamW (one tensor per parameter and kind,
// experts by their HF names), LoadOptimizerState reslices and reshards it into any plan (each
// rank taking its experts, tensor slice and shard), and Relayout does both with the gathered
// weights, so expert weights and moments move between ranks in memory when EP changes; an
// invalid target is refused before anything changes. Gather assembles every expert from its
// owners into an ordinary full checkpoint.
//
// A rank that fails inside a step (out of memory, a backend error) aborts the communicators so
// that the other ranks return instead of waiting for it; the plan then only allows host-side
// reads (Gather, Params, OptimizerState, Relayout). Rows are validated on the host before a
// step starts, so bad input never reaches that path.
//
// Results equal the single-device run within fp32 rounding (reductions add in a different
// order); every collective runs through engine/comm, so it is counted and can be recorded as a
// profile span. Checkpoints are written from Gather into a single-device model: ordinary HF
// checkpoints whatever the layout.
//
// A plan normally drives every rank of its mesh from one process. With Options.Local it is one
// process's share of a run spread over several processes (each building the same plan from the
// same model and layout, communicating through engine/comm/tcp): it drives only its ranks, and
// the loss, aux loss, expert load and gradient norm are reduced over the world so every
// process sees the same numbers. Over several processes every layout is supported whose tensor
// groups lie inside one process (dp, fsdp, cp, ep, tp and etp, dense models and mixtures of
// experts); expert dispatch and combine cross processes where an expert group does.
// OptimizerState is then a collective that every process calls (the FSDP optimizer shards are
// all-gathered over the data groups, experts held elsewhere over the expert groups) and
// returns the same state as one process driving every rank, bit for bit; Params and Gather
// are collectives too when an expert group spans processes; Relayout is refused (LocalRanks
// says more).
//
// A model with LoRA adapters (models.Model.AttachLoRA) is laid out under plain data parallelism
// in one process (rule mesh.RuleAdapters refuses the rest): every rank holds the frozen base
// and the adapters, only the adapters' gradients are all-reduced and only they have optimizer
// state; row i of a step draws the dropout masks of micro-batch i on one device, so a plan
// follows the single-device run (lora.go).
//
// The package is not a trainer (engine/train owns schedules, data and checkpoints) and does not
// choose layouts (engine/mesh checks and suggests them).
package parallel
