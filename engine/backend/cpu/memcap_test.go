package cpu

import (
	"strings"
	"testing"

	"github.com/halo-shell/halo-shell/engine/backend"
	"github.com/halo-shell/halo-shell/engine/tensor"
)

// TestDeviceMemoryCap: HALO_DEVICE_MEMORY_GIB caps a device opened by name, and
// backend.LimitMemory (the run's max_device_memory_gib) caps an open one; an allocation past
// the cap fails with the out-of-memory error naming the setting, one below it succeeds.
func TestDeviceMemoryCap(t *testing.T) {
	t.Run("environment", func(t *testing.T) {
		t.Setenv("HALO_DEVICE_MEMORY_GIB", "0.001") // 1073741 bytes
		b, err := backend.Open("cpu")
		if err != nil {
			t.Fatal(err)
		}
		defer b.Close()
		if got := b.MemStats().Total; got != 1073741 {
			t.Errorf("Total = %d, want the cap 1073741", got)
		}
		small, err := b.Alloc(tensor.U8, 512<<10)
		if err != nil {
			t.Fatalf("an allocation below the cap failed: %v", err)
		}
		_, err = b.Alloc(tensor.U8, 600<<10)
		if err == nil || !strings.Contains(err.Error(), "out of memory") || !strings.Contains(err.Error(), "HALO_DEVICE_MEMORY_GIB") {
			t.Fatalf("allocation past the cap: %v, want an out-of-memory error naming HALO_DEVICE_MEMORY_GIB", err)
		}
		must(t, b.Free(small))
		if _, err := b.Alloc(tensor.U8, 600<<10); err != nil {
			t.Errorf("after a free the allocation fits: %v", err)
		}
	})
	t.Run("run key", func(t *testing.T) {
		b := New(Options{Workers: 1})
		defer b.Close()
		must(t, backend.LimitMemory(b, 24, "max_device_memory_gib"))
		if got := b.MemStats().Total; got != 24<<30 {
			t.Errorf("Total = %d, want 24 GiB", got)
		}
		_, err := b.Alloc(tensor.BF16, 13<<30) // 26 GiB
		if err == nil || !strings.Contains(err.Error(), "max_device_memory_gib") {
			t.Fatalf("a 26 GiB allocation under a 24 GiB cap: %v", err)
		}
	})
	t.Run("bad values", func(t *testing.T) {
		for _, v := range []string{"lots", "-3", "0", "NaN"} {
			t.Setenv("HALO_DEVICE_MEMORY_GIB", v)
			if b, err := backend.Open("cpu"); err == nil {
				b.Close()
				t.Errorf("HALO_DEVICE_MEMORY_GIB=%s was accepted", v)
			} else if !strings.Contains(err.Error(), "HALO_DEVICE_MEMORY_GIB") {
				t.Errorf("HALO_DEVICE_MEMORY_GIB=%s: error %q does not name the switch", v, err)
			}
		}
		b := New(Options{Workers: 1})
		defer b.Close()
		if err := backend.LimitMemory(b, 0, "max_device_memory_gib"); err == nil {
			t.Error("a zero cap was accepted")
		}
		x := zeros(t, b, tensor.U8, 4096)
		defer b.Free(x)
		if err := b.SetMemoryLimit(1024, "test"); err == nil || !strings.Contains(err.Error(), "already allocated") {
			t.Errorf("a cap below what is allocated: %v", err)
		}
	})
}
