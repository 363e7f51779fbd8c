package safetensors

import "testing"

func TestParseSize(t *testing.T) {
	good := map[string]int64{
		"5GB": 5_000_000_000, "5gb": 5_000_000_000, "500MB": 500_000_000, "3KB": 3000, "2TB": 2e12,
		"1GiB": 1 << 30, "500MiB": 500 << 20, "4kib": 4096, "4096": 4096, "4096B": 4096,
		"1.5GB": 1_500_000_000, " 10 MB ": 10_000_000,
	}
	for in, want := range good {
		if got, err := ParseSize(in); err != nil || got != want {
			t.Errorf("ParseSize(%q) = %d, %v; want %d", in, got, err, want)
		}
	}
	for _, in := range []string{"", "GB", "-1GB", "0", "5XB", "abc", "1e30TB", "0.1B", "NaN"} {
		if got, err := ParseSize(in); err == nil {
			t.Errorf("ParseSize(%q) = %d, want an error", in, got)
		}
	}
}
