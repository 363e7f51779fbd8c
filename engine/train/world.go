package train

import (
	"fmt"

	"github.com/halo-shell/halo-shell/engine/backend"
	"github.com/halo-shell/halo-shell/engine/backend/cuda"
	"github.com/halo-shell/halo-shell/engine/comm"
	"github.com/halo-shell/halo-shell/engine/comm/nccl"
	"github.com/halo-shell/halo-shell/engine/mesh"
	"github.com/halo-shell/halo-shell/engine/profile"
)

// worldFor returns how a plan on devices d makes its communicators: NCCL over several GPUs,
// nil (the plan's in-process world) for CPU devices and for a single GPU.
func worldFor(d mesh.Devices) func([]backend.Backend) (comm.Fabric, error) {
	if d.Kind != "cuda" || d.Len() < 2 {
		return nil
	}
	return func(devs []backend.Backend) (comm.Fabric, error) { return ncclWorld(d, devs) }
}

// ncclWorld makes one NCCL world over the GPUs of devs (profile-wrapped or not).
func ncclWorld(d mesh.Devices, devs []backend.Backend) (comm.Fabric, error) {
	gpus, err := cudaBackends(d, devs)
	if err != nil {
		return nil, err
	}
	w, err := nccl.NewLocalWorld(gpus)
	if err != nil {
		return nil, fmt.Errorf("train: devices %s: %w", d, err)
	}
	return w.Fabric(), nil
}

// cudaBackends returns the CUDA backends under devs (profile-wrapped or not), or an error
// naming the first rank whose device is not a GPU.
func cudaBackends(d mesh.Devices, devs []backend.Backend) ([]*cuda.Backend, error) {
	gpus := make([]*cuda.Backend, len(devs))
	for r, b := range devs {
		if _, inner, ok := profile.Unwrap(b); ok {
			b = inner
		}
		g, ok := b.(*cuda.Backend)
		if !ok {
			return nil, fmt.Errorf("train: devices %s: rank %d's device is %s, not a CUDA GPU: NCCL communicators need cuda devices", d, r, b.Name())
		}
		gpus[r] = g
	}
	return gpus, nil
}
