package parallel

import (
	"bytes"
	"context"
	"encoding/gob"
	"errors"
	"fmt"
	"math"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/halo-shell/halo-shell/engine/backend"
	"github.com/halo-shell/halo-shell/engine/backend/cpu"
	"github.com/halo-shell/halo-shell/engine/comm"
	"github.com/halo-shell/halo-shell/engine/comm/rendezvous"
	"github.com/halo-shell/halo-shell/engine/comm/tcp"
	"github.com/halo-shell/halo-shell/engine/mesh"
	"github.com/halo-shell/halo-shell/engine/models"
	"github.com/halo-shell/halo-shell/engine/optim"
)

// planRun is what one process of a multi-process run (or the single-process reference)
// reports: the losses, gradient norms, mean aux losses, expert loads and expert balancing
// biases of each step, the last step's reduced gradients, the final parameters, the
// optimizer state (a collective over processes) and the error Relayout gave.
type planRun struct {
	Loss, Norm, Aux []float64
	Load            [][][]int
	Bias            [][][]float32
	Grads, Params   map[string][]float32
	StateStep       int
	State           []optim.StateTensor
	RelayoutErr     string
	// ResumedLoss and ResumedNorm are those of a fourth step after LoadOptimizerState of State.
	ResumedLoss, ResumedNorm float64
	// ParamsCalls is the number of collectives the final Params ran on this process's ranks.
	ParamsCalls int
}

// collectiveCalls is the number of collectives p's ranks have run.
func collectiveCalls(p *Plan) int {
	n := 0
	for _, s := range p.CommStats() {
		for _, v := range s {
			n += v.Calls
		}
	}
	return n
}

// trainThreeSteps trains p for three steps of trainBatches (balancing the experts after each
// step when the model balances them) and reports them.
func trainThreeSteps(t *testing.T, p *Plan) planRun {
	t.Helper()
	var r planRun
	for _, rows := range trainBatches(3) {
		l, _, err := p.ForwardBackward(rows)
		if err != nil {
			t.Fatal(err)
		}
		// Under FSDP, Grads all-gathers the shards, and experts held by other processes are
		// all-gathered over the expert groups: a collective every process runs.
		if r.Grads, err = p.Grads(); err != nil {
			t.Fatal(err)
		}
		n, err := p.Step(trainLR, trainMaxNorm)
		if err != nil {
			t.Fatal(err)
		}
		if err := p.BalanceExperts(); err != nil {
			t.Fatal(err)
		}
		r.Loss, r.Norm, r.Aux = append(r.Loss, l), append(r.Norm, n), append(r.Aux, p.AuxLoss())
		r.Load, r.Bias = append(r.Load, p.ExpertLoad()), append(r.Bias, p.ExpertBias())
	}
	var err error
	calls := collectiveCalls(p)
	if r.Params, err = p.Params(); err != nil {
		t.Fatal(err)
	}
	r.ParamsCalls = collectiveCalls(p) - calls
	// Over several processes OptimizerState is a collective too.
	if r.StateStep, r.State, err = p.OptimizerState(); err != nil {
		t.Fatal(err)
	}
	// The exported state loads back (each rank taking its slice, experts and shard) and a
	// fourth step trains from it.
	if err := p.LoadOptimizerState(r.StateStep, r.State); err != nil {
		t.Fatal(err)
	}
	rows := trainBatches(4)[3]
	if r.ResumedLoss, _, err = p.ForwardBackward(rows); err != nil {
		t.Fatal(err)
	}
	if r.ResumedNorm, err = p.Step(trainLR, trainMaxNorm); err != nil {
		t.Fatal(err)
	}
	if p.mp != nil {
		if _, err := p.Relayout(cpuDevices(4), mesh.Layout{}, Options{Optimizer: trainOpt}); err != nil {
			r.RelayoutErr = err.Error()
		}
	}
	return r
}

// procModel is the source model of the multi-process tests: the tiny family with fixed
// weights; a mixture of experts balances its experts too (aux-loss-free bias, beside the aux
// loss).
func procModel(t *testing.T, family string) *models.Model {
	t.Helper()
	m := tinyModel(t, family, 7)
	if m.IsMoE() {
		if err := m.SetExpertBalancing(0.05); err != nil {
			t.Fatal(err)
		}
	}
	return m
}

// planChild is one process of a multi-process test: it joins the TCP world its environment
// describes with PLAN_LOCAL CPU ranks, trains its share of a mesh of PLAN_DEVICES ranks and
// writes its planRun to PLAN_OUT.
func planChild(t *testing.T) {
	node, _ := strconv.Atoi(os.Getenv("PLAN_NODE"))
	nLocal, _ := strconv.Atoi(os.Getenv("PLAN_LOCAL"))
	nDev, _ := strconv.Atoi(os.Getenv("PLAN_DEVICES"))
	cfg := tcp.Config{
		Rendezvous: rendezvous.Config{NNodes: 2, NodeRank: node, Addr: os.Getenv("PLAN_ADDR"), Token: "plan-secret", Timeout: 30 * time.Second},
		Listen:     "127.0.0.1:0",
		Timeout:    60 * time.Second,
	}
	if node == 0 {
		ln, err := net.FileListener(os.NewFile(3, "rendezvous"))
		if err != nil {
			t.Fatalf("inherited listener: %v", err)
		}
		cfg.RendezvousListener = ln
	}
	bs := make([]backend.Backend, nLocal)
	for i := range bs {
		bs[i] = cpu.New(cpu.Options{Workers: 1})
	}
	w, err := tcp.Join(context.Background(), cfg, bs)
	if err != nil {
		t.Fatal(err)
	}
	l, err := mesh.ParseLayout(os.Getenv("PLAN_LAYOUT"))
	if err != nil {
		t.Fatal(err)
	}
	first := w.FirstRank()
	p, err := New(procModel(t, os.Getenv("PLAN_FAMILY")), cpuDevices(nDev), l, Options{
		Optimizer:  trainOpt,
		Local:      &LocalRanks{First: first, Count: w.Local()},
		NewBackend: func(r int) (backend.Backend, error) { return bs[r-first], nil },
		World:      func([]backend.Backend) (comm.Fabric, error) { return w.Fabric(), nil },
	})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	run := trainThreeSteps(t, p)
	var buf bytes.Buffer
	if err := gob.NewEncoder(&buf).Encode(run); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(os.Getenv("PLAN_OUT"), buf.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
}

// procCase is one multi-process run: a tiny model family over a layout of two processes of
// local ranks each.
type procCase struct {
	family, layout string
	local          int
	// crossEP: an expert group spans the processes, so Params all-gathers the experts
	// (otherwise it reads the process's own ranks and runs no collective).
	crossEP bool
}

// startPlanProcs runs this test binary (its test named test) as two processes of c.local
// ranks each over c.layout and returns what each reported.
func startPlanProcs(t *testing.T, test string, c procCase) []planRun {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	f, err := ln.(*net.TCPListener).File()
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	dir := t.TempDir()
	outs := make([]bytes.Buffer, 2)
	errs := make([]error, 2)
	var wg sync.WaitGroup
	for node := range 2 {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		cmd := exec.CommandContext(ctx, os.Args[0], "-test.run=^"+test+"$", "-test.count=1")
		cmd.Env = append(os.Environ(), "HALO_PLAN_CHILD=1", "PLAN_NODE="+strconv.Itoa(node), "PLAN_ADDR="+ln.Addr().String(),
			"PLAN_LAYOUT="+c.layout, "PLAN_FAMILY="+c.family, "PLAN_LOCAL="+strconv.Itoa(c.local),
			"PLAN_DEVICES="+strconv.Itoa(2*c.local), "PLAN_OUT="+filepath.Join(dir, strconv.Itoa(node)))
		if node == 0 {
			cmd.ExtraFiles = []*os.File{f}
		}
		cmd.Stdout, cmd.Stderr = &outs[node], &outs[node]
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[node] = cmd.Wait()
		}()
	}
	wg.Wait()
	runs := make([]planRun, 2)
	for node := range 2 {
		if errs[node] != nil {
			t.Fatalf("process %d: %v\n%s", node, errs[node], outs[node].String())
		}
		raw, err := os.ReadFile(filepath.Join(dir, strconv.Itoa(node)))
		if err != nil {
			t.Fatalf("process %d wrote no result: %v\n%s", node, err, outs[node].String())
		}
		if err := gob.NewDecoder(bytes.NewReader(raw)).Decode(&runs[node]); err != nil {
			t.Fatalf("process %d: %v", node, err)
		}
	}
	return runs
}

// checkOverProcesses runs each case in one process driving every rank with the in-process
// communicator, then as two processes talking over TCP, and fails unless every process
// reports the same losses, gradient norms, aux losses, expert loads and biases, gradients,
// final weights and optimizer state, bit for bit.
func checkOverProcesses(t *testing.T, test string, cases []procCase) {
	for _, c := range cases {
		t.Run(fmt.Sprintf("%s/%dx%d/%s", c.family, 2, c.local, strings.ReplaceAll(c.layout, " ", ",")), func(t *testing.T) {
			l, err := mesh.ParseLayout(c.layout)
			if err != nil {
				t.Fatal(err)
			}
			ref, err := New(procModel(t, c.family), cpuDevices(2*c.local), l, Options{Optimizer: trainOpt})
			if err != nil {
				t.Fatal(err)
			}
			defer ref.Close()
			want := trainThreeSteps(t, ref)
			if ref.shape.MoE() && !(want.Aux[0] > 0 && want.Load[0] != nil && want.Bias[0] != nil) {
				t.Fatalf("aux loss %v, load %v, bias %v: the test would not exercise them", want.Aux[0], want.Load[0], want.Bias[0])
			}
			for node, got := range startPlanProcs(t, test, c) {
				for i := range want.Loss {
					if math.Float64bits(got.Loss[i]) != math.Float64bits(want.Loss[i]) || math.Float64bits(got.Norm[i]) != math.Float64bits(want.Norm[i]) {
						t.Errorf("process %d step %d: loss %v norm %v, one process %v and %v", node, i+1, got.Loss[i], got.Norm[i], want.Loss[i], want.Norm[i])
					}
					if math.Float64bits(got.Aux[i]) != math.Float64bits(want.Aux[i]) {
						t.Errorf("process %d step %d: aux loss %v, one process %v", node, i+1, got.Aux[i], want.Aux[i])
					}
					if !reflect.DeepEqual(got.Load[i], want.Load[i]) {
						t.Errorf("process %d step %d: expert load %v, one process %v", node, i+1, got.Load[i], want.Load[i])
					}
					if !reflect.DeepEqual(got.Bias[i], want.Bias[i]) {
						t.Errorf("process %d step %d: expert bias %v, one process %v", node, i+1, got.Bias[i], want.Bias[i])
					}
				}
				if math.Float64bits(got.ResumedLoss) != math.Float64bits(want.ResumedLoss) || math.Float64bits(got.ResumedNorm) != math.Float64bits(want.ResumedNorm) {
					t.Errorf("process %d: after LoadOptimizerState, loss %v norm %v, one process %v and %v", node, got.ResumedLoss, got.ResumedNorm, want.ResumedLoss, want.ResumedNorm)
				}
				if (got.ParamsCalls > 0) != c.crossEP {
					t.Errorf("process %d: Params ran %d collectives; want some only when an expert group spans the processes (%v)", node, got.ParamsCalls, c.crossEP)
				}
				sameBits(t, fmt.Sprintf("process %d: gradient", node), got.Grads, want.Grads)
				sameBits(t, fmt.Sprintf("process %d: parameter", node), got.Params, want.Params)
				sameState(t, fmt.Sprintf("process %d", node), got.StateStep, got.State, want.StateStep, want.State)
				if !strings.Contains(got.RelayoutErr, "Relayout") || !strings.Contains(got.RelayoutErr, "ranks [") {
					t.Errorf("process %d: Relayout over several processes gave %q; want a refusal naming it and the process's ranks", node, got.RelayoutErr)
				}
			}
		})
	}
}

// Two processes of two ranks each, talking over TCP, train the same three steps as one
// process driving four CPU ranks with the in-process communicator: every process reports the
// same losses, gradient norms and final weights, bit for bit.
func TestPlanOverProcessesMatchesOneProcess(t *testing.T) {
	if os.Getenv("HALO_PLAN_CHILD") != "" {
		planChild(t)
		return
	}
	var cases []procCase
	for _, layout := range []string{"dp=4", "fsdp", "tp=2 dp=2", "tp=2 fsdp", "cp=2 fsdp"} {
		cases = append(cases, procCase{"llama", layout, 2, false})
	}
	// Context parallelism with the context group split between the processes.
	cases = append(cases, procCase{"llama", "cp=2", 1, false})
	checkOverProcesses(t, "TestPlanOverProcessesMatchesOneProcess", cases)
}

// A mixture of experts (aux loss on, expert balancing on, 4 experts, top 2) under expert
// parallelism over two processes matches one process bit for bit: the dispatch and combine
// all-to-alls cross processes (ep=2 on one rank each, ep=4 on two), expert gradients are
// reduced over expert replicas in the other process (ep=2 on two ranks each), FSDP shards the
// experts over them, and the aux loss, expert loads, balancing biases, experts read back
// (Grads, Params) and the optimizer state are those of one process.
func TestMoEPlanOverProcessesMatchesOneProcess(t *testing.T) {
	if os.Getenv("HALO_PLAN_CHILD") != "" {
		planChild(t)
		return
	}
	checkOverProcesses(t, "TestMoEPlanOverProcessesMatchesOneProcess", []procCase{
		{"qwen3_moe", "dp=2", 1, false},
		{"qwen3_moe", "fsdp", 2, false},
		{"qwen3_moe", "ep=2", 1, true},
		{"qwen3_moe", "ep=4", 2, true},
		{"qwen3_moe", "ep=2", 2, false},
		{"qwen3_moe", "ep=2 fsdp", 2, false},
		{"qwen3_moe", "ep=4 fsdp", 2, true},
		{"qwen3_moe", "tp=2 etp=2 ep=2", 2, true},
		{"qwen3_moe", "tp=2 ep=2 fsdp", 2, true},
	})
}

// sameBits fails t unless got and want hold the same tensors, bit for bit.
func sameBits(t *testing.T, what string, got, want map[string][]float32) {
	t.Helper()
	if len(got) != len(want) {
		t.Fatalf("%s: %d tensors, one process %d", what, len(got), len(want))
	}
	for name, w := range want {
		g := got[name]
		if len(g) != len(w) {
			t.Fatalf("%s %s: %d values, one process %d", what, name, len(g), len(w))
		}
		for i := range w {
			if math.Float32bits(g[i]) != math.Float32bits(w[i]) {
				t.Fatalf("%s %s[%d] = %v, one process %v", what, name, i, g[i], w[i])
			}
		}
	}
}

// sameState fails t unless the optimizer states are equal, step and tensors bit for bit.
func sameState(t *testing.T, what string, gotStep int, got []optim.StateTensor, wantStep int, want []optim.StateTensor) {
	t.Helper()
	if gotStep != wantStep || len(got) != len(want) {
		t.Fatalf("%s: optimizer state of step %d with %d tensors, one process step %d with %d", what, gotStep, len(got), wantStep, len(want))
	}
	for i, w := range want {
		g := got[i]
		if g.Name != w.Name || g.DType != w.DType || !slices.Equal(g.Shape, w.Shape) || !bytes.Equal(g.Data, w.Data) {
			t.Errorf("%s: optimizer state %d is %s %s %v, one process %s %s %v (or their bytes differ)", what, i, g.Name, g.DType, g.Shape, w.Name, w.DType, w.Shape)
		}
	}
}

// A share of ranks that a multi-process plan cannot drive is refused before any device opens,
// naming what is supported.
func TestLocalRanksRefuseUnsupportedLayouts(t *testing.T) {
	for _, c := range []struct {
		family, layout string
		local          LocalRanks
		want           string
		noWorld        bool
	}{
		{"llama", "", LocalRanks{0, 2}, "need Options.World", true},
		{"llama", "tp=2", LocalRanks{1, 2}, "cut a tensor group", false},
		{"llama", "tp=4", LocalRanks{0, 2}, "cut a tensor group", false},
		{"qwen3_moe", "tp=2 etp=2 ep=2", LocalRanks{1, 2}, "cut a tensor group", false},
		{"llama", "", LocalRanks{2, 4}, "not inside the mesh", false},
		{"llama", "", LocalRanks{0, 0}, "not inside the mesh", false},
	} {
		t.Run(c.family+" "+c.layout, func(t *testing.T) {
			l, err := mesh.ParseLayout(c.layout)
			if err != nil {
				t.Fatal(err)
			}
			opened := false
			o := Options{Local: &c.local, NewBackend: func(int) (backend.Backend, error) { opened = true; return cpu.New(cpu.Options{}), nil }}
			if !c.noWorld {
				o.World = func([]backend.Backend) (comm.Fabric, error) { return nil, errors.New("the world must not be made") }
			}
			_, err = New(tinyModel(t, c.family, 1), cpuDevices(4), l, o)
			if err == nil || !strings.Contains(err.Error(), c.want) || !strings.Contains(err.Error(), "local ranks") && !strings.Contains(err.Error(), "supports") {
				t.Fatalf("got %v; want an error saying %q", err, c.want)
			}
			if opened {
				t.Error("a device was opened before the layout was refused")
			}
		})
	}
}
