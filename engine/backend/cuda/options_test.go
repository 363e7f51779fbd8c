package cuda

import (
	"strconv"
	"testing"
)

// TestNormBwdOptionsTakeEffect shows each of a Backend's RMSNorm backward options changing the
// plan RMSNormBackward launches: the grid bound for rows of up to 1024 and of up to 2048
// elements, and the choice of the weight-gradient form for the latter.
func TestNormBwdOptionsTakeEffect(t *testing.T) {
	b := fakeBackend(t)
	if d := defaultNormBwdOptions(); b.normBwd != d || d != (normBwdOptions{blocksPerSM: 2, blocksPerSMWide: 1, sharedDW: true}) {
		t.Fatalf("a new backend's normBwd = %+v, defaults %+v; want 2 and 1 blocks per SM with shared dW sums", b.normBwd, d)
	}
	cases := []struct {
		name   string
		set    func(o *normBwdOptions)
		C      int
		kernel string
		perSM  int
	}{
		{"defaults, C=1024", func(*normBwdOptions) {}, 1024, "rmsnorm_bwd_bf16x8_c1024", 2},
		{"defaults, C=2048", func(*normBwdOptions) {}, 2048, "rmsnorm_bwd_bf16x8_c2048s", 2},
		{"blocksPerSM", func(o *normBwdOptions) { o.blocksPerSM = 8 }, 1024, "rmsnorm_bwd_bf16x8_c1024", 8},
		{"blocksPerSM leaves wide rows", func(o *normBwdOptions) { o.blocksPerSM = 8 }, 2048, "rmsnorm_bwd_bf16x8_c2048s", 2},
		{"blocksPerSMWide", func(o *normBwdOptions) { o.blocksPerSMWide = 3 }, 2048, "rmsnorm_bwd_bf16x8_c2048s", 6},
		{"register dW sums", func(o *normBwdOptions) { o.sharedDW = false }, 2048, "rmsnorm_bwd_bf16x8_c2048", 1},
		{"register dW sums leave narrow rows", func(o *normBwdOptions) { o.sharedDW = false }, 512, "rmsnorm_bwd_bf16x8_c1024", 2},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			b.normBwd = defaultNormBwdOptions()
			c.set(&b.normBwd)
			if p := b.normBwd.plan(c.C); p.kernel != c.kernel || p.perSM != c.perSM {
				t.Errorf("plan(%d) = %+v, want kernel %s at %d blocks per SM", c.C, p, c.kernel, c.perSM)
			}
		})
	}
}

// TestAttnOverridesTakeEffect shows a Backend's attention overrides replacing the measured tile
// shapes and Hopper kernels for the head dims they name, and only those.
func TestAttnOverridesTakeEffect(t *testing.T) {
	b := fakeBackend(t)
	for _, hd := range []int{64, 128} {
		if got := b.tiles(hd); got != attnDefaultTiles[hd] {
			t.Errorf("tiles(%d) = %+v without an override, want the default %+v", hd, got, attnDefaultTiles[hd])
		}
		for _, kind := range []string{"fwd", "dq", "dkv"} {
			if got, want := b.wgPick(kind, hd), wgDefault[kind+"/"+strconv.Itoa(hd)]; got != want || want.Kind != kind {
				t.Errorf("wgPick(%s, %d) = %+v without an override, want the default %+v", kind, hd, got, want)
			}
		}
	}
	alt := attnTiles{FwdW: 4, FwdMT: 1, FwdBK: 64, DQW: 8, DQBK: 64, DKVW: 8, DKVBQ: 64}
	if alt == attnDefaultTiles[64] {
		t.Fatal("the override must differ from the default to show anything")
	}
	if err := checkTiles(64, alt); err != nil {
		t.Fatalf("override tiles are not compiled: %v", err)
	}
	capped := wgKernel{"dq", 64, 64, 1}
	if capped == wgDefault["dq/64"] {
		t.Fatal("the override must differ from the default to show anything")
	}
	b.attnOverride = attnOverrides{tiles: map[int]attnTiles{64: alt}, wg: map[string]wgKernel{"dq/64": capped}}
	if got := b.tiles(64); got != alt {
		t.Errorf("tiles(64) = %+v, want the override %+v", got, alt)
	}
	if got := b.tiles(128); got != attnDefaultTiles[128] {
		t.Errorf("tiles(128) = %+v, want the default: the override names head dim 64 only", got)
	}
	if got := b.wgPick("dq", 64); got != capped {
		t.Errorf("wgPick(dq, 64) = %+v, want the override %+v", got, capped)
	}
	if got := b.wgPick("dkv", 64); got != wgDefault["dkv/64"] {
		t.Errorf("wgPick(dkv, 64) = %+v, want the default: the override names dq/64 only", got)
	}
	if other := fakeBackend(t); other.tiles(64) != attnDefaultTiles[64] || other.wgPick("dq", 64) != wgDefault["dq/64"] {
		t.Error("one backend's overrides changed another's choices")
	}
}
