package backend

import (
	"fmt"
	"math"
	"strconv"
	"strings"

	"github.com/halo-shell/halo-shell/internal/switches"
)

// A device memory cap makes a backend's allocator refuse, with its usual out-of-memory error,
// any allocation past a number of bytes below what the device has, so that a smaller device (a
// 24 GB consumer GPU, say) can be emulated on a larger one, or on the CPU. It comes from the
// run's max_device_memory_gib (engine/train) or, for every device opened by Open and Resolve,
// from HALO_DEVICE_MEMORY_GIB; the run's key wins where both are set.

var swDeviceMemory = switches.Register(switches.Switch{Name: "HALO_DEVICE_MEMORY_GIB",
	Doc: "Caps every device opened by name (cpu, cuda:N) at this many GiB (a decimal number): allocations past it fail with the out-of-memory error, to emulate a smaller GPU. The run key max_device_memory_gib overrides it."})

// MemoryLimiter is implemented by backends whose allocator can be capped (the CPU and CUDA
// backends). SetMemoryLimit caps the bytes the allocator holds at limit; why names where the
// cap came from, for the out-of-memory message. It fails when more than limit is already in
// use. It is called once, right after the device is opened, before any wrapper is put around
// it, from the goroutine that opened it.
type MemoryLimiter interface {
	SetMemoryLimit(limit int64, why string) error
}

// ParseGiB reads a memory size in GiB (a positive decimal number) as bytes.
func ParseGiB(s string) (int64, error) {
	v, err := strconv.ParseFloat(strings.TrimSpace(s), 64)
	if err != nil || !(v > 0) || v > 1<<24 || math.IsInf(v, 0) {
		return 0, fmt.Errorf("backend: memory size %q: want a positive number of GiB, e.g. 24 or 23.5", s)
	}
	return int64(v * (1 << 30)), nil
}

// LimitMemory caps b at gib GiB; why names the setting for the error message. A backend
// without a cappable allocator is an error that says so.
func LimitMemory(b Backend, gib float64, why string) error {
	if !(gib > 0) {
		return fmt.Errorf("backend: %s = %v: want a positive number of GiB", why, gib)
	}
	l, ok := b.(MemoryLimiter)
	if !ok {
		return fmt.Errorf("backend: %s: the %s backend cannot cap its memory", why, b.Name())
	}
	return l.SetMemoryLimit(int64(gib*(1<<30)), why)
}

// EnvMemoryCap is the cap HALO_DEVICE_MEMORY_GIB sets, in bytes: 0 when it is unset or not a
// number of GiB (opening a device reports the bad value).
func EnvMemoryCap() int64 {
	n, err := ParseGiB(swDeviceMemory.Value())
	if err != nil {
		return 0
	}
	return n
}

// envMemoryCap applies HALO_DEVICE_MEMORY_GIB to a device just opened.
func envMemoryCap(b Backend) error {
	s := swDeviceMemory.Value()
	if s == "" {
		return nil
	}
	n, err := ParseGiB(s)
	if err != nil {
		return fmt.Errorf("HALO_DEVICE_MEMORY_GIB: %w", err)
	}
	l, ok := b.(MemoryLimiter)
	if !ok {
		return fmt.Errorf("backend: HALO_DEVICE_MEMORY_GIB: the %s backend cannot cap its memory", b.Name())
	}
	return l.SetMemoryLimit(n, "HALO_DEVICE_MEMORY_GIB")
}
