package train

import (
	"strings"
	"testing"

	"github.com/halo-shell/halo-shell/engine/backend"
	"github.com/halo-shell/halo-shell/engine/backend/cpu"
	"github.com/halo-shell/halo-shell/engine/comm/nccl"
	"github.com/halo-shell/halo-shell/engine/mesh"
	"github.com/halo-shell/halo-shell/engine/profile"
)

func TestSeveralGPUsUseNCCLAndOtherDevicesTheInProcessWorld(t *testing.T) {
	for _, c := range []struct {
		devices string
		nccl    bool
	}{
		{"cpu", false}, {"cpu:4", false}, {"cuda:0", false}, {"cuda:3", false}, {"cuda:0-1", true}, {"cuda:0-7", true},
	} {
		d, err := mesh.ParseDevices(c.devices)
		if err != nil {
			t.Fatal(err)
		}
		if got := worldFor(d) != nil; got != c.nccl {
			t.Errorf("devices %s: NCCL world %v, want %v", c.devices, got, c.nccl)
		}
	}
}

func TestNCCLWorldRefusesDevicesThatAreNotGPUs(t *testing.T) {
	d, err := mesh.ParseDevices("cuda:0-1")
	if err != nil {
		t.Fatal(err)
	}
	devs := []backend.Backend{cpu.New(cpu.Options{Workers: 1}), profile.Wrap(cpu.New(cpu.Options{Workers: 1}), profile.NewRecorder())}
	defer func() {
		for _, b := range devs {
			b.Close()
		}
	}()
	_, err = worldFor(d)(devs)
	if err == nil || !strings.Contains(err.Error(), "rank 0's device is cpu") || !strings.Contains(err.Error(), "not a CUDA GPU") {
		t.Fatalf("got %v, want rank 0 named as not a CUDA GPU", err)
	}
	_, err = worldFor(d)(devs[1:])
	if err == nil || !strings.Contains(err.Error(), "rank 0's device is cpu") {
		t.Fatalf("profile-wrapped CPU device: got %v", err)
	}
}

// The NCCL world across nodes refuses devices that are not GPUs before it touches NCCL,
// naming the node's devices and the rank.
func TestNCCLNodeWorldRefusesDevicesThatAreNotGPUs(t *testing.T) {
	d, err := mesh.ParseDevices("cuda:2-3")
	if err != nil {
		t.Fatal(err)
	}
	devs := []backend.Backend{profile.Wrap(cpu.New(cpu.Options{Workers: 1}), profile.NewRecorder())}
	defer devs[0].Close()
	var id nccl.UniqueID
	_, err = ncclNodeWorld(d, devs, id, 4, 2)
	if err == nil || !strings.Contains(err.Error(), "devices cuda:2-3: rank 0's device is cpu, not a CUDA GPU") {
		t.Fatalf("got %v, want the node's devices and rank 0 named as not a CUDA GPU", err)
	}
}
