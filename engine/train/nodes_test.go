package train

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"math"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/halo-shell/halo-shell/engine/comm/rendezvous"
)

func TestNodeDevicesRefusesWhatRunsAcrossNodesDoNotSupport(t *testing.T) {
	path := writeJSONL(t, t.TempDir(), "d.jsonl", pcRecords(8))
	for _, tc := range []struct {
		extra  []string
		nodes  int
		want   string // error substring; "" = accepted
		mesh   string
		layout string
	}{
		{[]string{"--devices=cpu:2", "--gradient_accumulation_steps=4"}, 2, "", "cpu:4", "dp=4 tp=1 cp=1 ep=1 etp=1"},
		{[]string{"--devices=cpu:2", "--gradient_accumulation_steps=4", "--fsdp=true"}, 2, "", "cpu:4", "dp=4 fsdp tp=1 cp=1 ep=1 etp=1"},
		{[]string{"--devices=cpu:2", "--tensor_parallel_size=2", "--gradient_accumulation_steps=3"}, 3, "", "cpu:6", "dp=3 tp=2 cp=1 ep=1 etp=1"},
		{[]string{"--devices=cpu:2", "--gradient_accumulation_steps=2"}, 2, "gradient_accumulation_steps 2 micro-batches cannot be dealt over 4 data-parallel ranks", "", ""},
		{[]string{"--devices=cpu:2", "--context_parallel_size=2"}, 2, "uses context parallelism; a run across nodes supports", "", ""},
		{[]string{"--devices=cpu:2", "--expert_parallel_size=2"}, 2, "uses expert parallelism; a run across nodes supports", "", ""},
		{[]string{"--devices=cpu:2", "--expert_tensor_parallel_size=2"}, 2, "uses expert parallelism", "", ""},
		{[]string{"--devices=cpu", "--tensor_parallel_size=2"}, 2, "tensor_parallel_size 2 does not divide the 1 devices of a node", "", ""},
		// K GPUs per node make a mesh of the world's N·K ranks, whatever the node's device numbers.
		{[]string{"--devices=cuda:0-1", "--device=auto", "--gradient_accumulation_steps=4"}, 2, "", "cuda:0-3", "dp=4 tp=1 cp=1 ep=1 etp=1"},
		{[]string{"--devices=cuda:3", "--device=auto", "--gradient_accumulation_steps=3"}, 3, "", "cuda:0-2", "dp=3 tp=1 cp=1 ep=1 etp=1"},
		{[]string{"--devices=cuda:2,5", "--device=auto", "--gradient_accumulation_steps=2", "--tensor_parallel_size=2", "--fsdp=true"}, 2, "", "cuda:0-3", "dp=2 fsdp tp=2 cp=1 ep=1 etp=1"},
		{[]string{"--devices=cuda:0-1", "--device=auto"}, 2, "gradient_accumulation_steps 2 micro-batches cannot be dealt over 4 data-parallel ranks", "", ""},
		{[]string{"--devices=cuda:0-1", "--device=auto", "--context_parallel_size=2"}, 2, "uses context parallelism; a run across nodes supports dense models on cpu or cuda devices", "", ""},
		{[]string{"--devices=cuda:0-1", "--device=auto", "--expert_parallel_size=2"}, 2, "uses expert parallelism", "", ""},
		{[]string{"--devices=cuda:0", "--device=auto", "--tensor_parallel_size=2", "--gradient_accumulation_steps=2"}, 2, "tensor_parallel_size 2 does not divide the 1 devices of a node (cuda:0)", "", ""},
		{[]string{"--devices=cuda:0-7", "--device=auto", "--gradient_accumulation_steps=8"}, 1 << 14, "a run across nodes on GPUs has 1 to 65536 ranks in all", "", ""},
	} {
		t.Run(strings.Join(tc.extra, " "), func(t *testing.T) {
			d, l, err := NodeDevices(tinyParallelConfig(t, path, tc.extra...), tc.nodes)
			if tc.want != "" {
				if err == nil || !strings.Contains(err.Error(), tc.want) {
					t.Fatalf("got %v, want an error containing %q", err, tc.want)
				}
				return
			}
			if err != nil || d.String() != tc.mesh || l.String() != tc.layout {
				t.Fatalf("got %s %s %v, want %s %s", d, l, err, tc.mesh, tc.layout)
			}
		})
	}
}

// nodeRun is what one trainer of TestTrainersAcrossNodesMatchOneProcess saw.
type nodeRun struct {
	loss, norm []float64
	rank, n    int
	layoutErr  error
	err        error
}

// trainAcross runs nnodes trainers of cfgs(node) in this process, joined over TCP on
// localhost, for steps steps each; after step saveAt (when > 0) every node calls Save(ckpt)
// (node 0 writes it).
func trainAcross(t *testing.T, nnodes, steps int, cfgs func(node int) *Config, saveAt int, ckpt string) []nodeRun {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	runs := make([]nodeRun, nnodes)
	var wg sync.WaitGroup
	for node := range nnodes {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r := &runs[node]
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			tr, err := NewOnNodes(ctx, cfgs(node), rendezvous.Config{NNodes: nnodes, NodeRank: node, Addr: addr, Token: "nodes-secret", Timeout: 30 * time.Second})
			if err != nil {
				r.err = err
				return
			}
			defer tr.Close()
			r.rank, r.n = tr.Node()
			for range steps {
				m, err := tr.Step(ctx)
				if err != nil {
					r.err = err
					return
				}
				r.loss, r.norm = append(r.loss, m.Loss), append(r.norm, m.GradNorm)
				if m.Step == saveAt {
					// A collective: every node takes part, node 0 writes.
					if r.err = tr.Save(ckpt); r.err != nil {
						return
					}
				}
			}
			_, r.layoutErr = tr.SetLayout("dp=2")
		}()
	}
	wg.Wait()
	return runs
}

// stepOne runs steps steps of a one-process trainer of cfg and returns its losses and norms.
func stepOne(t *testing.T, cfg *Config, steps int, saveAt int, ckpt string) nodeRun {
	t.Helper()
	tr, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer tr.Close()
	var r nodeRun
	for range steps {
		m, err := tr.Step(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		r.loss, r.norm = append(r.loss, m.Loss), append(r.norm, m.GradNorm)
		if m.Step == saveAt {
			if err := tr.Save(ckpt); err != nil {
				t.Fatal(err)
			}
		}
	}
	return r
}

// sameRun fails t unless got's losses and gradient norms are want's from step from on, bit
// for bit.
func sameRun(t *testing.T, what string, got nodeRun, want nodeRun, from int) {
	t.Helper()
	if got.err != nil {
		t.Fatalf("%s: %v", what, got.err)
	}
	if len(got.loss) != len(want.loss)-from {
		t.Fatalf("%s: %d steps, want %d", what, len(got.loss), len(want.loss)-from)
	}
	for i := range got.loss {
		w := from + i
		if math.Float64bits(got.loss[i]) != math.Float64bits(want.loss[w]) || math.Float64bits(got.norm[i]) != math.Float64bits(want.norm[w]) {
			t.Errorf("%s step %d: loss %v norm %v, uninterrupted %v %v", what, w+1, got.loss[i], got.norm[i], want.loss[w], want.norm[w])
		}
	}
}

// Two trainers of cpu:2 each, joined over TCP, step exactly as one trainer on cpu:4 with the
// same layout (losses and gradient norms bit for bit, on every node); moving the layout is
// refused; node 0's step-2 checkpoint holds the same weights and optimizer state as the
// one-process trainer's; resumed from it across nodes (in the same layout and in the other
// one) or in one process, the run continues bit for bit as it would have.
func TestTrainersAcrossNodesMatchOneProcess(t *testing.T) {
	path := writeJSONL(t, t.TempDir(), "d.jsonl", pcRecords(24))
	fsdp, tp := []string{"--gradient_accumulation_steps=4", "--fsdp=true"}, []string{"--gradient_accumulation_steps=4", "--tensor_parallel_size=2"}
	for _, c := range []struct{ layout, other []string }{{fsdp, tp}, {tp, fsdp}} {
		t.Run(strings.Join(c.layout, " "), func(t *testing.T) {
			const steps, saveAt = 4, 2
			dir := t.TempDir()
			cfg := func(devices string, layout []string, extra ...string) *Config {
				return tinyParallelConfig(t, path, append(append([]string{"--devices=" + devices}, layout...), extra...)...)
			}
			refCkpt := filepath.Join(dir, "ref")
			want := stepOne(t, cfg("cpu:4", c.layout), steps, saveAt, refCkpt)
			ckpt := filepath.Join(dir, "nodes")
			runs := trainAcross(t, 2, steps, func(int) *Config { return cfg("cpu:2", c.layout) }, saveAt, ckpt)
			for node, r := range runs {
				if r.rank != node || r.n != 2 {
					t.Errorf("node %d: Node() = %d, %d", node, r.rank, r.n)
				}
				sameRun(t, fmt.Sprintf("node %d", node), r, want, 0)
				if r.layoutErr == nil || !strings.Contains(r.layoutErr.Error(), "SetLayout") || !strings.Contains(r.layoutErr.Error(), "a run across nodes supports") {
					t.Errorf("node %d: SetLayout across nodes gave %v, want a refusal naming what is supported", node, r.layoutErr)
				}
			}
			if s := sameBits(checkpointParams(t, path, ckpt), checkpointParams(t, path, refCkpt)); s != "" {
				t.Errorf("node 0's checkpoint: %s", s)
			}
			a, err := os.ReadFile(filepath.Join(ckpt, OptimizerFile))
			if err != nil {
				t.Fatalf("checkpoint across nodes: %v", err)
			}
			b, err := os.ReadFile(filepath.Join(refCkpt, OptimizerFile))
			if err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(a, b) {
				t.Errorf("node 0's %s differs from the one-process checkpoint's", OptimizerFile)
			}
			raw, err := os.ReadFile(filepath.Join(ckpt, StateFile))
			if err != nil {
				t.Fatal(err)
			}
			if bytes.Contains(raw, []byte("weights_only")) {
				t.Errorf("%s of a checkpoint across nodes says weights_only", StateFile)
			}
			resume := "--resume_from_checkpoint=" + ckpt
			// Resumed across nodes in the same layout: the uninterrupted run's steps 3 and 4.
			for node, r := range trainAcross(t, 2, steps-saveAt, func(int) *Config { return cfg("cpu:2", c.layout, resume) }, 0, "") {
				sameRun(t, fmt.Sprintf("resumed across nodes: node %d", node), r, want, saveAt)
			}
			// Resumed in one process on cpu:4.
			sameRun(t, "resumed in one process", stepOne(t, cfg("cpu:4", c.layout, resume), steps-saveAt, 0, ""), want, saveAt)
			// Resumed across nodes in the other layout: as one process resumed in that layout.
			other := stepOne(t, cfg("cpu:4", c.other, resume), steps-saveAt, 0, "")
			for node, r := range trainAcross(t, 2, steps-saveAt, func(int) *Config { return cfg("cpu:2", c.other, resume) }, 0, "") {
				sameRun(t, fmt.Sprintf("resumed across nodes in layout %v: node %d", c.other, node), r, other, 0)
			}
		})
	}
}

// A checkpoint marked weights_only (written by earlier builds for a run across nodes) is
// refused, saying what is missing and what to do.
func TestResumeRefusesWeightsOnlyCheckpoints(t *testing.T) {
	path := writeJSONL(t, t.TempDir(), "d.jsonl", pcRecords(8))
	ckpt := filepath.Join(t.TempDir(), "ck")
	stepOne(t, tinyParallelConfig(t, path, "--devices=cpu:2"), 1, 1, ckpt)
	raw, err := os.ReadFile(filepath.Join(ckpt, StateFile))
	if err != nil {
		t.Fatal(err)
	}
	var st map[string]any
	if err := json.Unmarshal(raw, &st); err != nil {
		t.Fatal(err)
	}
	st["weights_only"] = true
	if raw, err = json.Marshal(st); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(ckpt, StateFile), raw, 0o644); err != nil {
		t.Fatal(err)
	}
	_, err = New(tinyParallelConfig(t, path, "--devices=cpu:2", "--resume_from_checkpoint="+ckpt))
	if err == nil || !strings.Contains(err.Error(), "no optimizer state") || !strings.Contains(err.Error(), "model_name_or_path") {
		t.Errorf("resuming a weights-only checkpoint: %v, want a refusal saying what is missing and what to do", err)
	}
}

// A mixture-of-experts model across nodes is refused before the rendezvous.
func TestNewOnNodesRefusesMoEBeforeTheRendezvous(t *testing.T) {
	path := writeJSONL(t, t.TempDir(), "d.jsonl", pcRecords(8))
	cfg := tinyMoEConfig(t, path, "--devices=cpu:2", "--gradient_accumulation_steps=4")
	start := time.Now()
	_, err := NewOnNodes(context.Background(), cfg, rendezvous.Config{NNodes: 2, Addr: "127.0.0.1:1", Token: "x", Timeout: 20 * time.Second})
	if err == nil || !strings.Contains(err.Error(), "mixture of experts; a run across nodes supports dense models") {
		t.Fatalf("got %v", err)
	}
	if el := time.Since(start); el > 10*time.Second {
		t.Errorf("the refusal took %s", el)
	}
}

// Nodes on CPU devices whose configs disagree (here node 1's gradient clipping and schedule)
// stop once joined, before the plan, every node naming the parts that differ.
func TestTrainersAcrossNodesRefuseConfigsThatDisagree(t *testing.T) {
	path := writeJSONL(t, t.TempDir(), "d.jsonl", pcRecords(8))
	runs := trainAcross(t, 2, 1, func(node int) *Config {
		extra := []string{"--devices=cpu:2", "--gradient_accumulation_steps=4"}
		if node == 1 {
			extra = append(extra, "--max_grad_norm=0.5", "--max_steps=7")
		}
		return tinyParallelConfig(t, path, extra...)
	}, 0, "")
	for node, r := range runs {
		if r.err == nil || !strings.Contains(r.err.Error(), "the nodes' configs disagree: node 1 differs from node 0 in optimizer, schedule; run every node with the same config") {
			t.Errorf("node %d: %v, want the parts that differ named", node, r.err)
		}
	}
}
