package train

import (
	"context"
	"encoding/json"
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
		{[]string{"--devices=cuda:0-1", "--device=auto"}, 2, "2 nodes with devices cuda:0-1: a run across nodes supports dense models on cpu devices", "", ""},
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
// localhost, for steps steps each; node 0 saves a checkpoint into ckpt.
func trainAcross(t *testing.T, nnodes, steps int, cfgs func(node int) *Config, ckpt string) []nodeRun {
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
			}
			_, r.layoutErr = tr.SetLayout("dp=2")
			if node == 0 {
				r.err = tr.Save(ckpt)
			}
		}()
	}
	wg.Wait()
	return runs
}

// Two trainers of cpu:2 each, joined over TCP, step exactly as one trainer on cpu:4 with the
// same layout (losses and gradient norms bit for bit, on every node); moving the layout is
// refused; node 0's checkpoint holds the same weights as the one-process trainer's, marked
// weights-only with no optimizer file, and resuming it is refused.
func TestTrainersAcrossNodesMatchOneProcess(t *testing.T) {
	path := writeJSONL(t, t.TempDir(), "d.jsonl", pcRecords(24))
	for _, layout := range [][]string{{"--gradient_accumulation_steps=4", "--fsdp=true"}, {"--tensor_parallel_size=2"}} {
		t.Run(strings.Join(layout, " "), func(t *testing.T) {
			const steps = 3
			dir := t.TempDir()
			ref, err := New(tinyParallelConfig(t, path, append([]string{"--devices=cpu:4"}, layout...)...))
			if err != nil {
				t.Fatal(err)
			}
			defer ref.Close()
			var want nodeRun
			for range steps {
				m, err := ref.Step(context.Background())
				if err != nil {
					t.Fatal(err)
				}
				want.loss, want.norm = append(want.loss, m.Loss), append(want.norm, m.GradNorm)
			}
			if err := ref.Save(filepath.Join(dir, "ref")); err != nil {
				t.Fatal(err)
			}
			ckpt := filepath.Join(dir, "nodes")
			runs := trainAcross(t, 2, steps, func(int) *Config {
				return tinyParallelConfig(t, path, append([]string{"--devices=cpu:2"}, layout...)...)
			}, ckpt)
			for node, r := range runs {
				if r.err != nil {
					t.Fatalf("node %d: %v", node, r.err)
				}
				if r.rank != node || r.n != 2 {
					t.Errorf("node %d: Node() = %d, %d", node, r.rank, r.n)
				}
				for i := range steps {
					if math.Float64bits(r.loss[i]) != math.Float64bits(want.loss[i]) || math.Float64bits(r.norm[i]) != math.Float64bits(want.norm[i]) {
						t.Errorf("node %d step %d: loss %v norm %v, one process %v %v", node, i+1, r.loss[i], r.norm[i], want.loss[i], want.norm[i])
					}
				}
				if r.layoutErr == nil || !strings.Contains(r.layoutErr.Error(), "SetLayout") || !strings.Contains(r.layoutErr.Error(), "a run across nodes supports") {
					t.Errorf("node %d: SetLayout across nodes gave %v, want a refusal naming what is supported", node, r.layoutErr)
				}
			}
			if s := sameBits(checkpointParams(t, path, ckpt), checkpointParams(t, path, filepath.Join(dir, "ref"))); s != "" {
				t.Errorf("node 0's checkpoint: %s", s)
			}
			if _, err := os.Stat(filepath.Join(ckpt, OptimizerFile)); !os.IsNotExist(err) {
				t.Errorf("checkpoint across nodes has %s (%v)", OptimizerFile, err)
			}
			raw, err := os.ReadFile(filepath.Join(ckpt, StateFile))
			if err != nil {
				t.Fatal(err)
			}
			var st trainerState
			if err := json.Unmarshal(raw, &st); err != nil || !st.WeightsOnly || st.Step != steps {
				t.Fatalf("checkpoint state: weights_only %v step %d (%v)", st.WeightsOnly, st.Step, err)
			}
			_, err = New(tinyParallelConfig(t, path, append([]string{"--devices=cpu:4", "--resume_from_checkpoint=" + ckpt}, layout...)...))
			if err == nil || !strings.Contains(err.Error(), "no optimizer state") || !strings.Contains(err.Error(), "model_name_or_path") {
				t.Errorf("resuming a checkpoint across nodes: %v, want a refusal saying what is missing and what to do", err)
			}
		})
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
