package switches

// The variables the benchmark and GPU scripts read (scripts/gpu). The binary never reads them;
// they are declared here so that a script's caller setting one gets no unknown-switch warning
// from the halo-shell processes the script starts, and so that SWITCHES.md lists them.
var (
	_ = Register(Switch{Name: "HALO_BIN", Kind: Script, Default: "bin/halo-shell",
		Doc: "The halo-shell binary the benchmark scripts run (scripts/gpu/bench.sh, moe-bench.sh)."})
	_ = Register(Switch{Name: "HALO_REVISION", Kind: Script,
		Doc: "The source revision the benchmark scripts record in their reports; unset, `git rev-parse HEAD` (stale or missing in a copied tree)."})
	_ = Register(Switch{Name: "HALO_BENCH_TRACE", Kind: Script, Values: []string{"0", "1"}, Default: "0",
		Doc: "1 makes the benchmark scripts also write halo-shell's profiled step as a Chrome/Perfetto trace (halo-trace.json per shape)."})
)
