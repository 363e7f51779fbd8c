package parallel

import (
	"errors"
	"math"
	"strings"
	"testing"

	"github.com/halo-shell/halo-shell/engine/backend"
	"github.com/halo-shell/halo-shell/engine/backend/cpu"
	"github.com/halo-shell/halo-shell/engine/comm"
	"github.com/halo-shell/halo-shell/engine/mesh"
)

// countingFabric is an in-process world seen only through comm.Fabric, counting what the plan
// asks of it.
type countingFabric struct {
	comm.Fabric
	splits []string
	closed int
}

func (f *countingFabric) Split(name string, groups [][]int) ([]comm.Communicator, error) {
	f.splits = append(f.splits, name)
	return f.Fabric.Split(name, groups)
}

func (f *countingFabric) Close() error {
	f.closed++
	return f.Fabric.Close()
}

// runPlan trains p for steps and returns the losses, gradient norms and final weights.
func runPlan(t *testing.T, p *Plan, steps int) (loss, norm []float64, params map[string][]float32) {
	t.Helper()
	for _, rows := range trainBatches(steps) {
		l, _, err := p.ForwardBackward(rows)
		if err != nil {
			t.Fatal(err)
		}
		n, err := p.Step(trainLR, trainMaxNorm)
		if err != nil {
			t.Fatal(err)
		}
		loss, norm = append(loss, l), append(norm, n)
	}
	params, err := p.Params()
	if err != nil {
		t.Fatal(err)
	}
	return loss, norm, params
}

func TestPlanThroughFabricIsBitIdenticalToDefaultWorld(t *testing.T) {
	for _, c := range []struct {
		family, layout string
		n              int
	}{
		{"llama", "tp=2 fsdp", 4},
		{"qwen3", "cp=2", 2},
		{"qwen3_moe", "ep=2 fsdp", 4},
	} {
		t.Run(c.family+" "+c.layout, func(t *testing.T) {
			src := tinyModel(t, c.family, 8)
			l, err := mesh.ParseLayout(c.layout)
			if err != nil {
				t.Fatal(err)
			}
			def, err := New(src, cpuDevices(c.n), l, Options{Optimizer: trainOpt})
			if err != nil {
				t.Fatal(err)
			}
			defer def.Close()
			var fab *countingFabric
			through, err := New(src, cpuDevices(c.n), l, Options{Optimizer: trainOpt, World: func(devs []backend.Backend) (comm.Fabric, error) {
				w, err := comm.NewWorld(devs)
				if err != nil {
					return nil, err
				}
				fab = &countingFabric{Fabric: w.Fabric()}
				return fab, nil
			}})
			if err != nil {
				t.Fatal(err)
			}
			wantLoss, wantNorm, wantParams := runPlan(t, def, 3)
			gotLoss, gotNorm, gotParams := runPlan(t, through, 3)
			for i := range wantLoss {
				if math.Float64bits(gotLoss[i]) != math.Float64bits(wantLoss[i]) || math.Float64bits(gotNorm[i]) != math.Float64bits(wantNorm[i]) {
					t.Errorf("step %d: loss %v norm %v through the fabric, %v and %v in the default world", i+1, gotLoss[i], gotNorm[i], wantLoss[i], wantNorm[i])
				}
			}
			for name, want := range wantParams {
				got := gotParams[name]
				if len(got) != len(want) {
					t.Fatalf("%s: %d values through the fabric, %d in the default world", name, len(got), len(want))
				}
				for i := range want {
					if math.Float32bits(got[i]) != math.Float32bits(want[i]) {
						t.Fatalf("%s[%d]: %v through the fabric, %v in the default world", name, i, got[i], want[i])
					}
				}
			}
			if want := []string{"tp", "cp", "data", "ep", "edata"}; strings.Join(fab.splits, " ") != strings.Join(want, " ") {
				t.Errorf("the plan split the fabric %d times (%v), want one per mesh dimension (%v)", len(fab.splits), fab.splits, want)
			}
			if err := through.Close(); err != nil {
				t.Fatal(err)
			}
			if fab.closed != 1 {
				t.Errorf("Plan.Close closed the fabric %d times, want 1", fab.closed)
			}
		})
	}
}

func TestPlanRefusesAFabricThatDoesNotDriveEveryRank(t *testing.T) {
	src := tinyModel(t, "llama", 1)
	l, _ := mesh.ParseLayout("tp=2")
	var closed int
	var splitFailures []*failingSplit
	for _, c := range []struct {
		name  string
		world func([]backend.Backend) (comm.Fabric, error)
		want  string
	}{
		{"fewer local ranks", func(devs []backend.Backend) (comm.Fabric, error) {
			w, err := comm.NewWorld(devs[:2])
			if err != nil {
				return nil, err
			}
			return &countingFabric{Fabric: w.Fabric()}, nil
		}, "drives 2 ranks in this process; the plan has 4"},
		{"split fails", func(devs []backend.Backend) (comm.Fabric, error) {
			w, err := comm.NewWorld(devs)
			if err != nil {
				return nil, err
			}
			fab := &failingSplit{countingFabric: countingFabric{Fabric: w.Fabric()}}
			splitFailures = append(splitFailures, fab)
			return fab, nil
		}, "no communicators for group cp"},
		{"world fails", func([]backend.Backend) (comm.Fabric, error) {
			return nil, errors.New("nccl: libnccl.so.2 not found")
		}, "communicators over 4 devices: nccl: libnccl.so.2 not found"},
	} {
		t.Run(c.name, func(t *testing.T) {
			_, err := New(src, cpuDevices(4), l, Options{World: c.world, NewBackend: func(int) (backend.Backend, error) {
				return closeCounter{Backend: cpu.New(cpu.Options{Workers: 1}), n: &closed}, nil
			}})
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("got %v, want an error containing %q", err, c.want)
			}
		})
	}
	if closed != 12 {
		t.Errorf("%d devices closed after the refusals, want all 12", closed)
	}
	if len(splitFailures) != 1 || splitFailures[0].closed != 1 {
		t.Errorf("a fabric whose split failed was not closed exactly once: %+v", splitFailures)
	}
}

// failingSplit refuses the second split (the context-parallel groups).
type failingSplit struct{ countingFabric }

func (f *failingSplit) Split(name string, groups [][]int) ([]comm.Communicator, error) {
	if name == "cp" {
		return nil, errors.New("no communicators for group cp")
	}
	return f.countingFabric.Split(name, groups)
}

type closeCounter struct {
	backend.Backend
	n *int
}

func (c closeCounter) Close() error {
	*c.n++
	return c.Backend.Close()
}
