package mesh

import (
	"fmt"

	"github.com/halo-shell/halo-shell/engine/hf/config"
	"github.com/halo-shell/halo-shell/engine/nn"
)

// Workload is what the memory estimate needs beyond the layout and the model.
type Workload struct {
	// SeqLen is the tokens of one packed row; Rows the rows one data rank runs per
	// micro-batch (default 1).
	SeqLen, Rows int
	// ParamBytes is the bytes of one parameter, gradient or activation element (4 for f32,
	// 2 for bf16; default 4).
	ParamBytes int
	// OptimizerBytes is the optimizer state per parameter: 8 for AdamW with fp32 moments, 12
	// when bf16 weights also keep an fp32 master, 4 for AdamW with bf16 moments (default 8).
	OptimizerBytes int
	// Recompute: each layer keeps only its input during forward (activation recomputation).
	Recompute bool
}

// Memory is a per-device estimate in bytes.
type Memory struct {
	Params      int64 // weights the device holds (compute copy, plus the FSDP master shard)
	Grads       int64 // gradients (full local arena, plus the reduced FSDP shard)
	Optimizer   int64 // optimizer state (sharded under FSDP)
	Activations int64 // activations kept for backward at the peak (end of forward)
	Comm        int64 // staging buffers of the largest collective, plus persistent FSDP buffers
}

// Total is the sum of the parts.
func (m Memory) Total() int64 { return m.Params + m.Grads + m.Optimizer + m.Activations + m.Comm }

// String formats the estimate for --dry-run.
func (m Memory) String() string {
	return fmt.Sprintf("params %s, grads %s, optimizer %s, activations %s, comm buffers %s, total %s",
		HumanBytes(m.Params), HumanBytes(m.Grads), HumanBytes(m.Optimizer), HumanBytes(m.Activations), HumanBytes(m.Comm), HumanBytes(m.Total()))
}

// HumanBytes formats a byte count with a binary unit ("1.50 GiB").
func HumanBytes(b int64) string {
	const u = 1024
	switch {
	case b >= u*u*u:
		return fmt.Sprintf("%.2f GiB", float64(b)/(u*u*u))
	case b >= u*u:
		return fmt.Sprintf("%.2f MiB", float64(b)/(u*u))
	case b >= u:
		return fmt.Sprintf("%.1f KiB", float64(b)/u)
	}
	return fmt.Sprintf("%d B", b)
}

// LocalParams returns the parameter elements one rank holds under layout l: attention
// projections (and, for dense MLPs, the MLP) split over TP, the experts of its expert-parallel
// block only (E/EP per MoE layer, each split over ETP), everything else whole.
func LocalParams(l Layout, m ModelShape) int64 {
	tp := int64(one(l.TP))
	c, hd := int64(m.Hidden), int64(m.HeadDim)
	q, kv := int64(m.Heads)*hd, int64(m.KVHeads)*hd
	var split, whole int64
	whole += int64(m.Vocab) * c // embedding
	if !m.Tied {
		whole += int64(m.Vocab) * c
	}
	whole += c // final norm
	for i := 0; i < m.Layers; i++ {
		if m.Latent.KVRank > 0 {
			// Latent attention is whole on every rank (rule tp-latent).
			whole += m.Latent.Parameters(c, int64(m.Heads), m.QKVBias, m.OBias) + 2*c
			continue
		}
		if i < m.Linear.Layers {
			// Gated delta-net layers are whole on every rank (rule tp-linear); which layers
			// they are does not change the count.
			whole += m.Linear.Parameters(c) + 2*c
			continue
		}
		split += q*c + 2*kv*c + c*q
		if m.QKVBias {
			split += q + 2*kv
		}
		if m.AttnOutputGate {
			split += q * c // the gate rows of q_proj
			if m.QKVBias {
				split += q
			}
		}
		if m.OBias {
			whole += c
		}
		switch m.QKNorm {
		case config.QKNormPerHead:
			whole += 2 * hd
		case config.QKNormProjection:
			whole += q + kv
		}
		whole += 2 * c // input and post-attention norms
	}
	dense := int64(m.Layers - m.MoELayers)
	f := int64(m.Intermediate)
	mlp := 3 * c * f
	if m.MLPBias {
		mlp += 2*f + c
	}
	if m.MoE() {
		whole += dense * mlp                               // the plan does not split the MLPs of MoE models
		whole += int64(m.MoELayers) * int64(m.Experts) * c // routers
		whole += int64(m.MoELayers) * 3 * c * int64(m.SharedExpert)
		if m.SharedExpertGate {
			whole += int64(m.MoELayers) * c
		}
		if m.RouterBias {
			whole += int64(m.MoELayers) * int64(m.Experts) // correction biases
		}
	} else {
		split += dense * mlp
	}
	return split/tp + whole + LocalExpertParams(l, m)
}

// LocalExpertParams returns the routed-expert parameter elements one rank holds under layout
// l: the E/EP experts of its expert-parallel block in every MoE layer, each split over ETP.
func LocalExpertParams(l Layout, m ModelShape) int64 {
	if !m.MoE() {
		return 0
	}
	held := int64(m.Experts / one(l.EP))
	return int64(m.MoELayers) * held * 3 * int64(m.Hidden) * int64(m.ExpertIntermediate) / int64(one(l.ETP))
}

// Estimate returns the per-device memory of layout l (normalised for its device count) for
// model m under workload w. Parameters, gradients and optimizer state are exact for the
// engine's own arenas; activations count the tensors each layer keeps for backward (an upper
// bound of the cached set, not of transient workspace); comm buffers count the host staging of
// the largest collective and the FSDP staging buffer. Under expert parallelism a rank holds
// the weights, gradients and optimizer state of its own experts only (E/EP per MoE layer);
// with FSDP the dense parameters are sharded over the data group (DP·CP ranks) and the experts
// over their replicas (the expert-data group, DP·CP/EP ranks; when that is one rank they are
// updated in place, without a shard copy). Under expert-tensor parallelism
// each expert's FFN is split over the tensor group.
func Estimate(l Layout, m ModelShape, w Workload) Memory {
	if w.Rows <= 0 {
		w.Rows = 1
	}
	if w.ParamBytes <= 0 {
		w.ParamBytes = 4
	}
	if w.OptimizerBytes <= 0 {
		w.OptimizerBytes = 8
	}
	tp, cp, g := int64(one(l.TP)), int64(one(l.CP)), int64(one(l.DP)*one(l.CP))
	pb := int64(w.ParamBytes)
	local := LocalParams(l, m)
	var mem Memory
	mem.Params, mem.Grads = local*pb, local*pb
	opt := local
	if l.FSDP && g > 1 {
		// FSDP parts: (group size, elements, whether the elements are one block of the arena).
		type part struct {
			g, n   int64
			single bool
		}
		parts := []part{{g, local, true}}
		if ep := int64(one(l.EP)); ep > 1 && m.MoE() {
			experts := LocalExpertParams(l, m)
			// Experts sit between dense parameters; a rank's experts are one block only
			// when there is one MoE layer.
			parts = []part{{g, local - experts, false}, {g / ep, experts, m.MoELayers == 1}}
		}
		var pack int64
		opt = 0
		for _, pt := range parts {
			if pt.g == 1 {
				opt += pt.n // experts without replicas: not sharded, updated in place
				continue
			}
			shard := (pt.n + pt.g - 1) / pt.g
			mem.Params += shard * pb
			mem.Grads += shard * pb
			opt += shard
			if !pt.single || shard*pt.g != pt.n {
				pack = max(pack, shard*pt.g)
			}
		}
		mem.Comm += pack * pb // staging of parts that are not one block of G·S elements
	}
	mem.Optimizer = opt * int64(w.OptimizerBytes)

	// Activations per token and layer.
	n := int64(w.Rows) * int64(w.SeqLen) / cp
	c, hd := int64(m.Hidden), int64(m.HeadDim)
	qh, kvh := int64(m.Heads)/tp, int64(m.KVHeads)/tp
	attn := 2*qh*hd + 2*kvh*hd // q, out, k, v
	if m.QKNorm != config.NoQKNorm && !nn.AttentionRemakesQK() {
		attn += qh*hd + kvh*hd // pre-norm q and k beside the normed ones (HALO_ATTN_QK=keep)
	}
	if m.Latent.KVRank > 0 {
		attn = m.Latent.ActivationsPerToken(m.Heads)
	}
	block := 4*c + attn                                 // x, h1, mid, h2
	denseFFN := n * 3 * int64(m.Intermediate) / tp * pb // gate, up and SwiGLU output
	if g := m.Global; g.BesideExperts > 0 {
		// Gemma 4's MoE block beside every layer's MLP (engine/nn's MoEBesideKeptBytes; the
		// layouts that hold it keep its experts whole: no TP or EP of the block).
		denseFFN += nn.MoEBesideKeptBytes(int(n), int(c), g.BesideExperts, g.BesideTopK, g.BesideWidth, int(pb))
	}
	var moeFFN, moeLayers int64
	if m.MoE() {
		// What a MoE layer's device path keeps (engine/nn's MoEKeptBytes): router
		// probabilities [n,E] F32, the selection, weights and slots [n,K] (4 bytes each), the
		// expert offsets, and per routed slot the gate|up rows and, when kept, the expert's
		// output (always under expert parallelism).
		k, ei := int64(max(m.TopK, 1)), m.ExpertIntermediate/one(l.ETP)
		moeFFN = nn.MoEKeptBytes(int(n), int(c), m.Experts, int(k), ei, int(pb))
		if one(l.EP) > 1 && !nn.MoEKeepsExpertOutputs() {
			moeFFN += n * k * c * pb
		}
		moeLayers = int64(m.MoELayers)
	}
	perLayer := n * block * pb
	stats := n * (2 + qh) * 4 // rstd x2 and lse, f32
	if m.Latent.KVRank > 0 {
		stats += n * 2 * 4 // the latent projections' rstd
	}
	layers := int64(m.Layers)
	if w.Recompute {
		ffn := moeFFN
		if moeLayers < layers {
			ffn = max(ffn, denseFFN)
		}
		mem.Activations = layers*n*c*pb + perLayer + ffn + stats
	} else {
		mem.Activations = layers*(perLayer+stats) + (layers-moeLayers)*denseFFN + moeLayers*moeFFN
	}
	mem.Activations += n * c * pb // head input
	if layers > moeLayers {
		// The backward of a dense MLP holds one more [n, I] buffer beside the three it keeps
		// (the SwiGLU's input gradients are formed while its output's gradient lives): measured
		// on the CPU backend, a Qwen3-4B-width layer's peak grows by exactly n·ΔI·pb when I
		// changes by ΔI.
		mem.Activations += n * int64(m.Intermediate) / tp * pb
	}

	// Largest collective staging (the in-process communicator stages operand and result on the
	// host; NCCL needs comparable scratch).
	var coll int64
	if g > 1 && !l.FSDP {
		coll = max(coll, 2*local*pb)
	}
	if tp > 1 {
		coll = max(coll, 2*n*c*pb)
	}
	if cp > 1 {
		s := int64(w.Rows) * int64(w.SeqLen)
		coll = max(coll, 4*s*kvh*hd*pb) // gathered keys and values, rank-major and global order
	}
	mem.Comm += coll
	return mem
}
