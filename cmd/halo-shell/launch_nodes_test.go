package main

import (
	"path/filepath"
	"strings"
	"testing"

	"github.com/halo-shell/halo-shell/engine/comm/rendezvous"
	"github.com/halo-shell/halo-shell/engine/train"
)

func TestLaunchMultiNodeFlags(t *testing.T) {
	out := filepath.Join(t.TempDir(), "run")
	for _, tc := range []struct {
		extra []string
		want  string
	}{
		{[]string{"--nnodes=2", "--rendezvous=127.0.0.1:29400", "--rendezvous-token=s3cret"}, "gradient_accumulation_steps 1 micro-batches cannot be dealt over 2 data-parallel ranks"},
		{[]string{"--nnodes=2", "--rendezvous=127.0.0.1:29400"}, "no token"},
		{[]string{"--nnodes=2", "--rendezvous=127.0.0.1:29400", "--rendezvous-token=s3cret", "--gradient_accumulation_steps=4", "--expert_parallel_size=2", "--devices=cpu:2"}, "expert_parallel_size 2 needs a mixture-of-experts model"},
		{[]string{"--nnodes=2", "--rendezvous=127.0.0.1:29400", "--rendezvous-token=s3cret", "--gradient_accumulation_steps=2", "--tensor_parallel_size=2"}, "tensor_parallel_size 2 does not divide the 1 devices of a node"},
		{[]string{"--nnodes=2", "--rendezvous=127.0.0.1:29400", "--rendezvous-token=s3cret", "--gradient_accumulation_steps=2", "--name=x"}, "--name and --trace need the run's session"},
		{[]string{"--nnodes=2", "--rendezvous=127.0.0.1:29400", "--rendezvous-token=s3cret", "--gradient_accumulation_steps=2", "--devices=cuda:0-1", "--device=auto"}, "gradient_accumulation_steps 2 micro-batches cannot be dealt over 4 data-parallel ranks"},
		{[]string{"--nnodes=2"}, "no rendezvous address: pass --rendezvous HOST:PORT"},
		{[]string{"--nnodes"}, "write --nnodes=VALUE"},
		{[]string{"--nnodes=0"}, "--nnodes=0: want 1 or more"},
		{[]string{"--node-rank=first"}, `--node-rank="first": want a non-negative integer`},
		{[]string{"--rendezvous-timeout=soon"}, "want a positive duration"},
		{[]string{"--nnodes=2", "--node-rank=2", "--rendezvous=127.0.0.1:29400", "--rendezvous-token=s3cret"}, "node rank 2 is outside 0..1"},
	} {
		_, err := runRoot(t, append(quickstartArgs(out, tc.extra...), "--dry-run")...)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%v: error %v, want %q", tc.extra, err, tc.want)
		}
	}
	// One node is an ordinary run: the flags are accepted and not taken for config keys.
	if _, err := runRoot(t, append(quickstartArgs(out, "--nnodes=1", "--node-rank=0"), "--dry-run")...); err != nil {
		t.Errorf("--nnodes=1: %v", err)
	}
	// A supported layout across CPU nodes passes the checks (the dry run joins no one).
	stdout, err := runRoot(t, append(quickstartArgs(out, "--nnodes=2", "--rendezvous=127.0.0.1:29400", "--rendezvous-token=s3cret", "--devices=cpu:2", "--fsdp=true", "--gradient_accumulation_steps=4"), "--dry-run")...)
	if err != nil {
		t.Errorf("fsdp over 2 nodes of cpu:2: %v", err)
	}
	for _, want := range []string{"# across 2 nodes of 2 devices each", "devices: cpu:4", "layout:  dp=4 fsdp"} {
		if !strings.Contains(stdout, want) {
			t.Errorf("dry run over 2 nodes lacks %q:\n%s", want, stdout)
		}
	}
	// Context parallelism across nodes, on CPUs and on GPUs, passes the checks too.
	for _, extra := range [][]string{
		{"--nnodes=2", "--node-rank=1", "--rendezvous=127.0.0.1:29400", "--rendezvous-token=s3cret", "--gradient_accumulation_steps=2", "--context_parallel_size=2", "--devices=cpu:2"},
		{"--nnodes=2", "--rendezvous=127.0.0.1:29400", "--rendezvous-token=s3cret", "--gradient_accumulation_steps=4", "--devices=cuda:0-1", "--device=auto", "--context_parallel_size=2"},
	} {
		stdout, err := runRoot(t, append(quickstartArgs(out, extra...), "--dry-run")...)
		if err != nil || !strings.Contains(stdout, "cp=2") {
			t.Errorf("%v: error %v, want a dry run with cp=2:\n%s", extra, err, stdout)
		}
	}
	// So does one across GPU nodes: the mesh is the NCCL world's ranks, whatever GPUs a node names.
	stdout, err = runRoot(t, append(quickstartArgs(out, "--nnodes=3", "--node-rank=2", "--rendezvous=127.0.0.1:29400", "--rendezvous-token=s3cret", "--devices=cuda:4-5", "--device=auto",
		"--fsdp=true", "--gradient_accumulation_steps=6"), "--dry-run")...)
	if err != nil {
		t.Errorf("fsdp over 3 nodes of cuda:4-5: %v", err)
	}
	for _, want := range []string{"# across 3 nodes of 2 devices each", "the ranks of the NCCL world: node r drives ranks r*2 to r*2+1", "devices: cuda:0-5", "layout:  dp=6 fsdp"} {
		if !strings.Contains(stdout, want) {
			t.Errorf("dry run over 3 GPU nodes lacks %q:\n%s", want, stdout)
		}
	}
}

func TestLaunchNodesFallBackToSLURM(t *testing.T) {
	load := func(devices string) *train.Config {
		t.Helper()
		cfg, err := train.LoadConfig("../../examples/quickstart.yaml", train.MethodSFT, []string{
			"--tokenizer_name_or_path=../../examples/quickstart/tokenizer", "--devices=" + devices, "--device=auto", "--gradient_accumulation_steps=2"})
		if err != nil {
			t.Fatal(err)
		}
		return cfg
	}
	slurm := map[string]string{rendezvous.EnvToken: "s3cret", "SLURM_NNODES": "2", "SLURM_NODEID": "1", "SLURM_JOB_NODELIST": "gpu[07-08]"}
	env := func(m map[string]string) func(string) string { return func(k string) string { return m[k] } }
	flags := func(f func(*rendezvous.Flags)) rendezvous.Flags {
		r := rendezvous.UnsetFlags()
		if f != nil {
			f(&r)
		}
		return r
	}
	for _, tc := range []struct {
		name    string
		devices string
		flags   rendezvous.Flags
		env     map[string]string
		want    string // error substring; "" = accepted
		nnodes  int
	}{
		{"no SLURM, no flags: one node", "cpu", flags(nil), nil, "", 1},
		{"SLURM nodes on CPU devices", "cpu", flags(nil), slurm, "", 2},
		{"SLURM nodes with more data ranks than micro-batches", "cpu:2", flags(nil), slurm, "2 micro-batches cannot be dealt over 4 data-parallel ranks", 0},
		{"--nnodes=1 --node-rank=0 win over SLURM", "cpu", flags(func(f *rendezvous.Flags) { f.NNodes, f.NodeRank = 1, 0 }), slurm, "", 1},
		{"--nnodes=1 keeps SLURM_NODEID", "cpu", flags(func(f *rendezvous.Flags) { f.NNodes = 1 }), slurm, "node rank 1 is outside 0..0", 0},
		{"SLURM nodes of one GPU each", "cuda:0", flags(nil), slurm, "", 2},
		{"SLURM nodes of two GPUs with more data ranks than micro-batches", "cuda:0-1", flags(nil), slurm, "2 micro-batches cannot be dealt over 4 data-parallel ranks", 0},
		{"bad SLURM_NNODES", "cpu", flags(nil), map[string]string{"SLURM_NNODES": "two"}, `SLURM_NNODES="two" is not a non-negative integer`, 0},
		{"SLURM without a node list", "cuda:0-1", flags(nil), map[string]string{"SLURM_NNODES": "2"}, "no rendezvous address", 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rc, err := launchNodes(load(tc.devices), tc.flags, env(tc.env))
			if tc.want == "" {
				if err != nil || rc.NNodes != tc.nnodes {
					t.Fatalf("got %d nodes, %v; want %d nodes", rc.NNodes, err, tc.nnodes)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("got %v, want an error containing %q", err, tc.want)
			}
		})
	}
}
