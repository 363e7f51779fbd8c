package backend

import "github.com/halo-shell/halo-shell/internal/switches"

// The memory of Ops.CrossEntropy, the fused LM head and loss.
//
// An unfused head computes logits = hidden @ W^T for the whole micro-batch and keeps them, in
// fp32, with their gradient beside them: 8·V bytes per token (1.16 MiB per token for Qwen3's
// V = 151,936, so 4.6 GiB at 4096 tokens; transformers' loss path holds more, as it also keeps
// the bf16 logits and the log-softmax). The fused op computes the logits a chunk of rows at a
// time, folds them into the loss and (backward) into dHidden and dWeight at once, and reuses one
// chunk buffer, whatever N (CrossEntropyScratch). A bf16 head by default (HALO_CE_LOGITS=bf16)
// writes bf16 logits, as transformers' bf16 head does before its fp32 loss, and overwrites them
// with the dlogits: rows·V·2 bytes; with HALO_CE_LOGITS=f32 the logits are fp32 with bf16
// dlogits beside them, rows·V·6. A trained bf16 head's chunks add their dWeight products into
// the bf16 gradient directly (HALO_CE_DWEIGHT=direct), or through one fp32 [V, C] accumulator
// (=f32). Chunks hold at most CrossEntropyBudget bytes of fp32-sized logits: with the default
// budgets and V = 151,936 a frozen head (LoRA, QLoRA, evaluation) runs 768-row chunks, 0.22 GiB
// of scratch by default and 0.65 GiB with fp32 logits (0.05 or 0.16 MiB per token of a
// 4096-token micro-batch, against 1.16 MiB unfused); a trained head 3328-row chunks (0.94 GiB,
// or 2.83 GiB with fp32 logits).

const (
	// CrossEntropyChunkBytes bounds the fp32 logits of one chunk when the head's weight trains:
	// its gradient GEMM has K = rows, which wants large chunks to run at full speed.
	CrossEntropyChunkBytes = 2 << 30
	// CrossEntropyFrozenChunkBytes bounds them when it does not (a frozen head, or no
	// backward): the remaining GEMMs have M = rows, already efficient at a few hundred rows.
	CrossEntropyFrozenChunkBytes = 512 << 20
	// CrossEntropyCapShare is the share of a device memory cap a chunk's logits may take at
	// most (1/32: 704 MiB under a 22 GiB cap).
	CrossEntropyCapShare = 32
	// crossEntropyRowAlign is the row multiple of a chunk: the dWeight GEMM has K = rows, and
	// cuBLASLt's tiles want K a multiple of 256.
	crossEntropyRowAlign = 256
)

// CrossEntropyBudget is the fp32 logit bytes one chunk of Ops.CrossEntropy may hold:
// CrossEntropyChunkBytes when the head's weight gradient is computed, else
// CrossEntropyFrozenChunkBytes; under a device memory cap of memCap bytes (0: none) at most
// memCap/CrossEntropyCapShare.
func CrossEntropyBudget(trainsHead bool, memCap int64) int64 {
	b := int64(CrossEntropyFrozenChunkBytes)
	if trainsHead {
		b = CrossEntropyChunkBytes
	}
	if memCap > 0 {
		b = min(b, memCap/CrossEntropyCapShare)
	}
	return b
}

// CrossEntropyChunkRows picks the rows per chunk for N tokens and vocabulary V under a budget of
// fp32 logit bytes per chunk: the chunks are as few as the budget allows and as even as a
// multiple of 256 rows allows (16384 tokens of a 152k vocabulary under 2 GiB give 5 chunks of
// 3328 rows and a last one of 3072). It never exceeds N, and is at least one row.
func CrossEntropyChunkRows(N, V int, budget int64) int {
	if N <= 0 || V <= 0 {
		return 1
	}
	maxRows := int(min(budget/(4*int64(V)), int64(N)+crossEntropyRowAlign))
	if maxRows >= crossEntropyRowAlign {
		maxRows -= maxRows % crossEntropyRowAlign
	}
	maxRows = max(maxRows, 1)
	if N <= maxRows {
		return N
	}
	chunks := (N + maxRows - 1) / maxRows
	rows := (N + chunks - 1) / chunks
	if maxRows >= crossEntropyRowAlign {
		rows = (rows + crossEntropyRowAlign - 1) / crossEntropyRowAlign * crossEntropyRowAlign
	}
	return min(rows, maxRows, N)
}

// The CUDA backend's layout of the chunk buffers of a bf16 head (CrossEntropyScratch says what
// each holds).
var (
	swCELogits = switches.Register(switches.Switch{Name: "HALO_CE_LOGITS", Kind: switches.Tuning,
		Default: "bf16", Values: []string{"f32", "bf16"},
		Doc: "The dtype of the LM head's chunk logits on the CUDA backend when the head's weight is bf16: f32 (the logits GEMM writes fp32, the loss reads them, dlogits go to a bf16 buffer beside them: rows x V x 6 bytes) or bf16 (the GEMM rounds the logits to bf16, as transformers' bf16 LM head does before its fp32 loss, and the dlogits overwrite them: rows x V x 2 bytes). The loss's sums are fp32 either way."})
	swCEDWeight = switches.Register(switches.Switch{Name: "HALO_CE_DWEIGHT", Kind: switches.Tuning,
		Default: "direct", Values: []string{"f32", "direct"},
		Doc: "How the CUDA backend's LM head accumulates the chunks' weight gradients into a bf16 DWeight: f32 (into an fp32 [V, C] buffer added to DWeight once, one rounding) or direct (each chunk's GEMM adds into DWeight as HALO_CUDA_GEMM_BETA adds into bf16, no buffer: V x C x 4 bytes fewer; with its default each chunk's product is rounded to bf16 and then added, as autograd adds bf16 gradients)."})
)

// CrossEntropyBF16Logits reports whether a bf16 head's chunk logits are bf16 (HALO_CE_LOGITS).
func CrossEntropyBF16Logits() bool { return swCELogits.Is("bf16") }

// CrossEntropyDirectDWeight reports whether a bf16 DWeight takes each chunk's product directly
// (HALO_CE_DWEIGHT=direct) rather than through an fp32 accumulator.
func CrossEntropyDirectDWeight() bool { return swCEDWeight.Is("direct") }

// CrossEntropyScratch is the device memory a chunked CrossEntropy of rows-row chunks holds
// besides its operands, as the CUDA backend lays it out: the chunk's logits [rows, V], fp32, or
// bf16 for a head of elemBytes < 4 under HALO_CE_LOGITS=bf16; with backward and a weight of
// elemBytes < 4 and fp32 logits its dlogits [rows, V] in the weight's dtype (dlogits of the
// logits' dtype overwrite them); and when a DWeight of fewer than 4 bytes per element is
// accumulated (bf16DWeight) through an fp32 accumulator (HALO_CE_DWEIGHT=f32), that [V, C]
// buffer.
func CrossEntropyScratch(rows, V, C int, backward bool, elemBytes int, bf16DWeight bool) int64 {
	logit := int64(4)
	if elemBytes < 4 && CrossEntropyBF16Logits() {
		logit = int64(elemBytes)
	}
	n := int64(rows) * int64(V) * logit
	if backward && elemBytes < 4 && logit == 4 {
		n += int64(rows) * int64(V) * int64(elemBytes)
	}
	if bf16DWeight && !CrossEntropyDirectDWeight() {
		n += int64(V) * int64(C) * 4
	}
	return n
}
