package cuda

import (
	"encoding/binary"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/halo-shell/halo-shell/engine/backend"
	"github.com/halo-shell/halo-shell/engine/models"
	"github.com/halo-shell/halo-shell/engine/tensor"
)

// GPU tests of the host-side work: no host waits inside a training step, asynchronous and
// ordered uploads, AdamW bit-for-bit against the CPU backend, cross-entropy's chunking and
// device-side fallbacks, and benchmarks of the GEMMs and memory-bound kernels at the Qwen3-0.6B
// shape.

// syncDelta returns the synchronisations made between two snapshots, by op.
func syncDelta(before, after SyncStats) map[string]int64 {
	d := map[string]int64{}
	for op, n := range after.ByOp {
		if k := n - before.ByOp[op]; k != 0 {
			d[op] = k
		}
	}
	return d
}

// TestGPUTrainStepDoesNotSynchronise runs forward+backward of a tiny model on a packed batch
// twice (the first compiles kernels and plans GEMMs) and checks that the second makes the host
// wait exactly once: for the download of the per-token losses at its end. Any other wait names
// the op that made it.
func TestGPUTrainStepDoesNotSynchronise(t *testing.T) {
	g := gpu(t)
	m := qwen3Model(t, g, qwen3JSON(128, 256, 2, 4, 2, 32, 1000), 3) // milliseconds a step
	defer m.Close()
	var batch models.Batch
	batch.DocStarts = []int32{0}
	for _, l := range []int{100, 37, 119} {
		lo := len(batch.Tokens)
		for i := 0; i < l; i++ {
			batch.Tokens = append(batch.Tokens, int32((lo+i)*7919%1000))
		}
		batch.Targets = append(batch.Targets, batch.Tokens[lo+1:]...)
		batch.Targets = append(batch.Targets, backend.IgnoreIndex)
		batch.DocStarts = append(batch.DocStarts, int32(len(batch.Tokens)))
	}
	if err := m.ZeroGrads(); err != nil {
		t.Fatal(err)
	}
	var deltas []map[string]int64
	var losses []float64
	for step := 0; step < 2; step++ {
		before := g.Syncs()
		sum, n, err := m.ForwardBackward(batch, 1/float32(len(batch.Tokens)))
		if err != nil {
			t.Fatalf("step %d: %v", step, err)
		}
		deltas = append(deltas, syncDelta(before, g.Syncs()))
		losses = append(losses, sum/float64(n))
	}
	want := map[string]int64{"Download": 1}
	got := deltas[1]
	ok := len(got) == len(want) && got["Download"] == 1
	report.addCheck("train step: one host wait (the loss download) between the first op and the end", ok,
		fmt.Sprintf("waits by op: first step %v, second step %v; losses %v", deltas[0], got, losses))
	if !ok {
		var extra []string
		for op, n := range got {
			if op != "Download" {
				extra = append(extra, fmt.Sprintf("%s x%d", op, n))
			}
		}
		sort.Strings(extra)
		t.Fatalf("forward+backward made the host wait %v (want only one Download); ops that synchronised: %s", got, strings.Join(extra, ", "))
	}
	if math.IsNaN(losses[1]) || losses[1] <= 0 {
		t.Fatalf("loss %v is not a positive number", losses[1])
	}
}

// TestGPUUploadIsOrderedAndAsynchronous checks that an Upload is ordered after the work queued
// before it (a Copy reading the old contents sees them) and before the work after it, that the
// host buffer may be reused as soon as Upload returns, and that it does not wait for the GPU:
// while a queue of large GEMMs is still running, the upload returns at once and counts no
// synchronisation.
func TestGPUUploadIsOrderedAndAsynchronous(t *testing.T) {
	g := gpu(t)
	const n = 4096
	x, _ := g.Alloc(tensor.F32, n)
	old, _ := g.Alloc(tensor.F32, n)
	after, _ := g.Alloc(tensor.F32, n)
	a := randomTensor(t, g, 1, tensor.BF16, 1, 4096, 4096)
	c, _ := g.Alloc(tensor.BF16, 4096, 4096)
	defer func() { g.Free(x); g.Free(old); g.Free(after); g.Free(a); g.Free(c) }()
	enc := func(v float32) []byte {
		b := make([]byte, 4*n)
		for i := 0; i < n; i++ {
			binary.LittleEndian.PutUint32(b[4*i:], math.Float32bits(v+float32(i)))
		}
		return b
	}
	if err := g.Upload(x, enc(1)); err != nil {
		t.Fatal(err)
	}
	// Keep the GPU busy so that a waiting upload would be seen.
	if err := g.Sync(); err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 40; i++ {
		if err := g.GEMM(backend.GEMMArgs{A: a, B: a, C: c, TransB: true, Alpha: 1}); err != nil {
			t.Fatal(err)
		}
	}
	if err := g.Copy(old, x); err != nil {
		t.Fatal(err)
	}
	before := g.Syncs()
	src := enc(1000)
	start := time.Now()
	err := g.Upload(x, src)
	hostUs := float64(time.Since(start).Microseconds())
	if err != nil {
		t.Fatal(err)
	}
	for i := range src {
		src[i] = 0xff // the upload must already hold its own copy
	}
	if err := g.Copy(after, x); err != nil {
		t.Fatal(err)
	}
	waits := syncDelta(before, g.Syncs())
	queued := time.Now()
	if err := g.Sync(); err != nil {
		t.Fatal(err)
	}
	gpuUs := float64(time.Since(queued).Microseconds())
	oldV, _ := backend.ToFloat32(g, old)
	afterV, _ := backend.ToFloat32(g, after)
	xV, _ := backend.ToFloat32(g, x)
	bad := ""
	for i := 0; i < n && bad == ""; i++ {
		switch {
		case oldV[i] != 1+float32(i):
			bad = fmt.Sprintf("the copy queued before the upload saw %g at %d, want %g", oldV[i], i, 1+float32(i))
		case afterV[i] != 1000+float32(i) || xV[i] != 1000+float32(i):
			bad = fmt.Sprintf("after the upload element %d is %g (copy) / %g (tensor), want %g", i, afterV[i], xV[i], 1000+float32(i))
		}
	}
	ok := bad == "" && len(waits) == 0
	report.addCheck("upload: ordered on the stream, host buffer reusable at once, no host wait", ok,
		fmt.Sprintf("%s waits %v; upload returned in %.0f us while the GPU still had %.0f us of queued GEMMs", bad, waits, hostUs, gpuUs))
	report.addBench(benchmark{Name: "upload_16KiB_behind_busy_gpu", Values: map[string]float64{"host_us": hostUs, "gpu_busy_after_us": gpuUs}})
	if bad != "" {
		t.Fatal(bad)
	}
	if len(waits) != 0 {
		t.Fatalf("Upload made the host wait: %v", waits)
	}
}

// TestGPUIndexChecksWithoutHostCopy runs Embedding, EmbeddingBackward and CrossEntropy on index
// tensors written on the device (Copy), for which the host knows nothing: the ops must fall
// back to checking on the device, with the same messages, and still compute the same results.
func TestGPUIndexChecksWithoutHostCopy(t *testing.T) {
	g := gpu(t)
	deviceCopy := func(v []int32) tensor.Tensor {
		src, err := backend.FromInt32(g, v, len(v))
		if err != nil {
			t.Fatal(err)
		}
		defer g.Free(src)
		dst, _ := g.Alloc(tensor.I32, len(v))
		if err := g.Copy(dst, src); err != nil {
			t.Fatal(err)
		}
		p, _ := g.ptr("test", "dst", dst)
		if _, known := g.hostInt32(p, len(v)); known {
			t.Fatal("a tensor written by Copy still has a host copy")
		}
		return dst
	}
	w := randomTensor(t, g, 5, tensor.BF16, 1, 10, 4)
	out, _ := g.Alloc(tensor.BF16, 3, 4)
	h, _ := g.Alloc(tensor.BF16, 3, 4)
	loss, _ := g.Alloc(tensor.F32, 3)
	defer func() { g.Free(w); g.Free(out); g.Free(h); g.Free(loss) }()
	ids := deviceCopy([]int32{1, 12, -1})
	defer g.Free(ids)
	err := g.Embedding(out, w, ids)
	okE := err != nil && strings.Contains(err.Error(), "ids[1] = 12 is outside the vocabulary [0, 10)")
	tg := deviceCopy([]int32{0, backend.IgnoreIndex, 11})
	defer g.Free(tg)
	err2 := g.CrossEntropy(backend.CrossEntropyArgs{Hidden: h, Weight: w, Targets: tg, Loss: loss})
	okC := err2 != nil && strings.Contains(err2.Error(), "Targets[2] = 11 is outside the vocabulary [0, 10) and is not the ignore index -100")
	// Valid device-made ids give the same gathered rows as uploaded ones.
	good := []int32{3, 0, 9}
	idsDev := deviceCopy(good)
	idsUp, _ := backend.FromInt32(g, good, 3)
	out2, _ := g.Alloc(tensor.BF16, 3, 4)
	defer func() { g.Free(idsDev); g.Free(idsUp); g.Free(out2) }()
	err3 := g.Embedding(out, w, idsDev)
	if err3 == nil {
		err3 = g.Embedding(out2, w, idsUp)
	}
	a, _ := backend.ToFloat32(g, out)
	b, _ := backend.ToFloat32(g, out2)
	okV := err3 == nil && slices.Equal(a, b)
	report.addCheck("device-made indices: flag fallback keeps the messages and results", okE && okC && okV,
		fmt.Sprintf("embedding: %v; cross-entropy: %v; valid ids: %v equal=%v", err, err2, err3, slices.Equal(a, b)))
	if !okE {
		t.Errorf("Embedding with device-made id 12 of V=10: %v", err)
	}
	if !okC {
		t.Errorf("CrossEntropy with device-made target 11 of V=10: %v", err2)
	}
	if !okV {
		t.Errorf("Embedding of valid device-made ids: err %v, rows %v vs uploaded %v", err3, a, b)
	}
}

// TestGPUAdamWMatchesCPUBitForBit runs three AdamW steps on both backends, with the scalars
// derived from the hyperparameters and with AdamWArgs' precise scalars, and requires identical
// fp32 parameters and moments (the kernel performs the CPU backend's operations in its order,
// each rounded once). The stochastic-rounding bf16 case must match exactly as well.
func TestGPUAdamWMatchesCPUBitForBit(t *testing.T) {
	g := gpu(t)
	for _, s := range []struct {
		name       string
		p, m       tensor.DType
		stochastic bool
		precise    bool
	}{
		{"f32_derived_scalars", tensor.F32, tensor.F32, false, false},
		{"f32_precise_scalars", tensor.F32, tensor.F32, false, true},
		{"bf16_stochastic_precise", tensor.BF16, tensor.BF16, true, true},
		{"bf16_params_grads_f32_moments", tensor.BF16, tensor.F32, false, true},
		{"bf16_params_grads_f32_moments_stochastic", tensor.BF16, tensor.F32, true, true},
	} {
		// 40013 elements run the scalar kernel; 40016 (a multiple of 4) the vectorised one.
		for _, n := range []int{40013, 40016} {
			gdt := tensor.F32
			if s.p == tensor.BF16 && s.m == tensor.F32 {
				gdt = tensor.BF16 // bf16 training: bf16 weights and gradients, fp32 moments
			}
			ts := []tspec{
				{Name: "p", DType: s.p, Shape: []int{n}, Gen: gen{Scale: 1}, Out: true},
				{Name: "g", DType: gdt, Shape: []int{n}, Gen: gen{Scale: 0.1}},
				{Name: "m", DType: s.m, Shape: []int{n}, Gen: gen{Scale: 0.01}, Out: true},
				{Name: "v", DType: s.m, Shape: []int{n}, Out: true},
				{Name: "shadow", DType: tensor.BF16, Shape: []int{n}, Out: true},
			}
			c := opCase{
				Name:    fmt.Sprintf("adamw_3_steps_exact/%s/n%d", s.name, n),
				Tensors: ts,
				Run: func(be backend.Backend, ts map[string]tensor.Tensor) error {
					for step := 1; step <= 3; step++ {
						lr := float32(1e-3) * float32(step)
						a := backend.AdamWArgs{Param: ts["p"], Grad: ts["g"], M: ts["m"], V: ts["v"], Shadow: ts["shadow"],
							LR: lr, Beta1: 0.9, Beta2: 0.95, Eps: 1e-8, WeightDecay: 0.1, GradScale: 0.5 + 0.25*float32(step), Step: step,
							Stochastic: s.stochastic, Seed: 42, ParamIndex: 7}
						if s.precise {
							// As engine/optim computes them: float64 from the hyperparameters, rounded once.
							b1, b2, lr64 := 0.9, 0.95, 1e-3*float64(step)
							a.Weight1, a.Weight2 = float32(1-b1), float32(1-b2)
							a.Decay = float32(1 - lr64*0.1)
							a.StepSize = float32(lr64 / (1 - math.Pow(b1, float64(step))))
							a.BC2Sqrt = float32(math.Sqrt(1 - math.Pow(b2, float64(step))))
						}
						if err := be.Optional().AdamW(a); err != nil {
							return err
						}
					}
					return nil
				},
			}
			t.Run(c.Name, func(t *testing.T) { runCase(t, g, c) })
		}
	}
}

// TestGPUCrossEntropyPaths covers the kernel's vectorised (V a multiple of 4) and scalar paths,
// fp32 weights (dlogits written over the logits) and bf16, several chunks with a short last one,
// and rows whose targets are all ignored.
func TestGPUCrossEntropyPaths(t *testing.T) {
	g := gpu(t)
	for _, s := range []struct {
		N, C, V, chunk int
		dt             tensor.DType
	}{
		{70, 64, 1000, 32, tensor.F32},
		{70, 64, 1003, 32, tensor.F32},
		{70, 64, 1003, 0, tensor.BF16},
		{600, 64, 4096, 256, tensor.BF16},
	} {
		targets := ints(s.N, func(i int) int32 {
			if i%5 == 1 || i >= s.N-3 {
				return backend.IgnoreIndex
			}
			return int32((i * 7919) % s.V)
		})
		rel, abs := 2*bf16Eps, 1e-2
		if s.dt == tensor.F32 {
			rel, abs = 1e-4, 1e-4
		}
		c := opCase{
			Name: fmt.Sprintf("cross_entropy_paths/%s/N%d_C%d_V%d_chunk%d", s.dt, s.N, s.C, s.V, s.chunk),
			Tensors: []tspec{
				{Name: "h", DType: s.dt, Shape: []int{s.N, s.C}, Gen: gen{Scale: 1}},
				{Name: "w", DType: s.dt, Shape: []int{s.V, s.C}, Gen: gen{Scale: 0.2}},
				{Name: "targets", DType: tensor.I32, Shape: []int{s.N}, Gen: gen{Ints: targets}},
				{Name: "loss", DType: tensor.F32, Shape: []int{s.N}, Out: true, AbsFrac: 1e-3, Rel: 1e-3},
				{Name: "logprob", DType: tensor.F32, Shape: []int{s.N}, Out: true, AbsFrac: 1e-3, Rel: 1e-3},
				{Name: "dh", DType: s.dt, Shape: []int{s.N, s.C}, Out: true, AbsFrac: abs, Rel: rel},
				{Name: "dw", DType: s.dt, Shape: []int{s.V, s.C}, Gen: gen{Scale: 0.01}, Out: true, AbsFrac: abs, Rel: rel},
			},
			Run: func(be backend.Backend, ts map[string]tensor.Tensor) error {
				return be.CrossEntropy(backend.CrossEntropyArgs{Hidden: ts["h"], Weight: ts["w"], Targets: ts["targets"], Loss: ts["loss"], LogProb: ts["logprob"],
					DHidden: ts["dh"], DWeight: ts["dw"], GradScale: 1.0 / float32(s.N), ChunkRows: s.chunk})
			},
		}
		t.Run(c.Name, func(t *testing.T) { runCase(t, g, c) })
	}
}

// ---- benchmarks ----

// TestGPULayerGEMMThroughput times the GEMMs of one layer at 16384 tokens of the Qwen3-0.6B
// shape (hidden 1024, q 2048, kv 1024 each for k and v, MLP 3072, vocabulary 151936) and of the
// Llama-3.2-1B shape (hidden 2048, q 2048, kv 512, MLP 8192, vocabulary 128256), and one
// LM-head chunk of each: forward (x·Wᵀ) and the two backward products (dX = dY·W; dW += dYᵀ·X
// into a bf16 gradient, or for the LM head into the fp32 accumulator cross-entropy uses), in
// TFLOP/s, once with the heuristic's first algorithm and once with the tuned one (gemm_tune.go).
// It checks that the tuned results equal the heuristic's to bf16 tolerance, that tuning waits
// once (GEMMTune) on the first call of a shape and never after.
func TestGPULayerGEMMThroughput(t *testing.T) {
	g := gpu(t)
	const M = 16384
	for _, m := range []struct {
		bench string
		lins  []gemmBenchLinear
	}{
		{"gemm_qwen3_0.6b_layer_16384_tokens", []gemmBenchLinear{
			{"q_proj", 2048, 1024, M}, {"k_proj", 1024, 1024, M}, {"v_proj", 1024, 1024, M}, {"o_proj", 1024, 2048, M},
			{"gate_proj", 3072, 1024, M}, {"up_proj", 3072, 1024, M}, {"down_proj", 1024, 3072, M},
			{"lm_head_chunk", 151936, 1024, backend.CrossEntropyChunkRows(M, 151936, backend.CrossEntropyChunkBytes)},
		}},
		{"gemm_llama3.2_1b_layer_16384_tokens", []gemmBenchLinear{
			{"q_proj", 2048, 2048, M}, {"k_proj", 512, 2048, M}, {"v_proj", 512, 2048, M}, {"o_proj", 2048, 2048, M},
			{"gate_proj", 8192, 2048, M}, {"up_proj", 8192, 2048, M}, {"down_proj", 2048, 8192, M},
			{"lm_head_chunk", 128256, 2048, backend.CrossEntropyChunkRows(M, 128256, backend.CrossEntropyChunkBytes)},
		}},
	} {
		t.Run(m.bench, func(t *testing.T) { benchLayerGEMMs(t, g, m.bench, m.lins) })
	}
}

// gemmBenchLinear is one projection y[M,O] = x[M,I]·w[O,I]ᵀ; O > 100000 marks an LM head.
type gemmBenchLinear struct {
	name    string
	O, I, M int
}

func benchLayerGEMMs(t *testing.T, g *Backend, bench string, lins []gemmBenchLinear) {
	defer restoreGemmTuning(t, g)
	values := map[string]float64{}
	var layerMs, layerHeurMs, layerFlops float64
	var problems []string
	for _, l := range lins {
		lmHead := l.O > 100000
		x := randomTensor(t, g, 1, tensor.BF16, 1, l.M, l.I)
		w := randomTensor(t, g, 2, tensor.BF16, 0.02, l.O, l.I)
		outDT := tensor.BF16
		if lmHead {
			outDT = tensor.F32 // the LM head's logits and its weight-gradient accumulator are fp32
		}
		y, _ := g.Alloc(outDT, l.M, l.O)
		dy := randomTensor(t, g, 3, tensor.BF16, 1, l.M, l.O)
		dx, _ := g.Alloc(tensor.BF16, l.M, l.I)
		dw, _ := g.Alloc(outDT, l.O, l.I)
		dxArgs := backend.LinearBackwardArgs{DX: dx, DY: dy, W: w}
		dwArgs := backend.LinearBackwardArgs{DW: dw, DY: dy, X: x}
		for _, p := range []struct {
			name string
			out  tensor.Tensor
			cost backend.Cost
			f    func() error
		}{
			{"fwd", y, backend.LinearCost(y, x, w, tensor.Tensor{}), func() error { return g.Linear(y, x, w, tensor.Tensor{}) }},
			{"dx", dx, backend.LinearBackwardCost(dxArgs), func() error { return g.LinearBackward(dxArgs) }},
			{"dw", dw, backend.LinearBackwardCost(dwArgs), func() error { return g.LinearBackward(dwArgs) }},
		} {
			flops := float64(p.cost.FLOPs)
			key := l.name + "_" + p.name
			shape := fmt.Sprintf("%s %s %s M=%d O=%d I=%d", bench, l.name, p.name, l.M, l.O, l.I)
			// once: zero the output (dW accumulates), run one call and read the result back.
			once := func() ([]float32, error) {
				if err := g.Fill(p.out, 0); err != nil {
					return nil, err
				}
				if err := p.f(); err != nil {
					return nil, err
				}
				return backend.ToFloat32(g, p.out)
			}
			setGemmTuning(t, g, gemmTuneConfig{Candidates: 1, MinFLOPs: 0, Rounds: 1})
			ref, err := once()
			if err != nil {
				t.Fatalf("%s: heuristic: %v", shape, err)
			}
			heurMs := timeIt(t, g, 5, p.f)
			setGemmTuning(t, g, tunedGemmConfig())
			if err := g.Fill(p.out, 0); err != nil {
				t.Fatal(err)
			}
			before := g.Syncs()
			if err := p.f(); err != nil {
				t.Fatalf("%s: tuned: %v", shape, err)
			}
			// The GEMM is posted: a Do behind it (no wait on the stream) runs after its tuning.
			if err := g.d.Do(func() error { return nil }); err != nil {
				t.Fatalf("%s: tuned: %v", shape, err)
			}
			firstWaits := syncDelta(before, g.Syncs())
			tunes := gemmPlanTunes(t, g)
			before = g.Syncs()
			got, err := once()
			if err != nil {
				t.Fatalf("%s: tuned: %v", shape, err)
			}
			// once's Download is its one wait; anything else is the tuning waiting again.
			if d := syncDelta(before, g.Syncs()); len(d) != 1 || d["Download"] != 1 {
				problems = append(problems, fmt.Sprintf("%s: the second call of a tuned shape waited %v (want only the Download)", shape, d))
			}
			timedPlans := 0
			chosen := -1.0
			for _, r := range tunes {
				if r.Timed {
					timedPlans++
					chosen = float64(r.Chosen)
				}
			}
			if firstWaits[gemmTuneSyncOp] != int64(timedPlans) || len(firstWaits) > 1 {
				problems = append(problems, fmt.Sprintf("%s: the first tuned call waited %v for %d timed plan(s) (want one GEMMTune wait per timed plan, nothing else)", shape, firstWaits, timedPlans))
			}
			if worst, at := gemmResultRatio(got, ref, 1e-3, 2*bf16Eps); worst > 1 {
				problems = append(problems, fmt.Sprintf("%s: tuned result [%d] = %g, heuristic's %g (worst ratio to tolerance %.3g)", shape, at, got[at], ref[at], worst))
			}
			ms := timeIt(t, g, 5, p.f)
			values[key+"_ms"] = ms
			values[key+"_tflops"] = flops / (ms * 1e-3) / 1e12
			values[key+"_heuristic_ms"] = heurMs
			values[key+"_heuristic_tflops"] = flops / (heurMs * 1e-3) / 1e12
			values[key+"_tuned_speedup"] = heurMs / ms
			values[key+"_tuned_candidate"] = chosen
			if len(tunes) > 0 {
				values[key+"_candidates"] = float64(len(tunes[len(tunes)-1].Candidates))
			}
			if !lmHead {
				layerMs += ms
				layerHeurMs += heurMs
				layerFlops += flops
			}
			t.Logf("%s: heuristic %.3f ms %.1f TFLOP/s; tuned (candidate %v of %v) %.3f ms %.1f TFLOP/s", shape,
				heurMs, flops/(heurMs*1e-3)/1e12, chosen, values[key+"_candidates"], ms, flops/(ms*1e-3)/1e12)
		}
		for _, tt := range []tensor.Tensor{x, w, y, dy, dx, dw} {
			g.Free(tt)
		}
	}
	values["layer_all_gemms_ms"] = layerMs
	values["layer_all_gemms_tflops"] = layerFlops / (layerMs * 1e-3) / 1e12
	values["layer_all_gemms_heuristic_ms"] = layerHeurMs
	values["layer_all_gemms_heuristic_tflops"] = layerFlops / (layerHeurMs * 1e-3) / 1e12
	values["gemm_workspace_mib"] = gemmWorkspaceBytes >> 20
	values["tune_candidates"] = float64(tunedGemmConfig().Candidates)
	report.addBench(benchmark{Name: bench, Values: values,
		Note: "Linear forward (NT), LinearBackward dX (NN) and dW (TN, += into bf16 via an fp32 product; the LM head's into fp32 directly, as cross-entropy does) per projection; lm_head_chunk is one cross-entropy chunk (fp32 logits); *_heuristic_* use cuBLASLt's first algorithm, the others the tuned one (HALO_CUDA_GEMM_CANDIDATES candidates timed on first use); median of 5 x 5 calls with CUDA events"})
	report.addCheck(bench+": tuned GEMMs equal the heuristic's to bf16 tolerance; one GEMMTune wait on a shape's first call, none after", len(problems) == 0, strings.Join(problems, "; "))
	for _, p := range problems {
		t.Error(p)
	}
}

// TestGPUCrossEntropyThroughput times the fused LM head + loss forward and backward at 16384
// tokens of a 151936 vocabulary (hidden 1024, bf16, bf16 weight gradient), and the ce_rows kernel
// alone on one chunk.
func TestGPUCrossEntropyThroughput(t *testing.T) {
	g := gpu(t)
	const N, C, V = 16384, 1024, 151936
	h := randomTensor(t, g, 1, tensor.BF16, 1, N, C)
	w := randomTensor(t, g, 2, tensor.BF16, 0.02, V, C)
	rng := rand.New(rand.NewPCG(3, 4))
	tg, _ := backend.FromInt32(g, ints(N, func(int) int32 { return int32(rng.IntN(V)) }), N)
	loss, _ := g.Alloc(tensor.F32, N)
	dh, _ := g.Alloc(tensor.BF16, N, C)
	dw, _ := g.Alloc(tensor.BF16, V, C)
	defer func() {
		for _, x := range []tensor.Tensor{h, w, tg, loss, dh, dw} {
			g.Free(x)
		}
	}()
	g.ResetPeak()
	base := g.MemStats().Allocated
	fwdBwdArgs := backend.CrossEntropyArgs{Hidden: h, Weight: w, Targets: tg, Loss: loss, DHidden: dh, DWeight: dw, GradScale: 1.0 / N}
	fwdArgs := backend.CrossEntropyArgs{Hidden: h, Weight: w, Targets: tg, Loss: loss}
	fwdBwd := timeIt(t, g, 1, func() error { return g.CrossEntropy(fwdBwdArgs) })
	scratch := float64(g.MemStats().Peak-base) / (1 << 30)
	fwd := timeIt(t, g, 1, func() error { return g.CrossEntropy(fwdArgs) })
	rows := backend.CrossEntropyChunkRows(N, V, backend.CrossEntropyChunkBytes)
	logits := randomTensor(t, g, 5, tensor.F32, 3, rows, V)
	dl, _ := g.Alloc(tensor.BF16, rows, V)
	defer g.Free(logits)
	defer g.Free(dl)
	pl, _ := g.ptr("bench", "logits", logits)
	pt, _ := g.ptr("bench", "targets", tg)
	pd, _ := g.ptr("bench", "dlogits", dl)
	pLoss, _ := g.ptr("bench", "loss", loss)
	kernel := func(dlp uintptr) func() error {
		return func() error {
			// ce_rows(logits, dtl, targets, loss, logprob, dlogits, dtdl, scale, token_scale,
			// row0, V, ignore_index, bad, cap), as CrossEntropy launches it.
			args := packArgs(pl, int32(tensor.F32), pt, pLoss, uintptr(0), dlp, int32(tensor.BF16), float32(1.0/N), uintptr(0),
				int64(0), int32(V), int32(backend.IgnoreIndex), g.flagPtr(), float32(0))
			return g.d.Do(func() error {
				return g.d.launchOnThread("crossentropy.cu", "ce_rows", [3]uint32{uint32(rows), 1, 1}, [3]uint32{512, 1, 1}, 0, args...)
			})
		}
	}
	rowsFwd := timeIt(t, g, 5, kernel(0))
	rowsBwd := timeIt(t, g, 5, kernel(pd))
	logitBytes := float64(rows) * V * 4
	values := map[string]float64{
		"fwd_bwd_ms":                 fwdBwd,
		"fwd_ms":                     fwd,
		"fwd_bwd_gemm_tflops":        float64(backend.CrossEntropyCost(fwdBwdArgs).FLOPs) / (fwdBwd * 1e-3) / 1e12,
		"fwd_gemm_tflops":            float64(backend.CrossEntropyCost(fwdArgs).FLOPs) / (fwd * 1e-3) / 1e12,
		"chunk_rows":                 float64(rows),
		"scratch_peak_gib":           scratch,
		"ce_rows_fwd_ms_per_chunk":   rowsFwd,
		"ce_rows_fwd_gbps":           logitBytes / (rowsFwd * 1e-3) / 1e9,
		"ce_rows_fwd_bwd_ms_per_chk": rowsBwd,
		// forward+backward reads the logits twice and writes bf16 dlogits once
		"ce_rows_fwd_bwd_gbps": (2*logitBytes + logitBytes/2) / (rowsBwd * 1e-3) / 1e9,
	}
	for k, v := range values {
		t.Logf("%s = %.3f", k, v)
	}
	report.addBench(benchmark{Name: "cross_entropy_16384x151936_bf16", Values: values,
		Note: "fused LM head + loss (chunked GEMMs + ce_rows); TFLOP/s count backend.CrossEntropyCost's FLOPs, the 3 GEMMs (logits, dHidden, dWeight) of 2*N*V*C each; ce_rows bandwidth counts the fp32 logits read once (fwd) or twice plus bf16 dlogits written (fwd+bwd); median of 5 with CUDA events"})
}

// TestGPUMemoryBoundKernels reports the bandwidth of the normalisation, rotary and MLP kernels
// at the Qwen3-0.6B shape (16384 tokens, C=1024, 16 q heads of 128, F=3072), counting the bytes
// of backend's cost table (each input read once, each output written once, accumulated outputs
// read and written, weights, rstd and positions included).
func TestGPUMemoryBoundKernels(t *testing.T) {
	g := gpu(t)
	const (
		N, C, F = 16384, 1024, 3072
		H, HD   = 16, 128
	)
	x := randomTensor(t, g, 1, tensor.BF16, 1, N, C)
	res := randomTensor(t, g, 2, tensor.BF16, 1, N, C)
	w := randomTensor(t, g, 3, tensor.BF16, 1, C)
	out, _ := g.Alloc(tensor.BF16, N, C)
	ro, _ := g.Alloc(tensor.BF16, N, C)
	dx, _ := g.Alloc(tensor.BF16, N, C)
	dw, _ := g.Alloc(tensor.BF16, C)
	rstd, _ := g.Alloc(tensor.F32, N)
	q := randomTensor(t, g, 4, tensor.BF16, 1, N, H*HD)
	qo, _ := g.Alloc(tensor.BF16, N, H*HD)
	gate := randomTensor(t, g, 5, tensor.BF16, 1, N, F)
	up := randomTensor(t, g, 6, tensor.BF16, 1, N, F)
	mo := randomTensor(t, g, 7, tensor.BF16, 1, N, F)
	dg, _ := g.Alloc(tensor.BF16, N, F)
	du, _ := g.Alloc(tensor.BF16, N, F)
	pos, _ := backend.FromInt32(g, ints(N, func(i int) int32 { return int32(i % 4096) }), N)
	invFreq := make([]float32, HD/2)
	for i := range invFreq {
		invFreq[i] = float32(math.Pow(1e6, -2*float64(i)/HD))
	}
	inv, _ := backend.FromFloat32(g, invFreq, tensor.F32, HD/2)
	defer func() {
		for _, tt := range []tensor.Tensor{x, res, w, out, ro, dx, dw, rstd, q, qo, gate, up, mo, dg, du, pos, inv} {
			g.Free(tt)
		}
	}()
	if err := g.RMSNorm(out, rstd, x, w, 1e-6); err != nil {
		t.Fatal(err)
	}
	rope := backend.RoPEArgs{Positions: pos, InvFreq: inv, Heads: H, HeadDim: HD}
	// Qwen3's per-head q norm: rows of HD.
	qw := randomTensor(t, g, 8, tensor.BF16, 1, HD)
	qrstd, _ := g.Alloc(tensor.F32, N*H)
	qdw, _ := g.Alloc(tensor.BF16, HD)
	defer g.Free(qdw)
	defer g.Free(qw)
	defer g.Free(qrstd)
	qh, _ := q.Reshape(N*H, HD)
	qoh, _ := qo.Reshape(N*H, HD)
	if err := g.RMSNorm(qoh, qrstd, qh, qw, 1e-6); err != nil {
		t.Fatal(err)
	}
	normBwd := backend.RMSNormBackwardArgs{DX: dx, DW: dw, DY: out, X: x, W: w, RStd: rstd}
	qnormBwd := backend.RMSNormBackwardArgs{DX: qoh, DW: qdw, DY: qh, X: qh, W: qw, RStd: qrstd}
	kernels := []struct {
		name string
		cost backend.Cost
		f    func() error
	}{
		{"rmsnorm_fwd", backend.RMSNormCost(out, rstd, x, w), func() error { return g.RMSNorm(out, rstd, x, w, 1e-6) }},
		{"add_rmsnorm_fwd", backend.AddRMSNormCost(ro, out, rstd, x, res, w), func() error { return g.AddRMSNorm(ro, out, rstd, x, res, w, 1e-6) }},
		{"rmsnorm_bwd", backend.RMSNormBackwardCost(normBwd), func() error { return g.RMSNormBackward(normBwd) }},
		{"qnorm_fwd", backend.RMSNormCost(qoh, qrstd, qh, qw), func() error { return g.RMSNorm(qoh, qrstd, qh, qw, 1e-6) }},
		{"qnorm_bwd", backend.RMSNormBackwardCost(qnormBwd), func() error { return g.RMSNormBackward(qnormBwd) }},
		{"rope_fwd_q", backend.RoPECost(qo, q, rope), func() error { return g.RoPE(qo, q, rope) }},
		{"rope_bwd_q", backend.RoPEBackwardCost(qo, q, rope), func() error { return g.RoPEBackward(qo, q, rope) }},
		{"add_residual", backend.AddCost(out, x, res), func() error { return g.Add(out, x, res) }},
		{"swiglu_fwd", backend.SwiGLUCost(mo, gate, up), func() error { return g.SwiGLU(mo, gate, up) }},
		{"swiglu_bwd", backend.SwiGLUBackwardCost(dg, du, mo, gate, up), func() error { return g.SwiGLUBackward(dg, du, mo, gate, up) }},
	}
	values := map[string]float64{}
	for _, k := range kernels {
		ms := timeIt(t, g, 10, k.f)
		values[k.name+"_ms"] = ms
		values[k.name+"_gbps"] = float64(k.cost.Bytes) / (ms * 1e-3) / 1e9
		t.Logf("%s: %.3f ms, %.0f GB/s", k.name, ms, values[k.name+"_gbps"])
	}
	// The backward's grid bound, swept: the figure behind normBwdOptions.blocksPerSM.
	defer func(v int) { g.normBwd.blocksPerSM = v }(g.normBwd.blocksPerSM)
	for _, bps := range []int{1, 2, 4, 8, 16} {
		g.normBwd.blocksPerSM = bps
		ms := timeIt(t, g, 10, func() error {
			return g.RMSNormBackward(backend.RMSNormBackwardArgs{DX: dx, DW: dw, DY: out, X: x, W: w, RStd: rstd})
		})
		values[fmt.Sprintf("rmsnorm_bwd_blocks_per_sm_%d_ms", bps)] = ms
		qms := timeIt(t, g, 10, func() error {
			return g.RMSNormBackward(backend.RMSNormBackwardArgs{DX: qoh, DW: qdw, DY: qh, X: qh, W: qw, RStd: qrstd})
		})
		values[fmt.Sprintf("qnorm_bwd_blocks_per_sm_%d_ms", bps)] = qms
		t.Logf("rmsnorm_bwd with %d blocks/SM: C=%d %.3f ms, C=%d %.3f ms", bps, C, ms, HD, qms)
	}
	// Llama-3.2-1B's width: the C=2048 backward keeps its weight-gradient sums in shared memory.
	{
		const C2 = 2048
		x2 := randomTensor(t, g, 9, tensor.BF16, 1, N, C2)
		w2 := randomTensor(t, g, 10, tensor.BF16, 1, C2)
		o2, _ := g.Alloc(tensor.BF16, N, C2)
		dx2, _ := g.Alloc(tensor.BF16, N, C2)
		dw2, _ := g.Alloc(tensor.BF16, C2)
		r2, _ := g.Alloc(tensor.F32, N)
		defer func() {
			for _, tt := range []tensor.Tensor{x2, w2, o2, dx2, dw2, r2} {
				g.Free(tt)
			}
		}()
		if err := g.RMSNorm(o2, r2, x2, w2, 1e-6); err != nil {
			t.Fatal(err)
		}
		defer func(b int) { g.normBwd.blocksPerSMWide = b }(g.normBwd.blocksPerSMWide)
		for _, bps := range []int{1, 2, 4} {
			g.normBwd.blocksPerSMWide = bps
			ms := timeIt(t, g, 10, func() error {
				return g.RMSNormBackward(backend.RMSNormBackwardArgs{DX: dx2, DW: dw2, DY: o2, X: x2, W: w2, RStd: r2})
			})
			key := fmt.Sprintf("rmsnorm_bwd_c2048_blocks_per_sm_%d_ms", bps)
			values[key] = ms
			t.Logf("%s = %.3f", key, ms)
		}
		g.normBwd.blocksPerSMWide = 1
		defer func(v bool) { g.normBwd.sharedDW = v }(g.normBwd.sharedDW)
		for _, shared := range []bool{false, true} {
			g.normBwd.sharedDW = shared
			for _, acc := range []bool{false, true} {
				a := backend.RMSNormBackwardArgs{DX: dx2, DW: dw2, DY: o2, X: x2, W: w2, RStd: r2, AccumulateDX: acc}
				ms := timeIt(t, g, 10, func() error { return g.RMSNormBackward(a) })
				name := "rmsnorm_bwd_c2048"
				if shared {
					name += "_shared_dw"
				}
				if acc {
					name += "_accumulate"
				}
				values[name+"_ms"] = ms
				values[name+"_gbps"] = float64(backend.RMSNormBackwardCost(a).Bytes) / (ms * 1e-3) / 1e9
				t.Logf("%s: %.3f ms, %.0f GB/s", name, ms, values[name+"_gbps"])
			}
		}
	}
	values["h200_hbm_gbps_datasheet"] = 4800
	report.addBench(benchmark{Name: "memory_bound_kernels_qwen3_0.6b_16384_tokens", Values: values,
		Note: "bf16; bandwidth counts backend.Cost's bytes: each input read once, each output written once, accumulated outputs read and written, weights, rstd and positions included; median of 5 x 10 calls with CUDA events"})
}

// TestGPURMSNormVectorised covers the vectorised bf16 kernels' row layouts: several rows per
// warp (C=64, 128), one warp per row (1024 to 2048, the wide ones in both weight-gradient forms),
// a width they refuse (C=24, C/8 does not divide 32) and one beyond the backward's registers
// (2056), with row counts that leave a block part empty; the fused add, and the backward's
// accumulate form (dX +=) into bf16 gradients.
func TestGPURMSNormVectorised(t *testing.T) {
	g := gpu(t)
	// Few rows of 1024 or more take the block-per-row forward (normRowPerBlock): {1, 8192},
	// {4, 16384}, {77, 1024} and the others up to 2056; {4096, 1024} and {3, 16392} (too wide
	// for it) keep the warp-per-row one.
	for _, s := range []struct{ N, C int }{{1029, 128}, {50, 64}, {13, 24}, {77, 1024}, {40, 2048}, {300, 1032}, {33, 1536}, {9, 2056},
		{1, 8192}, {4, 16384}, {4096, 1024}, {3, 16392}} {
		rel := 2 * bf16Eps
		fwd := opCase{
			Name: fmt.Sprintf("rmsnorm_and_add_rmsnorm/bf16/N%d_C%d", s.N, s.C),
			Tensors: []tspec{
				{Name: "x", DType: tensor.BF16, Shape: []int{s.N, s.C}, Gen: gen{Scale: 2}},
				{Name: "residual", DType: tensor.BF16, Shape: []int{s.N, s.C}, Gen: gen{Scale: 1}, Out: true, AbsFrac: 1e-3, Rel: rel},
				{Name: "w", DType: tensor.BF16, Shape: []int{s.C}, Gen: gen{Scale: 1}},
				{Name: "out", DType: tensor.BF16, Shape: []int{s.N, s.C}, Out: true, AbsFrac: 1e-3, Rel: rel},
				{Name: "rstd", DType: tensor.F32, Shape: []int{s.N}, Out: true, AbsFrac: 1e-5, Rel: 1e-5},
				{Name: "out2", DType: tensor.BF16, Shape: []int{s.N, s.C}, Out: true, AbsFrac: 1e-3, Rel: rel},
				{Name: "rstd2", DType: tensor.F32, Shape: []int{s.N}, Out: true, AbsFrac: 1e-5, Rel: 1e-5},
			},
			Run: func(be backend.Backend, ts map[string]tensor.Tensor) error {
				if err := be.RMSNorm(ts["out2"], ts["rstd2"], ts["x"], ts["w"], 1e-6); err != nil {
					return err
				}
				return be.Optional().AddRMSNorm(ts["residual"], ts["out"], ts["rstd"], ts["x"], ts["residual"], ts["w"], 1e-5)
			},
		}
		t.Run(fwd.Name, func(t *testing.T) { runCase(t, g, fwd) })
		if s.C > 4096 {
			continue // the wide rows are there for the forward's kernel choice
		}
		c := opCase{
			Name: fmt.Sprintf("rmsnorm_backward_accumulate/bf16/N%d_C%d", s.N, s.C),
			Tensors: []tspec{
				{Name: "x", DType: tensor.BF16, Shape: []int{s.N, s.C}, Gen: gen{Scale: 2}},
				{Name: "w", DType: tensor.BF16, Shape: []int{s.C}, Gen: gen{Scale: 1}},
				{Name: "dy", DType: tensor.BF16, Shape: []int{s.N, s.C}, Gen: gen{Scale: 1}},
				{Name: "out", DType: tensor.BF16, Shape: []int{s.N, s.C}},
				{Name: "rstd", DType: tensor.F32, Shape: []int{s.N}},
				{Name: "dx", DType: tensor.BF16, Shape: []int{s.N, s.C}, Gen: gen{Scale: 1}, Out: true, AbsFrac: 2e-3, Rel: rel},
				{Name: "dw", DType: tensor.BF16, Shape: []int{s.C}, Gen: gen{Scale: 1}, Out: true, AbsFrac: 1e-3, Rel: rel},
			},
			Run: func(be backend.Backend, ts map[string]tensor.Tensor) error {
				if err := be.RMSNorm(ts["out"], ts["rstd"], ts["x"], ts["w"], 1e-6); err != nil {
					return err
				}
				return be.RMSNormBackward(backend.RMSNormBackwardArgs{DX: ts["dx"], DW: ts["dw"], DY: ts["dy"], X: ts["x"], W: ts["w"], RStd: ts["rstd"], AccumulateDX: true})
			},
		}
		t.Run(c.Name, func(t *testing.T) { runCase(t, g, c) })
		if s.C > 1024 && s.C <= 2048 {
			// The same rows through the form that keeps its weight-gradient sums in registers.
			c.Name += "/registers_dw"
			t.Run(c.Name, func(t *testing.T) {
				defer func(v bool) { g.normBwd.sharedDW = v }(g.normBwd.sharedDW)
				g.normBwd.sharedDW = false
				runCase(t, g, c)
			})
		}
	}
}

// TestGPUAddVectorised covers Add's 8-wide bf16 path, in place (out aliases a) and into a view
// whose start is 16-byte aligned, next to the scalar path for a length that is not a multiple of 8.
func TestGPUAddVectorised(t *testing.T) {
	g := gpu(t)
	for _, n := range []int{16384, 16385} {
		c := opCase{
			Name: fmt.Sprintf("add_in_place/bf16/n%d", n),
			Tensors: []tspec{
				{Name: "a", DType: tensor.BF16, Shape: []int{n}, Gen: gen{Scale: 1}, Out: true, AbsFrac: 0, Rel: bf16Eps},
				{Name: "b", DType: tensor.BF16, Shape: []int{n}, Gen: gen{Scale: 1}},
			},
			Run: func(be backend.Backend, ts map[string]tensor.Tensor) error {
				return be.Add(ts["a"], ts["a"], ts["b"])
			},
		}
		t.Run(c.Name, func(t *testing.T) { runCase(t, g, c) })
	}
}
