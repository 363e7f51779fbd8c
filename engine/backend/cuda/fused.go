package cuda

import "github.com/halo-shell/halo-shell/engine/backend"

// Optional implements backend.Backend: the CUDA backend has every optional capability: the fused
// AddRMSNorm and AdamW kernels, the CUDA-event DeviceTimer (timer.go), the mixture-of-experts
// routing, permutation and combine kernels (moe.go) and the grouped expert products
// (grouped_gemm.go).
func (b *Backend) Optional() backend.Optional {
	return backend.Optional{
		AddRMSNorm: b.AddRMSNorm, AdamW: b.AdamW, Timer: b,
		MoERoute: b.MoERoute, MoERouteBackward: b.MoERouteBackward,
		MoEPermute: b.MoEPermute, MoEPermuteBackward: b.MoEPermuteBackward,
		MoECombine: b.MoECombine, MoECombineBackward: b.MoECombineBackward,
		SwiGLUPacked: b.SwiGLUPacked, SwiGLUPackedBackward: b.SwiGLUPackedBackward,
		GroupedGEMM: b.GroupedGEMM,
	}
}
