package main

import (
	"bytes"
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/spf13/pflag"

	"github.com/halo-shell/halo-shell/engine/comm/rendezvous"
	"github.com/halo-shell/halo-shell/engine/comm/tcp"
	"github.com/halo-shell/halo-shell/internal/testnet"
)

func runRendezvousCmd(args ...string) (string, error) {
	// Flags keep their values between executions in one process: reset them to their defaults.
	if cmd, _, err := rootCmd.Find([]string{"run", "rendezvous"}); err == nil {
		cmd.Flags().VisitAll(func(f *pflag.Flag) {
			_ = f.Value.Set(f.DefValue)
			f.Changed = false
		})
	}
	var out bytes.Buffer
	rootCmd.SetOut(&out)
	rootCmd.SetArgs(append([]string{"run", "rendezvous"}, args...))
	defer rootCmd.SetArgs(nil)
	err := rootCmd.Execute()
	return out.String(), err
}

type rdzvOut struct {
	NodeRank  int               `json:"node_rank"`
	Nodes     []rendezvous.Node `json:"nodes"`
	Devices   int               `json:"devices"`
	FirstRank int               `json:"first_rank"`
}

// TestRunRendezvous runs node 0 as the command and node 1 through the package, on loopback;
// both must see the same two-node world, and the flags must win over SLURM's variables.
func TestRunRendezvous(t *testing.T) {
	t.Setenv("SLURM_NNODES", "5")
	t.Setenv("SLURM_NODEID", "3")
	addr := testnet.FreeAddr(t)
	node1 := make(chan error, 1)
	go func() {
		w, err := rendezvous.Join(context.Background(), rendezvous.Config{NNodes: 2, NodeRank: 1, Addr: addr, Token: "tok", Timeout: 20 * time.Second}, 4, nil)
		if err == nil && (w.NNodes() != 2 || w.Nodes[0].Devices != 3) {
			t.Errorf("node 1 sees %+v", w)
		}
		node1 <- err
	}()
	out, err := runRendezvousCmd("--nnodes", "2", "--node-rank", "0", "--rendezvous", addr, "--rendezvous-bind", addr,
		"--rendezvous-token", "tok", "--rendezvous-timeout", "20s", "--devices", "3")
	if err != nil {
		t.Fatal(err)
	}
	if err := <-node1; err != nil {
		t.Fatal(err)
	}
	var got rdzvOut
	if err := json.Unmarshal([]byte(out), &got); err != nil {
		t.Fatalf("output is not JSON: %v\n%s", err, out)
	}
	if got.NodeRank != 0 || len(got.Nodes) != 2 || got.Devices != 7 || got.Nodes[1].Devices != 4 {
		t.Fatalf("node 0 printed %+v", got)
	}
	if strings.Contains(out, "tok") {
		t.Fatalf("the output shows the token:\n%s", out)
	}
}

func TestRunRendezvousRefusesMissingToken(t *testing.T) {
	t.Setenv(rendezvous.EnvToken, "")
	_, err := runRendezvousCmd("--nnodes", "2", "--node-rank", "1", "--rendezvous", "127.0.0.1:1", "--rendezvous-token", "", "--devices", "1")
	if err == nil || !strings.Contains(err.Error(), "no token") {
		t.Fatalf("got %v; want the missing token named", err)
	}
}

func TestRendezvousArg(t *testing.T) {
	cases := []struct {
		arg      string
		consumed bool
		err      string
		check    func(f rendezvous.Flags) bool
	}{
		{"--nnodes=4", true, "", func(f rendezvous.Flags) bool { return f.NNodes == 4 }},
		{"--node-rank=0", true, "", func(f rendezvous.Flags) bool { return f.NodeRank == 0 }},
		{"--rendezvous=gpu01:29510", true, "", func(f rendezvous.Flags) bool { return f.Rendezvous == "gpu01:29510" }},
		{"--rendezvous-bind=0.0.0.0:29510", true, "", func(f rendezvous.Flags) bool { return f.Bind == "0.0.0.0:29510" }},
		{"--rendezvous-token-file=/run/tok", true, "", func(f rendezvous.Flags) bool { return f.TokenFile == "/run/tok" }},
		{"--rendezvous-token=s", true, "", func(f rendezvous.Flags) bool { return f.Token == "s" }},
		{"--rendezvous-timeout=90s", true, "", func(f rendezvous.Flags) bool { return f.Timeout == 90*time.Second }},
		{"--learning_rate=1e-3", false, "", nil},
		{"config.yaml", false, "", nil},
		{"--nnodes", true, "write --nnodes=VALUE", nil},
		{"--nnodes=0", true, "want 1 or more", nil},
		{"--node-rank=-1", true, "non-negative integer", nil},
		{"--rendezvous-timeout=soon", true, "positive duration", nil},
	}
	for _, tc := range cases {
		f := rendezvous.UnsetFlags()
		ok, err := rendezvousArg(tc.arg, &f)
		if ok != tc.consumed {
			t.Errorf("%s: consumed %v, want %v", tc.arg, ok, tc.consumed)
		}
		if tc.err != "" {
			if err == nil || !strings.Contains(err.Error(), tc.err) {
				t.Errorf("%s: error %v, want %q", tc.arg, err, tc.err)
			}
			continue
		}
		if err != nil || (tc.check != nil && !tc.check(f)) {
			t.Errorf("%s: %+v, %v", tc.arg, f, err)
		}
	}
}

// TestRunRendezvousTCP runs node 0 as the command with --tcp and node 1 through the same check
// in-process, on loopback: both join a two-rank TCP world, the all-reduce of rank+1 gives 3 and
// node 0 reports a positive bandwidth.
func TestRunRendezvousTCP(t *testing.T) {
	addr := testnet.FreeAddr(t)
	node1 := make(chan error, 1)
	go func() {
		cfg := rendezvous.Config{NNodes: 2, NodeRank: 1, Addr: addr, Token: "tok", Timeout: 30 * time.Second}
		res, err := joinTCP(context.Background(), tcp.Config{Rendezvous: cfg, Listen: "127.0.0.1:0", Timeout: 30 * time.Second})
		if err == nil && (!res.SumOK || res.Ranks != 2) {
			t.Errorf("node 1: %+v", res)
		}
		node1 <- err
	}()
	out, err := runRendezvousCmd("--nnodes", "2", "--node-rank", "0", "--rendezvous", addr, "--rendezvous-bind", addr,
		"--rendezvous-token", "tok", "--rendezvous-timeout", "30s", "--tcp", "--tcp-listen", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	if err := <-node1; err != nil {
		t.Fatal(err)
	}
	var got struct {
		NodeRank int      `json:"node_rank"`
		TCP      tcpCheck `json:"tcp"`
	}
	if err := json.Unmarshal([]byte(out), &got); err != nil {
		t.Fatalf("output is not JSON: %v\n%s", err, out)
	}
	if got.NodeRank != 0 || got.TCP.Ranks != 2 || !got.TCP.SumOK || !(got.TCP.AllReduceMBps > 0) {
		t.Fatalf("node 0 reports %+v\n%s", got, out)
	}
}

func TestRunRendezvousTCPAndNCCLConflict(t *testing.T) {
	_, err := runRendezvousCmd("--nnodes", "1", "--tcp", "--nccl")
	if err == nil || !strings.Contains(err.Error(), "--tcp and --nccl") {
		t.Fatalf("got %v, want an error naming --tcp and --nccl", err)
	}
}
