package cuda

import (
	"testing"

	"github.com/halo-shell/halo-shell/engine/backend"
	"github.com/halo-shell/halo-shell/engine/tensor"
)

// TestGPUAttentionBackwardPartsRunAlone shows attnOverride.bwdOnly taking effect, which only the
// GPU can: with "dq" the backward writes dQ and leaves dK and dV as they were, with "dkv" the
// reverse, and with "dl" (the Hopper kernels' per-row pass alone) it writes none of them; unset,
// it writes all three. Each family that takes the override runs: the mma.sync kernels and, on
// sm_90, the warpgroup kernels.
func TestGPUAttentionBackwardPartsRunAlone(t *testing.T) {
	g := gpu(t)
	saved := g.backendOptions
	defer func() { g.backendOptions = saved }()
	const N, NH, NKV, HD = 256, 2, 1, 64
	q := randomTensor(t, g, 11, tensor.BF16, 1, N, NH*HD)
	k := randomTensor(t, g, 12, tensor.BF16, 1, N, NKV*HD)
	v := randomTensor(t, g, 13, tensor.BF16, 1, N, NKV*HD)
	dout := randomTensor(t, g, 14, tensor.BF16, 1, N, NH*HD)
	cu, err := backend.FromInt32(g, cuSeqlens(N), 2)
	if err != nil {
		t.Fatal(err)
	}
	out, _ := g.Alloc(tensor.BF16, N, NH*HD)
	lse, _ := g.Alloc(tensor.F32, N, NH)
	dq, _ := g.Alloc(tensor.BF16, N, NH*HD)
	dk, _ := g.Alloc(tensor.BF16, N, NKV*HD)
	dv, _ := g.Alloc(tensor.BF16, N, NKV*HD)
	defer func() {
		for _, x := range []tensor.Tensor{q, k, v, dout, cu, out, lse, dq, dk, dv} {
			g.Free(x)
		}
	}()
	sh := backend.AttentionShape{CuSeqlens: cu, NH: NH, NKV: NKV, HD: HD}
	const sentinel = 1000 // exact in bf16; no gradient of these inputs comes near it
	// written reports whether the backward replaced t's sentinel values (most of them: a
	// gradient element may be 0 but not 1000) or left every one.
	written := func(t *testing.T, name string, x tensor.Tensor) bool {
		t.Helper()
		vals, err := backend.ToFloat32(g, x)
		if err != nil {
			t.Fatal(err)
		}
		changed := 0
		for _, e := range vals {
			if e != sentinel {
				changed++
			}
		}
		if changed != 0 && changed < len(vals)/2 {
			t.Fatalf("%s: %d of %d elements written: neither left alone nor computed", name, changed, len(vals))
		}
		return changed > 0
	}
	families := []struct {
		name  string
		wg    bool
		parts map[string][3]bool // bwdOnly -> dQ, dK, dV written
	}{
		{"mma", false, map[string][3]bool{"": {true, true, true}, "dq": {true, false, false}, "dkv": {false, true, true}}},
		{"wgmma", true, map[string][3]bool{"": {true, true, true}, "dq": {true, false, false}, "dkv": {false, true, true}, "dl": {false, false, false}}},
	}
	for _, f := range families {
		t.Run(f.name, func(t *testing.T) {
			if f.wg && !wgArch(g.d.info.KernelArch) {
				t.Skipf("no warpgroup kernels when building for %s (sm_90 only)", g.d.info.KernelArch)
			}
			g.backendOptions = defaultBackendOptions(g.d.info.KernelArch)
			g.attnWG = f.wg
			if err := g.Attention(backend.AttentionArgs{AttentionShape: sh, Out: out, LSE: lse, Q: q, K: k, V: v}); err != nil {
				t.Fatal(err)
			}
			if err := g.MMAError(); err != nil {
				t.Fatalf("tensor-core kernels unavailable: %v", err)
			}
			if err := g.WGError(); f.wg && err != nil {
				t.Fatalf("warpgroup kernels unavailable: %v", err)
			}
			for only, want := range f.parts {
				for _, x := range []tensor.Tensor{dq, dk, dv} {
					if err := g.Fill(x, sentinel); err != nil {
						t.Fatal(err)
					}
				}
				g.attnOverride.bwdOnly = only
				if err := g.AttentionBackward(backend.AttentionBackwardArgs{AttentionShape: sh, DQ: dq, DK: dk, DV: dv,
					DOut: dout, Q: q, K: k, V: v, Out: out, LSE: lse}); err != nil {
					t.Fatal(err)
				}
				got := [3]bool{written(t, "dQ", dq), written(t, "dK", dk), written(t, "dV", dv)}
				if got != want {
					t.Errorf("bwdOnly %q: dQ, dK, dV written %v, want %v", only, got, want)
				}
			}
		})
	}
}
