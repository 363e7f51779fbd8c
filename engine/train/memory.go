package train

import (
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/halo-shell/halo-shell/engine/backend"
	"github.com/halo-shell/halo-shell/engine/hf/config"
	"github.com/halo-shell/halo-shell/engine/hf/tokenizer"
	"github.com/halo-shell/halo-shell/engine/mesh"
	"github.com/halo-shell/halo-shell/engine/models"
	"github.com/halo-shell/halo-shell/engine/nn"
	"github.com/halo-shell/halo-shell/internal/switches"
)

// MemoryEstimate is the device memory a run needs, per device, in bytes. It is an estimate from
// the shapes: parameters, gradients and optimizer state are exact; activations count the
// tensors each layer keeps for backward at one micro-batch and ignore allocator overhead and
// backend workspaces.
type MemoryEstimate struct {
	Params   int64 // number of parameters
	Adapters int64 // number of LoRA adapter parameters (use_peft), in ParamBytes too
	// Quantized is the number of parameters stored in NF4 (load_in_4bit), counted in
	// ParamBytes at their NF4 size (0.5 byte each plus the block scales); ScratchBytes is the
	// buffer they are dequantised into, the largest such weight in bf16 (and f32 for f32 runs).
	Quantized    int64
	ScratchBytes int64
	ParamBytes   int64
	GradBytes    int64
	OptimBytes   int64 // AdamW moments (+ fp32 master weights with bf16 and adamw_torch)
	ActBytes     int64 // activations kept for backward at one micro-batch
	LogitsBytes  int64 // the loss head's working logits
	Tokens       int   // tokens per micro-batch
}

// Total is the sum of every part.
func (m MemoryEstimate) Total() int64 {
	return m.ParamBytes + m.ScratchBytes + m.GradBytes + m.OptimBytes + m.ActBytes + m.LogitsBytes
}

func (m MemoryEstimate) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "memory estimate per device (%d tokens per micro-batch):\n", m.Tokens)
	for _, r := range []struct {
		name string
		v    int64
	}{{m.paramsLabel(), m.ParamBytes}, {"nf4 weight scratch", m.ScratchBytes}, {"gradients", m.GradBytes},
		{"optimizer state", m.OptimBytes}, {"activations", m.ActBytes}, {"loss head logits", m.LogitsBytes}, {"total", m.Total()}} {
		if r.name == "nf4 weight scratch" && m.Quantized == 0 {
			continue
		}
		fmt.Fprintf(&b, "  %-22s %10s\n", r.name, humanBytes(r.v))
	}
	return strings.TrimRight(b.String(), "\n")
}

func humanBytes(n int64) string {
	switch {
	case n >= 1<<30:
		return fmt.Sprintf("%.2f GiB", float64(n)/(1<<30))
	case n >= 1<<20:
		return fmt.Sprintf("%.1f MiB", float64(n)/(1<<20))
	case n >= 1<<10:
		return fmt.Sprintf("%.1f KiB", float64(n)/(1<<10))
	}
	return fmt.Sprintf("%d B", n)
}

// ModelConfigFor returns the config.json the run will train, without loading weights.
func ModelConfigFor(cfg *Config) (*config.Config, error) {
	if cfg.Model.Init == nil {
		c, err := config.Load(cfg.Model.ModelNameOrPath)
		if err != nil {
			return nil, fmt.Errorf("train: model_name_or_path: %w", err)
		}
		return c, nil
	}
	tok, err := tokenizer.FromDir(cfg.Model.TokenizerNameOrPath)
	if err != nil {
		return nil, fmt.Errorf("train: %w", err)
	}
	return InitModelConfig(cfg.Model.Init, tok.VocabSize())
}

// EstimateMemory computes the memory estimate of a run of cfg on the model mc.
func EstimateMemory(cfg *Config, mc *config.Config) (MemoryEstimate, error) {
	a, err := models.ArchFromConfig(mc)
	if err != nil {
		return MemoryEstimate{}, err
	}
	var e MemoryEstimate
	C, I, V, L := int64(a.Hidden), int64(a.Intermediate), int64(a.Vocab), int64(a.Layers)
	q, kv := int64(a.Heads*a.HeadDim), int64(a.KVHeads*a.HeadDim)
	e.Params = a.NumParameters()
	el := int64(4)
	if cfg.Run.BF16 {
		el = 2
	}
	// What trains: every parameter, or with use_peft the adapters only (the frozen base has
	// no gradients and no optimizer state).
	trained := e.Params
	if cfg.PEFT.UsePEFT {
		n, err := models.LoRAParamCount(a.Shape, cfg.loraConfig())
		if err != nil {
			return MemoryEstimate{}, err
		}
		e.Adapters, trained = n, n
	}
	e.ParamBytes, e.GradBytes = (e.Params+e.Adapters)*el, trained*el
	if cfg.Quant.LoadIn4bit {
		n, nf4, largest, err := models.QuantizedParamCount(a.Shape, cfg.quantConfig())
		if err != nil {
			return MemoryEstimate{}, err
		}
		e.Quantized = n
		e.ParamBytes += nf4 - n*el
		e.ScratchBytes = largest * 2
		if el == 4 {
			e.ScratchBytes += largest * 4
		}
	}
	switch {
	case bf16Optim(cfg.Optim.Optim):
		e.OptimBytes = trained * 4
	case cfg.Run.BF16:
		e.OptimBytes = trained * 12
	default:
		e.OptimBytes = trained * 8
	}
	T := int64(cfg.Batch.PerDeviceTrainBatchSize * cfg.Batch.MaxLength)
	e.Tokens = int(T)
	// Kept per layer: input, two norm outputs, q, k, v, attention output (dtype), plus fp32
	// rstd and attention log-sum-exp rows; then the feed-forward's: a dense MLP's gate, up and
	// SwiGLU output, or what a mixture-of-experts layer's device path keeps (nn.MoEKeptBytes:
	// router probabilities, the routing, gate|up and the experts' outputs per routed slot), and
	// beside the MLP Gemma 4's MoE block's (nn.MoEBesideKeptBytes).
	attnAct := 2*q + 2*kv
	if a.QKNorm != config.NoQKNorm && !nn.AttentionRemakesQK() {
		attnAct += q + kv // pre-norm q and k beside the normed ones (HALO_ATTN_QK=keep)
	}
	if l := a.Latent; l.KVRank > 0 {
		attnAct = l.ActivationsPerToken(a.Heads) // nn.MLA's heads at the attention width
	}
	layerAct := T*(4*C+attnAct)*el + T*4*(2+int64(a.Heads))
	denseFFN := T * 3 * I * el
	moeFFN, moeLayers := int64(0), int64(0)
	if a.Experts > 0 {
		moeFFN = nn.MoEKeptBytes(int(T), int(C), a.Experts, a.TopK, a.ExpertIntermediate, int(el))
		for i := range a.Layers {
			if mc.IsMoELayer(i) {
				moeLayers++
			}
		}
	}
	if g := a.Global; g.BesideExperts > 0 {
		// Gemma 4's MoE block beside every layer's MLP keeps its own on top of the MLP's.
		denseFFN += nn.MoEBesideKeptBytes(int(T), int(C), g.BesideExperts, g.BesideTopK, g.BesideWidth, int(el))
	}
	if cfg.Run.GradientCheckpointing {
		ffn := denseFFN
		if moeLayers > 0 {
			ffn = max(moeFFN, denseFFN*min(L-moeLayers, 1))
		}
		e.ActBytes = L*T*C*el + layerAct + ffn
	} else {
		e.ActBytes = L*layerAct + (L-moeLayers)*denseFFN + moeLayers*moeFFN
	}
	e.ActBytes += T * C * el // final hidden state
	if L > moeLayers {
		// The backward of a dense MLP holds one more [T, I] buffer beside the three it keeps
		// (mesh.Estimate counts the same).
		e.ActBytes += T * I * el
	}
	// The loss head's chunk buffers, as the CUDA backend sizes them (engine/backend's
	// CrossEntropyBudget): smaller chunks for a frozen head and under a memory cap, and an fp32
	// accumulator for a trained bf16 head's gradient.
	memCap := int64(cfg.Run.MaxDeviceMemoryGiB * (1 << 30))
	if memCap == 0 {
		memCap = backend.EnvMemoryCap()
	}
	trainsHead := !cfg.PEFT.UsePEFT
	rows := backend.CrossEntropyChunkRows(int(T), int(V), backend.CrossEntropyBudget(trainsHead, memCap))
	e.LogitsBytes = backend.CrossEntropyScratch(rows, int(V), int(C), true, int(el), trainsHead && el < 4)
	return e, nil
}

var swMemoryCheck = switches.Register(switches.Switch{Name: "HALO_MEMORY_CHECK", Kind: switches.Debug,
	Default: "refuse", Values: []string{"refuse", "warn", "off"},
	Doc: "What a run does when its memory estimate exceeds the memory available before anything is allocated: refuse to start (default), warn and try, or not check."})

// MemoryNeed is what a run needs in one memory pool: the host's memory (CPU devices, which
// share it, and the host copy of the model of a GPU plan) or one device's.
type MemoryNeed struct {
	// Bytes is the estimate; Exact is its part that does not depend on the activation
	// estimate (parameters, gradients, optimizer state), which is exact.
	Bytes, Exact int64
	// Host says that the pool is host memory; otherwise it is the run's GPU, or each GPU of
	// a plan (Plan).
	Host, Plan bool
	// Detail says how Bytes was counted, e.g. "4 cpu devices x 2.10 GiB".
	Detail string
}

// RunMemoryNeed estimates the memory cfg needs for the model mc: EstimateMemory on one
// device; on a parallel layout mesh.Estimate per device, times the devices when they are CPU
// devices (they share host memory), plus the single host copy of the model's parameters.
func RunMemoryNeed(cfg *Config, mc *config.Config) (MemoryNeed, error) {
	d, l, isParallel, err := cfg.ParallelLayout()
	if err != nil {
		return MemoryNeed{}, err
	}
	if !isParallel {
		e, err := EstimateMemory(cfg, mc)
		if err != nil {
			return MemoryNeed{}, err
		}
		// device: auto is host memory only where no GPU is usable: the caller knows.
		host := cfg.Parallel.Devices != "" && d.Kind == "cpu" || cfg.Parallel.Devices == "" && cfg.Run.Device == "cpu"
		return MemoryNeed{Bytes: e.Total(), Exact: e.ParamBytes + e.GradBytes + e.OptimBytes, Host: host, Detail: "one device"}, nil
	}
	host := d.Kind == "cpu"
	a, err := models.ArchFromConfig(mc.Clone())
	if err != nil {
		return MemoryNeed{}, err
	}
	w := cfg.Workload()
	m, err := mesh.New(d, l, a.Shape, w.SeqLen)
	if err != nil {
		return MemoryNeed{}, err
	}
	e := mesh.Estimate(m.Layout, a.Shape, w)
	if cfg.PEFT.UsePEFT {
		// Data parallelism over a frozen base: every rank holds the base and the adapters,
		// and gradients and optimizer state for the adapters only.
		n, err := models.LoRAParamCount(a.Shape, cfg.loraConfig())
		if err != nil {
			return MemoryNeed{}, err
		}
		pb := int64(w.ParamBytes)
		e.Params += n * pb
		e.Grads, e.Optimizer = n*pb, n*int64(w.OptimizerBytes)
	}
	hostCopy := a.NumParameters() * int64(w.ParamBytes)
	if !host {
		return MemoryNeed{Bytes: e.Total(), Exact: e.Params + e.Grads + e.Optimizer, Plan: true,
			Detail: fmt.Sprintf("per GPU of %s (the host holds another %s, a copy of the parameters)", d, humanBytes(hostCopy))}, nil
	}
	n := int64(d.Len())
	return MemoryNeed{Bytes: n*e.Total() + hostCopy, Exact: n*(e.Params+e.Grads+e.Optimizer) + hostCopy, Host: true, Plan: true,
		Detail: fmt.Sprintf("%d cpu devices x %s, plus %s for the host copy of the parameters", n, humanBytes(e.Total()), humanBytes(hostCopy))}, nil
}

// MemoryShortfall says why need does not fit in available bytes of its pool, or "" when it
// does. where names the pool ("host memory", "cuda:0").
func MemoryShortfall(need MemoryNeed, available int64, where string) string {
	if available <= 0 || need.Bytes <= available {
		return ""
	}
	msg := fmt.Sprintf("the run needs about %s of %s (%s) and %s is available", humanBytes(need.Bytes), where, need.Detail, humanBytes(available))
	if need.Exact > available {
		msg += fmt.Sprintf("; its parameters, gradients and optimizer state alone take %s", humanBytes(need.Exact))
	} else {
		msg += " (the activation estimate is generous: it may fit)"
	}
	return msg + ": lower per_device_train_batch_size or max_length, set gradient_checkpointing: true or bf16: true, or use a smaller model or more devices"
}

// HostMemoryAvailable returns the bytes of host memory new allocations can take:
// MemAvailable of /proc/meminfo, lowered to what the cgroup v2 limit leaves when that is
// smaller. ok is false when neither is known.
func HostMemoryAvailable() (avail int64, ok bool) {
	if raw, err := os.ReadFile("/proc/meminfo"); err == nil {
		for _, line := range strings.Split(string(raw), "\n") {
			fs := strings.Fields(line)
			if len(fs) >= 2 && fs[0] == "MemAvailable:" {
				if kb, err := strconv.ParseInt(fs[1], 10, 64); err == nil && kb > 0 {
					avail, ok = kb*1024, true
				}
			}
		}
	}
	read := func(name string) (int64, bool) {
		raw, err := os.ReadFile(filepath.Join("/sys/fs/cgroup", name))
		if err != nil {
			return 0, false
		}
		v, err := strconv.ParseInt(strings.TrimSpace(string(raw)), 10, 64)
		return v, err == nil
	}
	if limit, lok := read("memory.max"); lok {
		if cur, cok := read("memory.current"); cok && (!ok || limit-cur < avail) {
			avail, ok = max(limit-cur, 0), true
		}
	}
	return avail, ok
}

// checkMemory compares the run's estimate with the memory of b (host memory for the CPU
// backend and for CPU plans, the device's capacity otherwise) before anything is allocated,
// and refuses (or warns, per HALO_MEMORY_CHECK) when it does not fit: past that point an
// allocation the machine cannot hold ends a CPU run in the Go runtime's out-of-memory abort.
func checkMemory(cfg *Config, mc *config.Config, b backend.Backend) error {
	mode := swMemoryCheck.Value()
	if mode == "off" {
		return nil
	}
	need, err := RunMemoryNeed(cfg, mc)
	if err != nil {
		return nil // the layout and model errors are reported where they are built
	}
	var avail int64
	where := "host memory"
	switch {
	case need.Plan && !need.Host:
		return nil // a GPU plan's devices are not open yet; their allocations fail with errors
	case need.Plan || strings.HasPrefix(b.Name(), "cpu"):
		a, ok := HostMemoryAvailable()
		if !ok {
			return nil
		}
		avail = a
		// A single CPU device capped below the host's memory (max_device_memory_gib,
		// HALO_DEVICE_MEMORY_GIB) is checked against its cap.
		if st := b.MemStats(); !need.Plan && st.Total > 0 && st.Total-st.Allocated < avail {
			avail, where = st.Total-st.Allocated, b.Name()+" memory (capped)"
		}
	default:
		st := b.MemStats()
		if st.Total <= 0 {
			return nil
		}
		avail, where = st.Total-st.Allocated, b.Name()
	}
	short := MemoryShortfall(need, avail, where)
	if short == "" {
		return nil
	}
	if mode == "warn" {
		slog.Warn("train: "+short, "HALO_MEMORY_CHECK", mode)
		return nil
	}
	return fmt.Errorf("train: %s (HALO_MEMORY_CHECK=warn tries anyway)", short)
}
