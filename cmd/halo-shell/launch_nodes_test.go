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
		{[]string{"--nnodes=2", "--rendezvous=127.0.0.1:29400", "--rendezvous-token=s3cret"}, "multi-node runs need CUDA devices"},
		{[]string{"--nnodes=2", "--rendezvous=127.0.0.1:29400"}, "no token"},
		{[]string{"--nnodes=2", "--node-rank=1", "--rendezvous=127.0.0.1:29400", "--rendezvous-token=s3cret"}, "2 nodes with devices cpu"},
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
		{"SLURM nodes on CPU devices", "cpu:2", flags(nil), slurm, "2 nodes with devices cpu:2: multi-node runs need CUDA devices", 0},
		{"--nnodes=1 --node-rank=0 win over SLURM", "cpu", flags(func(f *rendezvous.Flags) { f.NNodes, f.NodeRank = 1, 0 }), slurm, "", 1},
		{"--nnodes=1 keeps SLURM_NODEID", "cpu", flags(func(f *rendezvous.Flags) { f.NNodes = 1 }), slurm, "node rank 1 is outside 0..0", 0},
		{"SLURM nodes on GPUs", "cuda:0-1", flags(nil), slurm, "2 nodes: training does not run across nodes yet", 0},
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
