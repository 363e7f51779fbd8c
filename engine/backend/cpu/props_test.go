package cpu

import (
	"os"
	"path/filepath"
	"testing"
)

func TestLastLevelCache(t *testing.T) {
	dir := t.TempDir()
	write := func(index, level, typ, size string) {
		d := filepath.Join(dir, index)
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
		for name, v := range map[string]string{"level": level, "type": typ, "size": size} {
			if err := os.WriteFile(filepath.Join(d, name), []byte(v+"\n"), 0o644); err != nil {
				t.Fatal(err)
			}
		}
	}
	if got := lastLevelCache(dir); got != 0 {
		t.Fatalf("no caches: got %d, want 0", got)
	}
	write("index0", "1", "Data", "32K")
	write("index1", "1", "Instruction", "64K")
	if got := lastLevelCache(dir); got != 32<<10 {
		t.Fatalf("L1 only: got %d, want %d (the instruction cache is not a data cache)", got, 32<<10)
	}
	write("index2", "2", "Unified", "512K")
	write("index3", "3", "Unified", "32768K")
	if got := lastLevelCache(dir); got != 32<<20 {
		t.Fatalf("L3: got %d, want %d", got, 32<<20)
	}
}

func TestParseCacheSize(t *testing.T) {
	for _, c := range []struct {
		in   string
		want int64
	}{{"32K", 32 << 10}, {"1M", 1 << 20}, {"2G", 2 << 30}, {"4096", 4096}, {"", 0}, {"abcK", 0}, {"-1K", 0}} {
		if got := parseCacheSize(c.in); got != c.want {
			t.Errorf("parseCacheSize(%q) = %d, want %d", c.in, got, c.want)
		}
	}
}

func TestDeviceProps(t *testing.T) {
	b := New(Options{Workers: 2})
	defer b.Close()
	p := b.DeviceProps()
	if p.Units != b.Workers() {
		t.Fatalf("Units %d, want the %d workers", p.Units, b.Workers())
	}
	if p.CacheBytes < 0 {
		t.Fatalf("CacheBytes %d < 0", p.CacheBytes)
	}
}
