package switches

// Switches of the test suites and of the processes tests start. They are declared here, not
// in the test files that read them, so that they are listed with the others.
var (
	CI = Register(Switch{Name: "HALO_CI", Kind: Testing, Values: []string{"1"},
		Doc: "Set by .ci/run: tests that would skip for a missing tool (Jupyter clients, tmux, clang, fetched tokenizer files) fail instead."})
	GPULayoutReport = Register(Switch{Name: "HALO_GPU_LAYOUT_REPORT", Kind: Testing,
		Doc: "File the trainer's GPU layout tests write their JSON report to."})
	NCCLReport = Register(Switch{Name: "HALO_NCCL_REPORT", Kind: Testing,
		Doc: "File the NCCL GPU tests write their bandwidth report to."})
	NCCLSizes = Register(Switch{Name: "HALO_NCCL_SIZES", Kind: Testing,
		Doc: "Comma-separated message sizes in bytes for the NCCL bandwidth test (default: its built-in sweep)."})
	CUDAReport = Register(Switch{Name: "HALO_CUDA_REPORT", Kind: Testing,
		Doc: "File the CUDA GPU tests write cuda-report.json to (scripts/gpu/cuda-tests.sh sets it)."})
	GenerateBenchModel = Register(Switch{Name: "HALO_GENERATE_BENCH_MODEL", Kind: Testing,
		Doc: "Checkpoint directory the CUDA sampling benchmark loads (scripts/gpu/generate-bench.sh sets it to the weights transformers' run saved), instead of random weights."})
	CUDAReportCommand = Register(Switch{Name: "HALO_CUDA_REPORT_COMMAND", Kind: Testing,
		Doc: "The command line recorded in cuda-report.json."})

	PlanChild = Register(Switch{Name: "HALO_PLAN_CHILD", Kind: Plumbing,
		Doc: "Marks a re-executed test binary as one node of the parallel package's multi-process test."})
	TCPChild = Register(Switch{Name: "HALO_TCP_CHILD", Kind: Plumbing,
		Doc: "Names the scenario a re-executed test binary runs as one node of the TCP communicator's tests."})
	RendezvousChild = Register(Switch{Name: "HALO_RDZV_CHILD", Kind: Plumbing,
		Doc: "Marks a re-executed test binary as one node of the rendezvous tests."})
	NCCLNode = Register(Switch{Name: "HALO_NCCL_NODE", Kind: Plumbing,
		Doc: "Node rank of a re-executed NCCL multi-node test binary."})
	NCCLAddr = Register(Switch{Name: "HALO_NCCL_ADDR", Kind: Plumbing,
		Doc: "Rendezvous address of the NCCL multi-node test's nodes."})
	SessionHelper = Register(Switch{Name: "HALO_SESSION_HELPER", Kind: Plumbing,
		Doc: "Names the role (serve, control-and-watch, ...) a re-executed session test binary plays."})
	SessionName = Register(Switch{Name: "HALO_SESSION_NAME", Kind: Plumbing,
		Doc: "Session name a re-executed session test server serves."})
	SaveOnStop = Register(Switch{Name: "HALO_SAVE_ON_STOP", Kind: Plumbing,
		Doc: "Directory a re-executed session test server saves to when it is stopped."})
	Socket = Register(Switch{Name: "HALO_SOCKET", Kind: Plumbing,
		Doc: "Socket a re-executed session test client dials."})
	REPLHelper = Register(Switch{Name: "HALO_REPL_HELPER", Kind: Plumbing, Values: []string{"1"},
		Doc: "Marks a re-executed REPL test binary that runs the REPL in a pty."})
	REPLSession = Register(Switch{Name: "HALO_REPL_SESSION", Kind: Plumbing,
		Doc: "Socket the pty-driven REPL test attaches to."})
	REPLTakeOver = Register(Switch{Name: "HALO_REPL_TAKEOVER", Kind: Plumbing, Values: []string{"1"},
		Doc: "Makes the pty-driven REPL test's REPL take control at start (as repl --take-over)."})
	LaunchGPUNodesArgs = Register(Switch{Name: "HALO_LAUNCH_GPU_NODES_ARGS", Kind: Plumbing,
		Doc: "Arguments a re-executed launch test binary runs as one GPU node."})
	LaunchAcrossArgs = Register(Switch{Name: "HALO_LAUNCH_ACROSS_ARGS", Kind: Plumbing,
		Doc: "Arguments a re-executed launch test binary runs as one node of a multi-node launch."})
)
