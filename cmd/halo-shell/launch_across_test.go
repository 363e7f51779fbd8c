package main

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/halo-shell/halo-shell/engine/backend/cpu"
	"github.com/halo-shell/halo-shell/engine/models"
	"github.com/halo-shell/halo-shell/engine/tensor"
	"github.com/halo-shell/halo-shell/internal/testnet"
)

// acrossArgsEnv carries a child process's launch arguments (separated by \x1f).
const acrossArgsEnv = "HALO_LAUNCH_ACROSS_ARGS"

// metricLines reads the loss, gradient norm and held-out loss of every line of a run's
// metrics.jsonl, as the JSON text of each number (equal text is equal float64 bits).
func metricLines(t *testing.T, dir string) []string {
	t.Helper()
	raw, err := os.ReadFile(filepath.Join(dir, "metrics.jsonl"))
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, line := range strings.Split(strings.TrimSpace(string(raw)), "\n") {
		var m struct {
			Step     int             `json:"step"`
			Loss     json.RawMessage `json:"loss"`
			GradNorm json.RawMessage `json:"grad_norm"`
			EvalLoss json.RawMessage `json:"eval_loss"`
		}
		if err := json.Unmarshal([]byte(line), &m); err != nil {
			t.Fatalf("%s: %v", line, err)
		}
		got = append(got, strconv.Itoa(m.Step)+" loss "+string(m.Loss)+" grad_norm "+string(m.GradNorm)+" eval "+string(m.EvalLoss))
	}
	return got
}

// freePort returns a localhost address whose port was free a moment ago, below the
// ephemeral range (testnet).
func freePort(t *testing.T) string {
	t.Helper()
	return testnet.FreeAddr(t)
}

// launchNodesProcs runs "launch" as nnodes processes of this test binary, node r with
// args(r), and returns each one's combined output; it fails the test if one fails.
func launchNodesProcs(t *testing.T, nnodes int, args func(node int) []string) []string {
	t.Helper()
	all := make([][]string, nnodes)
	for node := range all {
		all[node] = args(node)
	}
	res, errs := launchChildren(t, "TestLaunchAcrossNodesMatchesOneProcess", acrossArgsEnv, 2*time.Minute, all, nil)
	for node, err := range errs {
		if err != nil {
			t.Fatalf("node %d: %v\n%s", node, err, res[node])
		}
	}
	return res
}

// Two launch processes of cpu:K each, joined over TCP on localhost, train the same steps as
// one process on cpu:2K with the same layout and seed (dense dp and fsdp, and a tiny qwen3_moe
// with ep=2 over cpu:1 nodes, so each expert group spans both nodes and aux-loss-free
// balancing runs on each): node 0's metrics.jsonl has the same losses, gradient norms and
// held-out losses bit for bit, its checkpoints, model and generation eval are the same bytes
// and load, node 1 writes nothing, and one process resumed from node 0's step-2 checkpoint, or
// two launch processes resumed from it across nodes, log step 3 exactly as the uninterrupted
// run did.
func TestLaunchAcrossNodesMatchesOneProcess(t *testing.T) {
	if a := os.Getenv(acrossArgsEnv); a != "" {
		if _, err := runRoot(t, strings.Split(a, "\x1f")...); err != nil {
			t.Fatal(err)
		}
		return
	}
	moe := append(tinyMoEArgs(), "--moe_balancing_rate=0.02", "--expert_parallel_size=2")
	for _, c := range []struct {
		name   string
		k      int // devices per node
		layout []string
		moe    bool
	}{
		{"dp=4 fsdp", 2, []string{"--fsdp=true"}, false},
		{"dp=4", 2, nil, false},
		{"qwen3_moe ep=2 on cpu:1 nodes", 1, moe, true},
	} {
		t.Run(c.name, func(t *testing.T) {
			dir := t.TempDir()
			common := append([]string{"--gradient_accumulation_steps=4", "--eval_steps=2", "--save_steps=2"}, c.layout...)
			nodeDevices, world := "--devices=cpu:"+strconv.Itoa(c.k), "--devices=cpu:"+strconv.Itoa(2*c.k)
			ref := filepath.Join(dir, "ref")
			if _, err := runRoot(t, quickstartArgs(ref, append([]string{world}, common...)...)...); err != nil {
				t.Fatal(err)
			}
			addr := freePort(t)
			outDir := func(node int) string { return filepath.Join(dir, "node"+strconv.Itoa(node)) }
			logs := launchNodesProcs(t, 2, func(node int) []string {
				return quickstartArgs(outDir(node), append([]string{nodeDevices, "--nnodes=2", "--node-rank=" + strconv.Itoa(node),
					"--rendezvous=" + addr, "--rendezvous-token=across-secret", "--rendezvous-timeout=60s"}, common...)...)
			})
			want, got := metricLines(t, ref), metricLines(t, outDir(0))
			if strings.Join(got, "\n") != strings.Join(want, "\n") {
				t.Fatalf("node 0's metrics differ from one process on cpu:%d:\n%s\nwant\n%s", 2*c.k, strings.Join(got, "\n"), strings.Join(want, "\n"))
			}
			if raw, err := os.ReadFile(filepath.Join(outDir(0), "metrics.jsonl")); err != nil || c.moe && !bytes.Contains(raw, []byte(`"aux_loss"`)) {
				t.Errorf("node 0's metrics.jsonl of the MoE run has no aux losses (%v):\n%s", err, raw)
			}
			if _, err := os.Stat(outDir(1)); !os.IsNotExist(err) {
				t.Errorf("node 1 wrote %s (%v); only node 0 writes files", outDir(1), err)
			}
			if !strings.Contains(logs[1], "node 1 of 2: trained 3 steps") {
				t.Errorf("node 1's output lacks its summary line:\n%s", logs[1])
			}
			// The step-2 and final checkpoints hold the same weights (and optimizer state) as
			// the one-process run's, and load.
			for _, f := range []string{"checkpoint-2/model.safetensors", "checkpoint-3/model.safetensors", "model.safetensors",
				"checkpoint-2/optimizer.safetensors", "checkpoint-3/optimizer.safetensors", "generation_eval.json"} {
				a, err := os.ReadFile(filepath.Join(outDir(0), f))
				if err != nil {
					t.Fatal(err)
				}
				b, err := os.ReadFile(filepath.Join(ref, f))
				if err != nil {
					t.Fatal(err)
				}
				if !bytes.Equal(a, b) {
					t.Errorf("%s differs from the one-process run's", f)
				}
			}
			m, err := models.Load(filepath.Join(outDir(0), "checkpoint-3"), cpu.New(cpu.Options{Workers: 1}), models.Options{DType: tensor.F32})
			if err != nil {
				t.Fatalf("loading node 0's checkpoint: %v", err)
			}
			m.Close()
			// One process resumed from node 0's step-2 checkpoint logs step 3 as both runs did.
			resumed := filepath.Join(dir, "resumed")
			if _, err := runRoot(t, quickstartArgs(resumed, append([]string{world,
				"--resume_from_checkpoint=" + filepath.Join(outDir(0), "checkpoint-2")}, common...)...)...); err != nil {
				t.Fatalf("resuming a checkpoint of a run across nodes: %v", err)
			}
			if got := metricLines(t, resumed); len(got) != 1 || got[0] != want[2] {
				t.Errorf("resumed from node 0's checkpoint-2: metrics\n%s\nwant\n%s", strings.Join(got, "\n"), want[2])
			}
			// So do two launch processes resumed from it across nodes.
			addr = freePort(t)
			resumedAt := func(node int) string { return filepath.Join(dir, "resumed-node"+strconv.Itoa(node)) }
			launchNodesProcs(t, 2, func(node int) []string {
				return quickstartArgs(resumedAt(node), append([]string{nodeDevices, "--nnodes=2", "--node-rank=" + strconv.Itoa(node),
					"--rendezvous=" + addr, "--rendezvous-token=across-secret", "--rendezvous-timeout=60s",
					"--resume_from_checkpoint=" + filepath.Join(outDir(0), "checkpoint-2")}, common...)...)
			})
			if got := metricLines(t, resumedAt(0)); len(got) != 1 || got[0] != want[2] {
				t.Errorf("resumed across nodes from node 0's checkpoint-2: metrics\n%s\nwant\n%s", strings.Join(got, "\n"), want[2])
			}
		})
	}
}

// tinyMoEArgs turn quickstartArgs' model into a tiny qwen3_moe (four experts, top 2, aux loss
// weight 0.5).
func tinyMoEArgs() []string {
	return []string{"--init.arch=qwen3_moe", "--init.overrides={hidden_size: 32, moe_intermediate_size: 16, num_experts: 4, num_experts_per_tok: 2, num_hidden_layers: 2, num_attention_heads: 2, num_key_value_heads: 1, head_dim: 16, output_router_logits: true, router_aux_loss_coef: 0.5}"}
}

// The dry run of a mixture-of-experts run across nodes shows the world's mesh and the expert
// layout, and one that no run supports (context parallelism of an MoE model) is refused
// naming the rule, before any rendezvous.
func TestLaunchAcrossNodesDryRunOfExperts(t *testing.T) {
	out := filepath.Join(t.TempDir(), "run")
	nodes := []string{"--nnodes=2", "--node-rank=1", "--rendezvous=127.0.0.1:29400", "--rendezvous-token=s3cret", "--devices=cpu:2", "--gradient_accumulation_steps=4"}
	stdout, err := runRoot(t, append(quickstartArgs(out, append(append(tinyMoEArgs(), nodes...), "--expert_parallel_size=4")...), "--dry-run")...)
	if err != nil {
		t.Fatalf("ep=4 over 2 nodes of cpu:2: %v", err)
	}
	for _, want := range []string{"# across 2 nodes of 2 devices each", "devices: cpu:4", "dp=4 tp=1 cp=1 ep=4 etp=1"} {
		if !strings.Contains(stdout, want) {
			t.Errorf("dry run of ep=4 over 2 nodes lacks %q:\n%s", want, stdout)
		}
	}
	start := time.Now()
	_, err = runRoot(t, quickstartArgs(out, append(append(tinyMoEArgs(), nodes...), "--context_parallel_size=2", "--node-rank=0", "--rendezvous="+freePort(t), "--rendezvous-timeout=20s")...)...)
	if err == nil || !strings.Contains(err.Error(), "context parallelism of mixture-of-experts models is not supported") {
		t.Fatalf("cp=2 of a MoE model over 2 nodes: %v, want a refusal naming the rule", err)
	}
	if el := time.Since(start); el > 10*time.Second {
		t.Errorf("the refusal took %s: it waited for the rendezvous", el)
	}
}
