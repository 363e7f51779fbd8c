package server

import (
	"encoding/json"
	"fmt"
	"math"
	"path/filepath"
	"strings"
	"testing"

	"connectrpc.com/connect/v2"
	"github.com/halo-shell/halo-shell/session"
)

func TestSetLayoutBetweenStepsMatchesAFreshSession(t *testing.T) {
	_, c := loaded(t, "--gradient_accumulation_steps=2")
	ctx := ctxT(t)
	ev, err := c.Subscribe(ctx, 256)
	if err != nil {
		t.Fatal(err)
	}
	if st := status(t, c); st.Layout != "dp=1 tp=1 cp=1 ep=1 etp=1" {
		t.Fatalf("status layout %q before any SetLayout, want one device", st.Layout)
	}
	if _, err := c.Step(ctx, 2); err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	for i, tc := range []struct {
		spec, layout, devices string
		flags                 []string
	}{
		{"cp=2", "dp=1 tp=1 cp=2 ep=1 etp=1", "cpu:2", []string{"--devices=cpu:2", "--context_parallel_size=2"}},
		{"devices=cpu:4 cp=2 fsdp", "dp=2 fsdp tp=1 cp=2 ep=1 etp=1", "cpu:4", []string{"--devices=cpu:4", "--context_parallel_size=2", "--fsdp=true"}},
		{"dp=1", "dp=1 tp=1 cp=1 ep=1 etp=1", "", nil},
	} {
		r, err := c.SetLayout(ctx, tc.spec)
		if err != nil {
			t.Fatalf("SetLayout(%q): %v", tc.spec, err)
		}
		if r.Layout != tc.layout || r.DurationS <= 0 || r.Step != int64(2+i) {
			t.Fatalf("SetLayout(%q) = %v, want layout %q at step %d with its duration", tc.spec, r, tc.layout, 2+i)
		}
		if tc.devices != "" && r.Devices != tc.devices {
			t.Fatalf("SetLayout(%q) devices %q, want %q", tc.spec, r.Devices, tc.devices)
		}
		if st := status(t, c); st.Layout != tc.layout {
			t.Fatalf("status layout %q after SetLayout(%q)", st.Layout, tc.spec)
		}
		// The same state in a fresh session started in the new layout computes the same loss.
		ck := filepath.Join(dir, "ck"+string(rune('0'+i)))
		if _, err := c.Save(ctx, ck); err != nil {
			t.Fatal(err)
		}
		_, fresh := loaded(t, append([]string{"--gradient_accumulation_steps=2", "--resume_from_checkpoint=" + ck}, tc.flags...)...)
		want, err := fresh.Step(ctx, 1)
		if err != nil {
			t.Fatal(err)
		}
		got, err := c.Step(ctx, 1)
		if err != nil {
			t.Fatal(err)
		}
		if math.Abs(got[0].Loss-want[0].Loss) > 1e-5*math.Abs(want[0].Loss) {
			t.Fatalf("after SetLayout(%q): loss %v, a fresh session in that layout %v", tc.spec, got[0].Loss, want[0].Loss)
		}
	}
	// The move is logged with its duration.
	for {
		e, err := ev.Recv()
		if err != nil {
			t.Fatal(err)
		}
		if l := e.GetLog(); l != nil && strings.Contains(l.Message, "layout at step 2: dp=1 tp=1 cp=2") && strings.Contains(l.Message, "redistributed in") {
			break
		}
	}
}

func TestSetLayoutRefusesAnInvalidTargetAndTheRunContinues(t *testing.T) {
	_, c := loaded(t, "--devices=cpu:2", "--context_parallel_size=2")
	ctx := ctxT(t)
	if _, err := c.Run(ctx, 0); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "two steps", func() bool { return status(t, c).Step >= 2 })
	for _, tc := range []struct{ spec, want string }{
		{"tp=2", "rule"},                        // one key/value head cannot be split
		{"dp=2", "gradient_accumulation_steps"}, // one micro-batch per step cannot be dealt to two data ranks
		{"tp=two", "tp needs a degree"},
		{"", "give a layout"},
	} {
		_, err := c.SetLayout(ctx, tc.spec)
		if connect.CodeOf(err) != connect.CodeInvalidArgument {
			t.Fatalf("SetLayout(%q): %v, want invalid_argument", tc.spec, err)
		}
		mustContain(t, err, tc.want)
	}
	st := status(t, c)
	if st.Layout != "dp=1 tp=1 cp=2 ep=1 etp=1" || st.Devices != "cpu:2" || st.State != session.StateRunning {
		t.Fatalf("after refusals: layout %q on %q, state %v; want the old layout, still running", st.Layout, st.Devices, st.State)
	}
	from := st.Step
	waitFor(t, "the run to go on", func() bool { return status(t, c).Step >= from+2 })
	// A valid target is taken at a step boundary of the running run, which goes on in it.
	r, err := c.SetLayout(ctx, "dp=1")
	if err != nil {
		t.Fatal(err)
	}
	if r.Layout != "dp=1 tp=1 cp=1 ep=1 etp=1" || r.Previous != "dp=1 tp=1 cp=2 ep=1 etp=1" {
		t.Fatalf("SetLayout during a run = %v", r)
	}
	waitFor(t, "the run to go on in the new layout", func() bool { return status(t, c).Step >= r.Step+2 })
	if st := status(t, c); st.State != session.StateRunning || st.Layout != r.Layout {
		t.Fatalf("after SetLayout during a run: state %v, layout %q", st.State, st.Layout)
	}
	if _, err := c.Pause(ctx); err != nil {
		t.Fatal(err)
	}
	if st := status(t, c); st.LastError != "" {
		t.Fatalf("the run recorded an error: %s", st.LastError)
	}
}

func TestProfileOfAParallelStepSplitsCollectives(t *testing.T) {
	_, c := loaded(t, "--gradient_accumulation_steps=2", "--devices=cpu:4", "--context_parallel_size=2", "--fsdp=true")
	ctx := ctxT(t)
	ms, err := c.Step(ctx, 1)
	if err != nil {
		t.Fatal(err)
	}
	// Memory is reported per device of the plan.
	if mem := ms[0].Memory; len(mem) != 4 || mem[3].Device != "cpu rank 3" || mem[3].PeakBytes <= 0 {
		t.Fatalf("step memory %v: want the four devices of the plan with their peaks", mem)
	}
	r, err := c.Profile(ctx, 2, true)
	if err != nil {
		t.Fatal(err)
	}
	if len(r.Steps) != 2 {
		t.Fatalf("Profile(2) returned %d steps", len(r.Steps))
	}
	for _, p := range r.Steps {
		sum := p.HostS
		for _, v := range p.ComputeS {
			sum += v
		}
		for _, v := range p.CommS {
			sum += v
		}
		// Each rank's parts add up to its step (host = step - spans, never below 0); averaged over
		// ranks whose spans sometimes fill their step, and with the ranks' clocks a little apart,
		// the sum may run over the wall time (by a few percent on a loaded machine) but never
		// under it. A sum over the four ranks instead of a mean would be about 4x: the bound
		// tells the two apart.
		if sum > 1.5*p.StepS || sum < (1-1e-3)*p.StepS {
			t.Errorf("step %d: parts sum to %gs (host %gs), the step took %gs", p.Step, sum, p.HostS, p.StepS)
		}
		if measured := p.Metrics.StepTimeS; p.StepS < measured || p.StepS > 1.5*measured+0.01 {
			t.Errorf("step %d: profiled %gs, the trainer measured %gs", p.Step, p.StepS, measured)
		}
		// cp=2 all-gathers keys and values and reduce-scatters their gradients; fsdp
		// reduce-scatters gradients and all-gathers parameters; the gradient norm is all-reduced.
		for _, kind := range []string{"all_gather", "reduce_scatter", "all_reduce"} {
			if p.CommS[kind] <= 0 {
				t.Errorf("step %d: no time in %s: %v", p.Step, kind, p.CommS)
			}
		}
		for _, class := range []string{"matmul", "attention", "optimizer"} {
			if p.ComputeS[class] <= 0 {
				t.Errorf("step %d: no time in %s: %v", p.Step, class, p.ComputeS)
			}
		}
	}
	var tr struct {
		TraceEvents []struct {
			Name string         `json:"name"`
			Cat  string         `json:"cat"`
			Pid  int            `json:"pid"`
			Args map[string]any `json:"args"`
		} `json:"traceEvents"`
	}
	if err := json.Unmarshal(r.TraceJson, &tr); err != nil {
		t.Fatal(err)
	}
	// One process per device, each with its compute and collective spans.
	spans := map[int]map[string]int{}
	names := map[int]any{}
	for _, e := range tr.TraceEvents {
		if spans[e.Pid] == nil {
			spans[e.Pid] = map[string]int{}
		}
		spans[e.Pid][e.Cat]++
		if e.Name == "process_name" {
			names[e.Pid] = e.Args["name"]
		}
	}
	for d := range 4 {
		s := spans[d+1]
		if s["all_gather"] == 0 || s["reduce_scatter"] == 0 || s["matmul"] == 0 || s["step"] != 2 {
			t.Fatalf("trace of device %d, spans by category %v: want 2 steps with collectives beside compute", d, s)
		}
		if want := fmt.Sprintf("device %d", d); names[d+1] != want {
			t.Fatalf("process %d is named %v, want %q", d+1, names[d+1], want)
		}
	}
}
