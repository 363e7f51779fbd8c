package safetensors

import (
	"fmt"
	"math"
	"strconv"
	"strings"
)

// ParseSize reads a shard size as transformers' max_shard_size takes it: a number of bytes, or
// a number with a unit, decimal (KB, MB, GB, TB: powers of 1000) or binary (KiB, MiB, GiB, TiB:
// powers of 1024), case-insensitive, e.g. "5GB", "500MiB", "1.5GB", "4096".
func ParseSize(s string) (int64, error) {
	t := strings.TrimSpace(s)
	units := []struct {
		suffix string
		mult   float64
	}{
		{"KIB", 1 << 10}, {"MIB", 1 << 20}, {"GIB", 1 << 30}, {"TIB", 1 << 40},
		{"KB", 1e3}, {"MB", 1e6}, {"GB", 1e9}, {"TB", 1e12}, {"B", 1},
	}
	mult := 1.0
	up := strings.ToUpper(t)
	for _, u := range units {
		if strings.HasSuffix(up, u.suffix) {
			mult = u.mult
			t = strings.TrimSpace(t[:len(t)-len(u.suffix)])
			break
		}
	}
	v, err := strconv.ParseFloat(t, 64)
	if err != nil || !(v > 0) || math.IsInf(v, 0) || v*mult >= math.MaxInt64 {
		return 0, fmt.Errorf("safetensors: size %q: want a positive number of bytes, optionally with a unit (KB, MB, GB, TB, KiB, MiB, GiB, TiB), e.g. 5GB", s)
	}
	n := int64(v * mult)
	if n < 1 {
		return 0, fmt.Errorf("safetensors: size %q is less than one byte", s)
	}
	return n, nil
}
