package cuda

import (
	"fmt"
	"regexp"
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
