package backend

import (
	"fmt"
	"sort"
	"strconv"
	"strings"
	"sync"
)

// Factory opens device number index of one kind (e.g. cuda device 1). It returns an error that
// says what is missing (library, driver, device) when the device cannot be used.
type Factory func(index int) (Backend, error)

var (
	regMu    sync.Mutex
	registry = map[string]Factory{}
)

// Register makes a backend kind ("cpu", "cuda") available to Open. Backend packages call it
// from init; registering a kind twice replaces the earlier factory.
func Register(kind string, f Factory) {
	regMu.Lock()
	defer regMu.Unlock()
	registry[kind] = f
}

// Kinds lists the registered backend kinds, sorted.
func Kinds() []string {
	regMu.Lock()
	defer regMu.Unlock()
	var ks []string
	for k := range registry {
		ks = append(ks, k)
	}
	sort.Strings(ks)
	return ks
}

// Get is Open: it returns the backend for a device name.
func Get(name string) (Backend, error) { return Open(name) }

// Open returns a backend for a device name: "cpu", "cuda" (device 0), "cuda:N", or "auto"
// (the first GPU kind that opens, else the CPU). The kind's package must be linked in (imported
// for its side effect of registering).
func Open(device string) (Backend, error) {
	b, _, err := Resolve(device)
	return b, err
}

// Resolve is Open that also returns a note explaining a fallback taken by "auto" (empty when
// none was needed), e.g. "cuda unavailable: libcuda.so.1 not found; using cpu".
func Resolve(device string) (Backend, string, error) {
	device = strings.TrimSpace(strings.ToLower(device))
	if device == "" || device == "auto" {
		var notes []string
		for _, kind := range []string{"cuda"} {
			f := lookup(kind)
			if f == nil {
				notes = append(notes, kind+" support not built in")
				continue
			}
			b, err := f(0)
			if err == nil {
				return capped(b)
			}
			notes = append(notes, fmt.Sprintf("%s unavailable: %v", kind, err))
		}
		f := lookup("cpu")
		if f == nil {
			return nil, "", fmt.Errorf("backend: device auto: no backend registered (import engine/backend/cpu)")
		}
		b, err := f(0)
		if err != nil {
			return nil, "", err
		}
		b, _, err = capped(b)
		return b, strings.Join(notes, "; ") + "; using cpu", err
	}
	kind, idx := device, 0
	if i := strings.IndexByte(device, ':'); i >= 0 {
		kind = device[:i]
		n, err := strconv.Atoi(device[i+1:])
		if err != nil || n < 0 {
			return nil, "", fmt.Errorf("backend: device %q: index after ':' must be a non-negative integer", device)
		}
		idx = n
	}
	f := lookup(kind)
	if f == nil {
		return nil, "", fmt.Errorf("backend: device %q: unknown kind %q (registered: %s; valid names: cpu, cuda, cuda:N, auto)",
			device, kind, strings.Join(Kinds(), ", "))
	}
	b, err := f(idx)
	if err != nil {
		return nil, "", fmt.Errorf("backend: device %q: %w", device, err)
	}
	return capped(b)
}

// capped applies HALO_DEVICE_MEMORY_GIB to a device just opened, closing it on failure.
func capped(b Backend) (Backend, string, error) {
	if err := envMemoryCap(b); err != nil {
		_ = b.Close()
		return nil, "", err
	}
	return b, "", nil
}

func lookup(kind string) Factory {
	regMu.Lock()
	defer regMu.Unlock()
	return registry[kind]
}
