package cuda

import "github.com/halo-shell/halo-shell/engine/backend"

// Optional implements backend.Backend: the fused AddRMSNorm and AdamW kernels, the CUDA-event
// DeviceTimer (timer.go), the host-wait counter (sync_count.go), the grouped expert products
// (grouped_gemm.go), NF4 dequantisation (nf4.go), dropout (dropout.go), the short convolution (shortconv.go), the gated delta rule (gated_delta.go), the gated delta-net stages around it (gated_delta_stages.go) and the decoding step's attention and sampler (decode.go); unless HALO_CUDA_MOE_KERNELS=off also the mixture-of-experts routing,
// permutation, combine and packed SwiGLU and GeGLU kernels (moe.go), which engine/nn needs, with
// GroupedGEMM, for its device MoE path.
func (b *Backend) Optional() backend.Optional {
	o := backend.Optional{AddRMSNorm: b.AddRMSNorm, AdamW: b.AdamW, Timer: b, Syncs: b, GroupedGEMM: b.GroupedGEMM,
		DequantNF4: b.DequantNF4, Dropout: b.Dropout, DecodeAttention: b.DecodeAttention, SampleTokens: b.SampleTokens,
		ShortConv: b.ShortConv, ShortConvBackward: b.ShortConvBackward,
		GatedDelta: b.GatedDelta, GatedDeltaBackward: b.GatedDeltaBackward,
		GatedDeltaPrep: b.GatedDeltaPrep, GatedDeltaPrepBackward: b.GatedDeltaPrepBackward,
		GatedRMSNorm: b.GatedRMSNorm, GatedRMSNormBackward: b.GatedRMSNormBackward}
	if b.moeKernels {
		o.MoERoute, o.MoERouteBackward = b.MoERoute, b.MoERouteBackward
		o.MoEPermute, o.MoEPermuteBackward = b.MoEPermute, b.MoEPermuteBackward
		o.MoECombine, o.MoECombineBackward = b.MoECombine, b.MoECombineBackward
		o.SwiGLUPacked, o.SwiGLUPackedBackward = b.SwiGLUPacked, b.SwiGLUPackedBackward
		o.GeGLUPacked, o.GeGLUPackedBackward = b.GeGLUPacked, b.GeGLUPackedBackward
	}
	o.DSV4 = dsv4Ops(b)
	return o
}
