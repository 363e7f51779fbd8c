package backend_test

import (
	"strings"
	"testing"

	"github.com/halo-shell/halo-shell/engine/backend"
	_ "github.com/halo-shell/halo-shell/engine/backend/cpu"
)

func TestOpenResolvesDeviceNames(t *testing.T) {
	for _, tc := range []struct {
		device  string
		name    string
		wantErr string
	}{
		{"cpu", "cpu", ""},
		{" CPU ", "cpu", ""},
		{"auto", "cpu", ""}, // no GPU kind usable in unit tests: falls back to cpu
		{"cpu:1", "", "one cpu device"},
		{"cuda:x", "", "non-negative integer"},
		{"tpu", "", `unknown kind "tpu"`},
	} {
		b, err := backend.Open(tc.device)
		if tc.wantErr != "" {
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
				t.Errorf("Open(%q) error = %v, want it to mention %q", tc.device, err, tc.wantErr)
			}
			continue
		}
		if err != nil {
			t.Errorf("Open(%q): %v", tc.device, err)
			continue
		}
		if b.Name() != tc.name {
			t.Errorf("Open(%q).Name() = %q, want %q", tc.device, b.Name(), tc.name)
		}
		b.Close()
	}
}

func TestResolveAutoExplainsFallback(t *testing.T) {
	b, note, err := backend.Resolve("auto")
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	if b.Name() == "cpu" && !strings.Contains(note, "using cpu") {
		t.Fatalf("auto fell back to cpu with note %q; want an explanation", note)
	}
}

func TestSRBitsDependsOnEveryKey(t *testing.T) {
	base := backend.SRBits(1, 2, 3, 0, 4)
	if backend.SRBits(1, 2, 3, 0, 4) != base {
		t.Fatal("SRBits is not deterministic")
	}
	for name, v := range map[string]uint32{
		"seed": backend.SRBits(9, 2, 3, 0, 4), "step": backend.SRBits(1, 9, 3, 0, 4),
		"param": backend.SRBits(1, 2, 9, 0, 4), "role": backend.SRBits(1, 2, 3, 1, 4), "element": backend.SRBits(1, 2, 3, 0, 9),
	} {
		if v == base {
			t.Errorf("changing the %s does not change the bits", name)
		}
	}
	// The low 16 bits drive rounding: they must be close to uniform.
	var ones [16]int
	const n = 1 << 14
	for e := uint64(0); e < n; e++ {
		r := backend.SRBits(7, 1, 0, 0, e)
		for k := 0; k < 16; k++ {
			ones[k] += int(r>>k) & 1
		}
	}
	for k, c := range ones {
		if c < n/2-400 || c > n/2+400 {
			t.Errorf("bit %d set %d times in %d draws", k, c, n)
		}
	}
}
