package nn

import "github.com/halo-shell/halo-shell/internal/switches"

// swMoEPath chooses how MoE blocks run where both paths can.
var swMoEPath = switches.Register(switches.Switch{Name: "HALO_MOE_PATH", Kind: switches.Tuning,
	Default: "device", Values: []string{"device", "composed"},
	Doc: "How MoE blocks run where the backend has the MoE ops and grouped GEMM: device (routing, sort, grouped expert GEMMs and combine on the device) or composed (host routing, one GEMM per expert; the reference)."})
