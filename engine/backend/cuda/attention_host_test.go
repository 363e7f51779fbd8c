package cuda

import (
	"fmt"
	"regexp"
	"strconv"
	"strings"
	"testing"
)

// TestAttentionVariantsAreCompiled checks, without a GPU, that every tile shape the Go side may
// launch is instantiated in attention_tc.cu and that the defaults are among them.
func TestAttentionVariantsAreCompiled(t *testing.T) {
	src, err := kernelFS.ReadFile("kernels/attention_tc.cu")
	if err != nil {
		t.Fatal(err)
	}
	entries := map[string]bool{}
	for _, m := range regexp.MustCompile(`(?m)^(FWD_MMA|BWD_DQ|BWD_DKV)\(([0-9, ]+)\)`).FindAllStringSubmatch(string(src), -1) {
		var a [5]int
		switch m[1] {
		case "FWD_MMA":
			fmt.Sscanf(m[2], "%d, %d, %d, %d, %d", &a[0], &a[1], &a[2], &a[3], &a[4])
			entries[attnTiles{FwdW: a[1], FwdMT: a[2], FwdBK: a[3]}.fwdName(a[0])] = true
		case "BWD_DQ":
			fmt.Sscanf(m[2], "%d, %d, %d, %d", &a[0], &a[1], &a[2], &a[3])
			entries[attnTiles{DQW: a[1], DQBK: a[2]}.dqName(a[0])] = true
		case "BWD_DKV":
			fmt.Sscanf(m[2], "%d, %d, %d", &a[0], &a[1], &a[2])
			entries[attnTiles{DKVW: a[1], DKVBQ: a[2]}.dkvName(a[0])] = true
		}
	}
	fsrc, err := kernelFS.ReadFile("kernels/attention_fused.cu")
	if err != nil {
		t.Fatal(err)
	}
	fused := map[string]bool{}
	for _, m := range regexp.MustCompile(`(?m)^BWD_FUSED\(([0-9, ]+)\)`).FindAllStringSubmatch(string(fsrc), -1) {
		var a [3]int
		fmt.Sscanf(m[1], "%d, %d, %d", &a[0], &a[1], &a[2])
		fused[attnTiles{DKVW: a[1], DKVBQ: a[2]}.fusedName(a[0])] = true
	}
	if len(entries) == 0 {
		t.Fatal("no FWD_MMA/BWD_DQ/BWD_DKV instantiations found in attention_tc.cu")
	}
	for hd, v := range attnVariants {
		for _, f := range v.fwd {
			if n := (attnTiles{FwdW: f[0], FwdMT: f[1], FwdBK: f[2]}).fwdName(hd); !entries[n] {
				t.Errorf("variant %s is listed but not compiled", n)
			}
		}
		for _, d := range v.dq {
			if n := (attnTiles{DQW: d[0], DQBK: d[1]}).dqName(hd); !entries[n] {
				t.Errorf("variant %s is listed but not compiled", n)
			}
		}
		for _, d := range v.dkv {
			if n := (attnTiles{DKVW: d[0], DKVBQ: d[1]}).dkvName(hd); !entries[n] {
				t.Errorf("variant %s is listed but not compiled", n)
			}
		}
		for _, d := range v.fused {
			if n := (attnTiles{DKVW: d[0], DKVBQ: d[1]}).fusedName(hd); !fused[n] {
				t.Errorf("one-pass backward %s is listed but not compiled in attention_fused.cu", n)
			}
		}
		if !fusedCompiled(hd, attnDefaultTiles[hd]) {
			t.Errorf("head dim %d: no one-pass backward for the default dK/dV tiles", hd)
		}
		def, ok := attnDefaultTiles[hd]
		if !ok {
			t.Errorf("no default tiles for head dim %d", hd)
			continue
		}
		if err := checkTiles(hd, def); err != nil {
			t.Errorf("default: %v", err)
		}
	}
	if err := checkTiles(128, attnTiles{FwdW: 3, FwdMT: 1, FwdBK: 64, DQW: 4, DQBK: 32, DKVW: 4, DKVBQ: 32}); err == nil {
		t.Error("checkTiles accepted a forward with 3 warps, which is not compiled")
	}
}

// TestSIMTAttentionKernels checks, without a GPU, which SIMT kernels each head dim takes and
// their shared memory: the whole-tile kernels up to 256 (as before), the chunked *_wide ones
// from 257 to 512, under 48 KiB so that they need no opt-in and fit every architecture's block,
// none above 512; that every name is an entry point of attention.cu; and that the Go side's
// limits and chunk width are the ones attention.cu is compiled with.
func TestSIMTAttentionKernels(t *testing.T) {
	src, err := kernelSource("attention.cu")
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		hd   int
		fwd  string
		wide bool
		ok   bool
	}{
		{1, "attn_fwd", false, true},
		{96, "attn_fwd", false, true},
		{256, "attn_fwd", false, true},
		{257, "attn_fwd_wide", true, true},
		{300, "attn_fwd_wide", true, true},
		{320, "attn_fwd_wide", true, true},
		{512, "attn_fwd_wide", true, true},
		{513, "", false, false},
		{1024, "", false, false},
		{0, "", false, false},
	} {
		k, ok := simtAttention(tc.hd)
		if ok != tc.ok || k.fwd != tc.fwd {
			t.Errorf("simtAttention(%d) = %q, %v; want %q, %v", tc.hd, k.fwd, ok, tc.fwd, tc.ok)
			continue
		}
		if !ok {
			continue
		}
		if tc.wide != strings.HasSuffix(k.dq, "_wide") || tc.wide != strings.HasSuffix(k.dkv, "_wide") {
			t.Errorf("head dim %d: kernels %q, %q, %q do not all take the same form", tc.hd, k.fwd, k.dq, k.dkv)
		}
		rows := uint32(4 * attnRows * tc.hd) // one [attnRows][hd] fp32 array of the block's rows
		if k.sharedFwd < rows || k.sharedDQ < 2*rows || k.sharedDKV < 2*rows {
			t.Errorf("head dim %d: shared memory %d, %d, %d cannot hold the block's rows", tc.hd, k.sharedFwd, k.sharedDQ, k.sharedDKV)
		}
		if tc.wide {
			for _, n := range []uint32{k.sharedFwd, k.sharedDQ, k.sharedDKV} {
				// The dK/dV kernel adds 2 * attnTile floats of static shared memory.
				if n+4*2*attnTile > 48<<10 {
					t.Errorf("head dim %d: %d bytes of shared memory is above 48 KiB", tc.hd, n)
				}
			}
		}
		for _, name := range []string{k.fwd, k.dq, k.dkv} {
			if !strings.Contains(src, `extern "C" __global__ void `+name+"(") {
				t.Errorf("head dim %d: %s is not an entry point of attention.cu", tc.hd, name)
			}
		}
	}
	for macro, want := range map[string]int{"MAXD": attnNarrowMaxHD / 32, "WMAXD": attnMaxHD / 32, "WCH": attnWideChunk, "TILE": attnTile, "ROWS": attnRows} {
		m := regexp.MustCompile(`(?m)^#define ` + macro + ` ([0-9]+)`).FindStringSubmatch(src)
		if m == nil {
			t.Errorf("attention.cu defines no %s", macro)
			continue
		}
		if got, _ := strconv.Atoi(m[1]); got != want {
			t.Errorf("attention.cu: %s is %d; the Go side assumes %d", macro, got, want)
		}
	}
	if attnWideChunk%32 != 0 || attnMaxHD%attnWideChunk != 0 {
		t.Errorf("chunk width %d must be a multiple of 32 that divides %d", attnWideChunk, attnMaxHD)
	}
}
