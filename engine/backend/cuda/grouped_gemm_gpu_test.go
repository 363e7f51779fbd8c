package cuda

import (
	"encoding/binary"
	"fmt"
	"math/rand/v2"
	"testing"

	"github.com/halo-shell/halo-shell/engine/backend"
	"github.com/halo-shell/halo-shell/engine/tensor"
)

// groupRows draws the rows per group of s routed slots spread over g groups at random (each slot
// to a uniformly chosen group), as a router's counts look; zero leaves every group empty.
func groupRows(seed uint64, g, s int) []int {
	r := rand.New(rand.NewPCG(seed, 3))
	rows := make([]int, g)
	for range s {
		rows[r.IntN(g)]++
	}
	return rows
}

func groupOffsets(rows []int) []int32 {
	off := make([]int32, len(rows)+1)
	for g, m := range rows {
		off[g+1] = off[g] + int32(m)
	}
	return off
}

// groupedCase is one grouped product compared with the CPU oracle.
func groupedCase(kind backend.GroupedKind, name string, rows []int, n, k int, in, out tensor.DType, acc bool) opCase {
	off := groupOffsets(rows)
	g, s := len(rows), int(off[len(rows)])
	var sa, sb, so []int
	switch kind {
	case backend.GroupedForward:
		sa, sb, so = []int{s, k}, []int{g, n, k}, []int{s, n}
	case backend.GroupedInputGrad:
		sa, sb, so = []int{s, n}, []int{g, n, k}, []int{s, k}
	default:
		sa, sb, so = []int{s, n}, []int{s, k}, []int{g, n, k}
	}
	// bf16 operands, fp32 accumulation on both sides: they differ in summation order and, for a
	// bf16 Out, in which side of a rounding boundary a sum lands (2 bf16 steps allowed). f32
	// operands (the scalar kernel) differ in summation order only.
	absFrac, rel := 1e-3, 2*bf16Eps
	if out == tensor.F32 {
		rel = 1e-4
	}
	outGen := gen{}
	if acc {
		outGen = gen{Scale: 1}
	}
	return opCase{
		Name:   fmt.Sprintf("grouped_gemm/%s/%s/%s->%s/G%d_S%d_N%d_K%d_acc%v", kind, name, in, out, g, s, n, k, acc),
		Inputs: fmt.Sprintf("grouped/%s/%d/%d/%d/%v", name, n, k, kind, acc),
		Tensors: []tspec{
			{Name: "a", DType: in, Shape: sa, Gen: gen{Scale: 1}},
			{Name: "b", DType: in, Shape: sb, Gen: gen{Scale: 1}},
			{Name: "off", DType: tensor.I32, Shape: []int{g + 1}, Gen: gen{Ints: off}},
			{Name: "out", DType: out, Shape: so, Gen: outGen, Out: true, AbsFrac: absFrac, Rel: rel},
		},
		Run: func(be backend.Backend, ts map[string]tensor.Tensor) error {
			f := be.Optional().GroupedGEMM
			if f == nil {
				return fmt.Errorf("%s has no GroupedGEMM", be.Name())
			}
			return f(backend.GroupedGEMMArgs{Kind: kind, A: ts["a"], B: ts["b"], Out: ts["out"], Offsets: ts["off"], Accumulate: acc})
		},
	}
}

var groupedKindList = []backend.GroupedKind{backend.GroupedForward, backend.GroupedInputGrad, backend.GroupedWeightGrad}

// groupedImpls are the tensor-core implementations of the grouped products a GPU of arch has:
// "mma" (mma.sync, every arch), "cublas" (a cuBLASLt GEMM per group, every arch) and, on sm_90,
// every warpgroup-MMA variant in a fixed order, or only the one HALO_CUDA_GROUPED_GEMM names, alone (so that each variant can be tested in a
// process of its own, under a timeout of its own, without repeating the others' cases).
func groupedImpls(arch string) []string {
	if v := swGrouped.Value(); v == groupedCublas {
		return []string{v}
	}
	if !wgArch(arch) {
		return []string{"mma", groupedCublas}
	}
	if v := swGrouped.Value(); v != "auto" {
		return []string{v}
	}
	return []string{"mma", "wg", "wg-n128", "wg-n256", "wg-n128x2", "wg-tma", "wg-p", "wg-p256", groupedCublas}
}

// forGroupedImpls runs f as a subtest per implementation of groupedImpls, with g set to use it.
func forGroupedImpls(t *testing.T, g *Backend, f func(t *testing.T)) {
	defer func(v string) { g.groupedWG = v }(g.groupedWG)
	for _, im := range groupedImpls(g.d.info.KernelArch) {
		g.groupedWG = im
		if im == "mma" {
			g.groupedWG = ""
		}
		t.Run(im, f)
	}
}

// TestGPUGroupedGEMM compares the three kinds with the CPU oracle, for each tensor-core
// implementation (subtests mma and, on Hopper, wg): uneven, empty and one-row groups, partial
// tiles, G = 8, 64 and 128, and the expert shapes of Qwen3-30B-A3B and OLMoE at a reduced token
// count (the full ones are in TestGPUGroupedGEMMThroughput).
func TestGPUGroupedGEMM(t *testing.T) {
	g := gpu(t)
	type shape struct {
		name string
		rows []int
		n, k int
	}
	const firstExpertShape = 6
	shapes := []shape{
		{"uneven_empty_onerow", []int{0, 1, 130, 0, 7, 255, 1, 64}, 96, 72},
		{"all_empty", []int{0, 0, 0}, 64, 40},
		{"one_group_one_row", []int{1}, 136, 264},
		{"G8", groupRows(8, 8, 600), 256, 128},
		{"G64", groupRows(64, 64, 2000), 128, 200},
		{"G128", groupRows(128, 128, 3000), 64, 136},
		// firstExpertShape: the model shapes from here on, with the experts' N and K and their
		// rows per expert, but 32 experts (the host oracle of a weight gradient of 128 experts
		// takes most of a minute; the G128 case above covers many groups).
		// Qwen3-30B-A3B: C=2048, I=768, top-8, 8 rows per expert: gate|up [2I, C] and down [C, I].
		{"qwen3_30b_a3b_gateup", groupRows(3, 32, 32*8), 2 * 768, 2048},
		{"qwen3_30b_a3b_down", groupRows(3, 32, 32*8), 2048, 768},
		// OLMoE-1B-7B: C=2048, I=1024, top-8, 16 rows per expert.
		{"olmoe_gateup", groupRows(4, 32, 32*16), 2 * 1024, 2048},
	}
	forGroupedImpls(t, g, func(t *testing.T) {
		for i, s := range shapes {
			for _, kind := range groupedKindList {
				if i >= firstExpertShape {
					// The expert shapes' outputs are large (a weight gradient of 400M elements) and
					// their host oracle slow: one variant each, accumulating for the weight gradient.
					c := groupedCase(kind, s.name, s.rows, s.n, s.k, tensor.BF16, tensor.BF16, kind == backend.GroupedWeightGrad)
					t.Run(c.Name, func(t *testing.T) { runCase(t, g, c) })
					continue
				}
				for _, acc := range []bool{false, true} {
					c := groupedCase(kind, s.name, s.rows, s.n, s.k, tensor.BF16, tensor.BF16, acc)
					t.Run(c.Name, func(t *testing.T) { runCase(t, g, c) })
				}
				c := groupedCase(kind, s.name, s.rows, s.n, s.k, tensor.BF16, tensor.F32, kind == backend.GroupedWeightGrad)
				t.Run(c.Name, func(t *testing.T) { runCase(t, g, c) })
			}
		}
		// The scalar kernel: f32 operands, and bf16 ones whose rows are not 16-byte aligned.
		for _, s := range []shape{
			{"f32_uneven", []int{3, 0, 17, 1}, 24, 40},
			{"bf16_unaligned", []int{5, 0, 9, 1}, 21, 13},
		} {
			in := tensor.F32
			if s.name == "bf16_unaligned" {
				in = tensor.BF16
			}
			for _, kind := range groupedKindList {
				for _, acc := range []bool{false, true} {
					c := groupedCase(kind, s.name, s.rows, s.n, s.k, in, tensor.F32, acc)
					t.Run(c.Name, func(t *testing.T) { runCase(t, g, c) })
				}
			}
		}
	})
}

// TestGPUGroupedGEMMDoesNotSynchronise checks that a grouped product never makes the host wait
// (the offsets stay on the device) and that its result does not change from run to run.
func TestGPUGroupedGEMMDoesNotSynchronise(t *testing.T) {
	g := gpu(t)
	if g.groupedWG == groupedCublas {
		t.Skip("HALO_CUDA_GROUPED_GEMM=cublas reads the offsets to the host: it synchronises by design")
	}
	rows := groupRows(9, 16, 3000)
	off, err := backend.FromInt32(g, groupOffsets(rows), len(rows)+1)
	if err != nil {
		t.Fatal(err)
	}
	const n, k = 256, 384
	x := randomTensor(t, g, 1, tensor.BF16, 1, 3000, k)
	w := randomTensor(t, g, 2, tensor.BF16, 1, len(rows), n, k)
	out, _ := g.Alloc(tensor.BF16, 3000, n)
	defer func() { g.Free(off); g.Free(x); g.Free(w); g.Free(out) }()
	run := func() {
		if err := g.GroupedGEMM(backend.GroupedGEMMArgs{Kind: backend.GroupedForward, A: x, B: w, Out: out, Offsets: off}); err != nil {
			t.Fatal(err)
		}
	}
	run() // compiles and loads the kernels, which may wait
	if err := g.Sync(); err != nil {
		t.Fatal(err)
	}
	before := g.Syncs().Total
	for range 3 {
		run()
	}
	if after := g.Syncs(); after.Total != before {
		t.Fatalf("three grouped products made %d host synchronisations (last by %s), want none", after.Total-before, after.Last)
	}
	first := make([]byte, out.Bytes())
	if err := g.Download(first, out); err != nil {
		t.Fatal(err)
	}
	run()
	again := make([]byte, out.Bytes())
	if err := g.Download(again, out); err != nil {
		t.Fatal(err)
	}
	if string(first) != string(again) {
		t.Fatal("two runs of the same grouped product gave different bits")
	}
}

// fastRandomBF16 fills a new bf16 tensor with values uniform in [-scale, scale) drawn on the
// host without the cost of normal deviates (the throughput test's weights reach 10^9 elements).
func fastRandomBF16(t *testing.T, g *Backend, seed uint64, scale float32, shape ...int) tensor.Tensor {
	t.Helper()
	n := tensor.Shape(shape).Numel()
	raw := make([]byte, 2*n)
	r := rand.New(rand.NewPCG(seed, 11))
	for i := 0; i+8 <= len(raw); i += 8 {
		u := r.Uint64()
		for j := 0; j < 4; j++ {
			v := (float32(uint16(u>>(16*j)))/32768 - 1) * scale
			binary.LittleEndian.PutUint16(raw[i+2*j:], tensor.F32ToBF16(v))
		}
	}
	x, err := g.Empty(tensor.BF16, shape...)
	if err != nil {
		t.Fatal(err)
	}
	if err := g.Upload(x, raw); err != nil {
		t.Fatal(err)
	}
	return x
}

// TestGPUGroupedGEMMThroughput logs TFLOP/s of the grouped products at full MoE layer shapes
// (8192 tokens routed at random, so groups are uneven), for each tensor-core implementation,
// next to one cuBLASLt GEMM of the same total FLOPs, the dense equivalent. It reports; it
// asserts no timing.
func TestGPUGroupedGEMMThroughput(t *testing.T) {
	g := gpu(t)
	const tokens = 8192
	for _, m := range []struct {
		name       string
		c, i, e, k int
	}{
		{"qwen3_30b_a3b", 2048, 768, 128, 8},
		{"olmoe_1b_7b", 2048, 1024, 64, 8},
		{"mixtral_8x7b", 4096, 14336, 8, 2},
	} {
		s := tokens * m.k
		rows := groupRows(uint64(m.e), m.e, s)
		off, err := backend.FromInt32(g, groupOffsets(rows), m.e+1)
		if err != nil {
			t.Fatal(err)
		}
		for _, p := range []struct {
			name string
			n, k int // the weight [N_, K_] of one expert
		}{{"gateup", 2 * m.i, m.c}, {"down", m.c, m.i}} {
			w := fastRandomBF16(t, g, 1, 0.05, m.e, p.n, p.k)
			x := fastRandomBF16(t, g, 2, 1, s, p.k)
			dy := fastRandomBF16(t, g, 3, 1, s, p.n)
			y, _ := g.Empty(tensor.BF16, s, p.n)
			dx, _ := g.Empty(tensor.BF16, s, p.k)
			dw, _ := g.Alloc(tensor.F32, m.e, p.n, p.k)
			flops := 2 * float64(s) * float64(p.n) * float64(p.k)
			values := map[string]float64{"gflop": flops / 1e9}
			for _, kc := range []struct {
				kind backend.GroupedKind
				args backend.GroupedGEMMArgs
				// the dense GEMM of the same sizes and operand layout
				dense backend.GEMMArgs
			}{
				{backend.GroupedForward, backend.GroupedGEMMArgs{A: x, B: w, Out: y},
					backend.GEMMArgs{A: x, B: mustRows(t, w, p.n), C: y, TransB: true, Alpha: 1}},
				{backend.GroupedInputGrad, backend.GroupedGEMMArgs{A: dy, B: w, Out: dx},
					backend.GEMMArgs{A: dy, B: mustRows(t, w, p.n), C: dx, Alpha: 1}},
				{backend.GroupedWeightGrad, backend.GroupedGEMMArgs{A: dy, B: x, Out: dw, Accumulate: true},
					backend.GEMMArgs{A: dy, B: x, C: mustRows(t, dw, p.n), TransA: true, Alpha: 1, Beta: 1}},
			} {
				a := kc.args
				a.Kind, a.Offsets = kc.kind, off
				dense := kc.dense
				dms := timeIt(t, g, 5, func() error { return g.GEMM(dense) })
				dtf := flops / (dms * 1e-3) / 1e12
				values["dense_tflops_"+kc.kind.String()] = dtf
				for _, impl := range groupedImpls(g.d.info.KernelArch) {
					prev := g.groupedWG
					g.groupedWG = impl
					if impl == "mma" {
						g.groupedWG = ""
					}
					ms := timeIt(t, g, 5, func() error { return g.GroupedGEMM(a) })
					g.groupedWG = prev
					tf := flops / (ms * 1e-3) / 1e12
					values["tflops_"+impl+"_"+kc.kind.String()] = tf
					t.Logf("%s %s %-11s S=%d N_=%d K_=%d G=%d: grouped %s %.3f ms %.1f TFLOP/s; dense cuBLASLt %.3f ms %.1f TFLOP/s (%.0f%%)",
						m.name, p.name, kc.kind, s, p.n, p.k, m.e, impl, ms, tf, dms, dtf, 100*tf/dtf)
				}
			}
			report.addBench(benchmark{Name: fmt.Sprintf("grouped_gemm_%s_%s_%dtok", m.name, p.name, tokens), Values: values,
				Note: "bf16 in, fp32 accumulate; forward and input grad bf16 out, weight grad f32 +=; random routing; dense = one cuBLASLt GEMM of the same sizes; median of 5 x 5 calls timed with CUDA events"})
			for _, tt := range []tensor.Tensor{w, x, dy, y, dx, dw} {
				g.Free(tt)
			}
		}
		g.Free(off)
	}
}

// mustRows views the first n rows of the flattened leading dimensions of t as a 2-D matrix:
// one expert's [N_, K_] weight out of [G, N_, K_].
func mustRows(t *testing.T, x tensor.Tensor, n int) tensor.Tensor {
	t.Helper()
	v, err := x.View(0, n, x.Dim(x.Rank()-1))
	if err != nil {
		t.Fatal(err)
	}
	return v
}
