package cuda

import "github.com/halo-shell/halo-shell/engine/backend"

// Optional implements backend.Backend: the CUDA backend has every optional capability, the fused
// AddRMSNorm and AdamW kernels and the CUDA-event DeviceTimer (timer.go).
func (b *Backend) Optional() backend.Optional {
	return backend.Optional{AddRMSNorm: b.AddRMSNorm, AdamW: b.AdamW, Timer: b}
}
