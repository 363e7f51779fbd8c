package train

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"math"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/halo-shell/halo-shell/engine/backend"
	"github.com/halo-shell/halo-shell/engine/comm/rendezvous"
	"github.com/halo-shell/halo-shell/engine/mesh"
	"github.com/halo-shell/halo-shell/engine/profile"
	"github.com/halo-shell/halo-shell/internal/testnet"
)

// untimed is m without the fields that depend on the wall clock, after checking that they
// are consistent with each other.
func untimed(t *testing.T, m StepMetrics) StepMetrics {
	t.Helper()
	if m.StepTimeS <= 0 || m.TokensPerS != float64(m.Tokens)/m.StepTimeS {
		t.Fatalf("step %d: %v tok/s for %d tokens in %v s", m.Step, m.TokensPerS, m.Tokens, m.StepTimeS)
	}
	m.StepTimeS, m.TokensPerS, m.TimeByOpS = 0, 0, nil
	return m
}

// The single model and a plan of one rank over the same data produce the same metrics record,
// field for field (dense and MoE, whose records add the aux loss and the expert load), and
// both report the time by op class of their device. Every value is equal bit for bit but the
// gradient norm, which the plan sums per tensor and all-reduces as a float32 pair: it agrees
// to 1e-12, and clipping is off so that the updates do not depend on its last bits.
func TestOneDeviceAndOneRankPlanBuildTheSameMetrics(t *testing.T) {
	path := writeJSONL(t, t.TempDir(), "d.jsonl", pcRecords(40))
	for _, tc := range []struct {
		name string
		cfg  func() *Config
	}{
		{"dense", func() *Config { return tinyConfig(t, path, "--gradient_accumulation_steps=2", "--max_grad_norm=0") }},
		{"moe", func() *Config {
			return tinyMoEConfig(t, path, "--gradient_accumulation_steps=2", "--max_grad_norm=0", "--moe_balancing_rate=0.01")
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rec := profile.NewRecorder()
			one, err := NewOn(tc.cfg(), profile.Wrap(mustOpen(t, "cpu"), rec))
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { one.Close() })
			rec.Enable(true, false)

			plan := newTrainer(t, tc.cfg())
			if err := plan.startPlan(mesh.Devices{Kind: "cpu", IDs: []int{0}}, mesh.Layout{}); err != nil {
				t.Fatal(err)
			}
			if plan.onPlan() == nil || one.onPlan() != nil {
				t.Fatal("want one trainer on a plan and one on its device")
			}
			for _, r := range plan.RankRecorders() {
				r.Enable(true, false)
			}
			for range 3 {
				a, err := one.Step(context.Background())
				if err != nil {
					t.Fatal(err)
				}
				b, err := plan.Step(context.Background())
				if err != nil {
					t.Fatal(err)
				}
				if len(a.TimeByOpS) == 0 || len(b.TimeByOpS) == 0 || a.TimeByOpS["matmul"] <= 0 || b.TimeByOpS["matmul"] <= 0 {
					t.Fatalf("step %d: time by op %v on the device, %v on the plan; want matmul in both", a.Step, a.TimeByOpS, b.TimeByOpS)
				}
				if math.Abs(a.GradNorm-b.GradNorm) > 1e-12*a.GradNorm || a.GradNorm <= 0 {
					t.Fatalf("step %d: gradient norm %v on one device, %v on the plan", a.Step, a.GradNorm, b.GradNorm)
				}
				a, b = untimed(t, a), untimed(t, b)
				b.GradNorm = a.GradNorm
				ja, _ := json.Marshal(a)
				jb, _ := json.Marshal(b)
				if !bytes.Equal(ja, jb) || math.Float64bits(a.Loss) != math.Float64bits(b.Loss) {
					t.Fatalf("step %d:\none device %s\none-rank plan %s", a.Step, ja, jb)
				}
				if moe := one.model.IsMoE(); (a.AuxLoss != nil) != moe || (a.ExpertLoad != nil) != moe {
					t.Fatalf("step %d: aux loss %v, expert load %v on a model with MoE=%v", a.Step, a.AuxLoss, a.ExpertLoad, moe)
				}
			}
		})
	}
}

func mustOpen(t *testing.T, name string) backend.Backend {
	t.Helper()
	b, err := backend.Open(name)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// metricsRows reads dir's metrics.jsonl by step.
func metricsRows(t *testing.T, dir string) map[int]StepMetrics {
	t.Helper()
	f, err := os.Open(filepath.Join(dir, MetricsFile))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	rows := map[int]StepMetrics{}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		var m StepMetrics
		if err := json.Unmarshal(sc.Bytes(), &m); err != nil {
			t.Fatalf("%s: %v", MetricsFile, err)
		}
		rows[m.Step] = m
	}
	return rows
}

// A batch run interrupted after step 3 (which saves checkpoint-3) and resumed from it with Run
// writes the uninterrupted run's losses, gradient norms and learning rates into
// metrics.jsonl, bit for bit, on one device and on a plan.
func TestResumedRunWritesTheSameLosses(t *testing.T) {
	path := writeJSONL(t, t.TempDir(), "d.jsonl", pcRecords(40))
	for _, tc := range []struct {
		name  string
		extra []string
	}{
		{"one device", nil},
		{"dp=2 fsdp on cpu:2", []string{"--devices=cpu:2", "--fsdp=true"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := func(extra ...string) *Config {
				return tinyParallelConfig(t, path, append(append([]string{"--max_steps=6", "--save_steps=0"}, tc.extra...), extra...)...)
			}
			full := cfg()
			if _, err := Run(context.Background(), newTrainer(t, full), RunOptions{}); err != nil {
				t.Fatal(err)
			}
			want := metricsRows(t, full.Run.OutputDir)

			cut := cfg()
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			var log bytes.Buffer
			_, err := Run(ctx, newTrainer(t, cut), RunOptions{Log: &log, OnStep: func(m StepMetrics) {
				if m.Step == 3 {
					cancel()
				}
			}})
			ck := filepath.Join(cut.Run.OutputDir, "checkpoint-3")
			if err != context.Canceled || !strings.Contains(log.String(), "interrupted: saved "+ck) {
				t.Fatalf("interrupted run: %v, log:\n%s", err, log.String())
			}
			resumed := cfg("--resume_from_checkpoint=" + ck)
			resumed.Run.OutputDir = cut.Run.OutputDir
			if _, err := Run(context.Background(), newTrainer(t, resumed), RunOptions{}); err != nil {
				t.Fatal(err)
			}
			got := metricsRows(t, cut.Run.OutputDir)
			if len(want) != 6 || len(got) != 6 {
				t.Fatalf("%d rows uninterrupted, %d interrupted and resumed; want 6 steps each", len(want), len(got))
			}
			for s := 1; s <= 6; s++ {
				w, g := want[s], got[s]
				if math.Float64bits(w.Loss) != math.Float64bits(g.Loss) || math.Float64bits(w.GradNorm) != math.Float64bits(g.GradNorm) || w.LR != g.LR || w.Epoch != g.Epoch {
					t.Errorf("step %d: uninterrupted loss %v norm %v lr %v epoch %v; resumed %v %v %v %v", s, w.Loss, w.GradNorm, w.LR, w.Epoch, g.Loss, g.GradNorm, g.LR, g.Epoch)
				}
			}
		})
	}
}

// Run on every node of a run across two nodes: every node runs the same steps and saves,
// node 0 writes the metrics, checkpoints and model, the other node writes nothing and logs
// one summary line, and both see the same metrics.
func TestRunAcrossNodesWritesOnNodeZero(t *testing.T) {
	path := writeJSONL(t, t.TempDir(), "d.jsonl", pcRecords(24))
	addr := testnet.FreeAddr(t)
	type nodeResult struct {
		out  string
		log  bytes.Buffer
		seen []StepMetrics
		err  error
	}
	var res [2]nodeResult
	var wg sync.WaitGroup
	for node := range res {
		r := &res[node]
		cfg := tinyParallelConfig(t, path, "--devices=cpu", "--max_steps=3", "--save_steps=2", "--logging_steps=1")
		r.out = cfg.Run.OutputDir
		wg.Add(1)
		go func() {
			defer wg.Done()
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			tr, err := newOnNodes(ctx, cfg, rendezvous.Config{NNodes: 2, NodeRank: node, Addr: addr, Token: "nodes-secret", Timeout: 30 * time.Second}, realGPUNodeOps())
			if err != nil {
				r.err = err
				return
			}
			defer tr.Close()
			_, r.err = Run(ctx, tr, RunOptions{Log: &r.log, OnStep: func(m StepMetrics) {
				m.StepTimeS, m.TokensPerS, m.TimeByOpS = 0, 0, nil
				r.seen = append(r.seen, m)
			}})
		}()
	}
	wg.Wait()
	for node := range res {
		if res[node].err != nil {
			t.Fatalf("node %d: %v\n%s", node, res[node].err, res[node].log.String())
		}
	}
	rows := metricsRows(t, res[0].out)
	for _, f := range []string{"checkpoint-2", "checkpoint-3", "model.safetensors"} {
		if _, err := os.Stat(filepath.Join(res[0].out, f)); err != nil {
			t.Errorf("node 0 did not write %s: %v", f, err)
		}
	}
	if _, err := os.Stat(res[1].out); !os.IsNotExist(err) {
		t.Errorf("node 1 wrote its output_dir %s (%v); only node 0 writes files", res[1].out, err)
	}
	if l := res[1].log.String(); strings.Count(l, "\n") != 1 || !strings.HasPrefix(l, "node 1 of 2: trained 3 steps in ") {
		t.Errorf("node 1 logged %q, want one summary line", l)
	}
	if !reflect.DeepEqual(res[0].seen, res[1].seen) || len(res[0].seen) != 3 || len(rows) != 3 {
		t.Fatalf("node 0 saw %+v, node 1 %+v; %d rows written", res[0].seen, res[1].seen, len(rows))
	}
	for _, m := range res[0].seen {
		if w := rows[m.Step]; math.Float64bits(w.Loss) != math.Float64bits(m.Loss) {
			t.Errorf("step %d: node 0 wrote loss %v, saw %v", m.Step, w.Loss, m.Loss)
		}
	}
}
