package cpu

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"

	"github.com/halo-shell/halo-shell/engine/backend"
)

// cacheDir is where Linux describes the caches of the first CPU.
const cacheDir = "/sys/devices/system/cpu/cpu0/cache"

var (
	llcOnce  sync.Once
	llcBytes int64
)

// DeviceProps implements backend.PropsReporter: the worker threads, and the largest cache level
// of the first CPU as Linux reports it (0 elsewhere).
func (b *Backend) DeviceProps() backend.DeviceProps {
	llcOnce.Do(func() { llcBytes = lastLevelCache(cacheDir) })
	return backend.DeviceProps{Units: b.Workers(), CacheBytes: llcBytes}
}

// lastLevelCache returns the size of the highest-level data or unified cache described under
// dir (index*/level, type, size as sysfs writes them: "32768K"), or 0 when none can be read.
func lastLevelCache(dir string) int64 {
	entries, _ := filepath.Glob(filepath.Join(dir, "index*"))
	bestLevel, best := 0, int64(0)
	for _, e := range entries {
		read := func(name string) string {
			b, err := os.ReadFile(filepath.Join(e, name))
			if err != nil {
				return ""
			}
			return strings.TrimSpace(string(b))
		}
		if t := read("type"); t != "Data" && t != "Unified" {
			continue
		}
		level, err := strconv.Atoi(read("level"))
		if err != nil {
			continue
		}
		size := parseCacheSize(read("size"))
		if size > 0 && (level > bestLevel || level == bestLevel && size > best) {
			bestLevel, best = level, size
		}
	}
	return best
}

// parseCacheSize reads a sysfs cache size: a number of bytes with an optional K, M or G suffix
// (powers of 1024); 0 when it is not one.
func parseCacheSize(s string) int64 {
	mult := int64(1)
	switch {
	case strings.HasSuffix(s, "K"):
		mult, s = 1<<10, strings.TrimSuffix(s, "K")
	case strings.HasSuffix(s, "M"):
		mult, s = 1<<20, strings.TrimSuffix(s, "M")
	case strings.HasSuffix(s, "G"):
		mult, s = 1<<30, strings.TrimSuffix(s, "G")
	}
	n, err := strconv.ParseInt(s, 10, 64)
	if err != nil || n <= 0 {
		return 0
	}
	return n * mult
}
