package train

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/halo-shell/halo-shell/engine/comm/rendezvous"
	"github.com/halo-shell/halo-shell/internal/testnet"
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
		// Context and expert groups may span nodes; tensor groups may not.
		{[]string{"--devices=cpu:2", "--context_parallel_size=2"}, 2, "", "cpu:4", "dp=2 tp=1 cp=2 ep=1 etp=1"},
		{[]string{"--devices=cpu", "--context_parallel_size=2"}, 2, "", "cpu:2", "dp=1 tp=1 cp=2 ep=1 etp=1"},
		{[]string{"--devices=cpu:2", "--expert_parallel_size=2", "--gradient_accumulation_steps=4"}, 2, "", "cpu:4", "dp=4 tp=1 cp=1 ep=2 etp=1"},
		{[]string{"--devices=cpu", "--expert_parallel_size=2"}, 2, "", "cpu:2", "dp=2 tp=1 cp=1 ep=2 etp=1"},
		{[]string{"--devices=cpu:2", "--tensor_parallel_size=2", "--expert_tensor_parallel_size=2", "--expert_parallel_size=2"}, 2, "", "cpu:4", "dp=2 tp=2 cp=1 ep=2 etp=2"},
		{[]string{"--devices=cpu:2", "--expert_parallel_size=2"}, 2, "gradient_accumulation_steps 2 micro-batches cannot be dealt over 4 data-parallel ranks", "", ""},
		{[]string{"--devices=cpu", "--tensor_parallel_size=2"}, 2, "tensor_parallel_size 2 does not divide the 1 devices of a node", "", ""},
		// K GPUs per node make a mesh of the world's N·K ranks, whatever the node's device numbers.
		{[]string{"--devices=cuda:0-1", "--device=auto", "--gradient_accumulation_steps=4"}, 2, "", "cuda:0-3", "dp=4 tp=1 cp=1 ep=1 etp=1"},
		{[]string{"--devices=cuda:3", "--device=auto", "--gradient_accumulation_steps=3"}, 3, "", "cuda:0-2", "dp=3 tp=1 cp=1 ep=1 etp=1"},
		{[]string{"--devices=cuda:2,5", "--device=auto", "--gradient_accumulation_steps=2", "--tensor_parallel_size=2", "--fsdp=true"}, 2, "", "cuda:0-3", "dp=2 fsdp tp=2 cp=1 ep=1 etp=1"},
		{[]string{"--devices=cuda:0-1", "--device=auto"}, 2, "gradient_accumulation_steps 2 micro-batches cannot be dealt over 4 data-parallel ranks", "", ""},
		{[]string{"--devices=cuda:0-1", "--device=auto", "--context_parallel_size=2"}, 2, "", "cuda:0-3", "dp=2 tp=1 cp=2 ep=1 etp=1"},
		{[]string{"--devices=cuda:0-1", "--device=auto", "--expert_parallel_size=4", "--gradient_accumulation_steps=4"}, 2, "", "cuda:0-3", "dp=4 tp=1 cp=1 ep=4 etp=1"},
		{[]string{"--devices=cuda:0", "--device=auto", "--tensor_parallel_size=2", "--gradient_accumulation_steps=2"}, 2, "tensor_parallel_size 2 does not divide the 1 devices of a node (cuda:0); a run across nodes supports", "", ""},
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
	aux        []float64     // the MoE aux loss of each step (none for dense models)
	load       [][][]int     // the expert load of each step, per MoE layer and expert
	bias       [][][]float32 // the balancing bias after each step (nil entries when it is off)
	rank, n    int
	layout     LayoutInfo
	layoutErr  error
	err        error
}

// record appends a step's metrics and the bias after it to r.
func (r *nodeRun) record(m StepMetrics, bias [][]float32) {
	r.bias = append(r.bias, bias)
	r.loss, r.norm = append(r.loss, m.Loss), append(r.norm, m.GradNorm)
	if m.AuxLoss != nil {
		r.aux = append(r.aux, *m.AuxLoss)
	}
	if m.ExpertLoad != nil {
		var l [][]int
		for _, x := range m.ExpertLoad {
			l = append(l, x.Tokens)
		}
		r.load = append(r.load, l)
	}
}

// trainAcross runs nnodes trainers of cfgs(node) in this process, joined over TCP on
// localhost, for steps steps each; after step saveAt (when > 0) every node calls Save(ckpt)
// (node 0 writes it).
func trainAcross(t *testing.T, nnodes, steps int, cfgs func(node int) *Config, saveAt int, ckpt string) []nodeRun {
	t.Helper()
	return trainAcrossWith(t, nnodes, steps, cfgs, func(int) gpuNodeOps { return realGPUNodeOps() }, saveAt, ckpt)
}

// trainAcrossWith is trainAcross with node reaching its GPUs and NCCL through ops(node). The
// rendezvous port is one the system handed out a moment before; if another process took it in
// between (node 0 cannot bind it: nothing has run yet), the nodes join again on a new one.
func trainAcrossWith(t *testing.T, nnodes, steps int, cfgs func(node int) *Config, ops func(node int) gpuNodeOps, saveAt int, ckpt string) []nodeRun {
	t.Helper()
	for attempt := 1; ; attempt++ {
		runs := trainAcrossAt(t, freeAddr(t), nnodes, steps, cfgs, ops, saveAt, ckpt)
		if attempt == 3 || runs[0].err == nil || !strings.Contains(runs[0].err.Error(), "address already in use") {
			return runs
		}
		t.Logf("the rendezvous port was taken before node 0 bound it (%v); joining on another", runs[0].err)
	}
}

// trainAcrossAt is trainAcrossWith with the rendezvous at addr.
func trainAcrossAt(t *testing.T, addr string, nnodes, steps int, cfgs func(node int) *Config, ops func(node int) gpuNodeOps, saveAt int, ckpt string) []nodeRun {
	t.Helper()
	runs := make([]nodeRun, nnodes)
	var wg sync.WaitGroup
	for node := range nnodes {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r := &runs[node]
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			tr, err := newOnNodes(ctx, cfgs(node), rendezvous.Config{NNodes: nnodes, NodeRank: node, Addr: addr, Token: "nodes-secret", Timeout: 30 * time.Second}, ops(node))
			if err != nil {
				r.err = err
				return
			}
			defer tr.Close()
			r.rank, r.n = tr.Node()
			r.layout = tr.Layout()
			for range steps {
				m, err := tr.Step(ctx)
				if err != nil {
					r.err = err
					return
				}
				r.record(m, tr.ExpertBias())
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
		r.record(m, tr.ExpertBias())
		if m.Step == saveAt {
			if err := tr.Save(ckpt); err != nil {
				t.Fatal(err)
			}
		}
	}
	return r
}

// sameRun fails t unless got's losses, gradient norms, aux losses and expert loads are want's
// and the balancing bias after each step from step from on, bit for bit.
func sameRun(t *testing.T, what string, got nodeRun, want nodeRun, from int) {
	t.Helper()
	if got.err != nil {
		t.Fatalf("%s: %v", what, got.err)
	}
	if len(got.loss) != len(want.loss)-from || len(got.aux) != max(0, len(want.aux)-from) || len(got.load) != max(0, len(want.load)-from) {
		t.Fatalf("%s: %d steps (%d aux losses, %d expert loads), want %d (%d, %d)", what, len(got.loss), len(got.aux), len(got.load), len(want.loss)-from, len(want.aux), len(want.load))
	}
	for i := range got.loss {
		w := from + i
		if math.Float64bits(got.loss[i]) != math.Float64bits(want.loss[w]) || math.Float64bits(got.norm[i]) != math.Float64bits(want.norm[w]) {
			t.Errorf("%s step %d: loss %v norm %v, uninterrupted %v %v", what, w+1, got.loss[i], got.norm[i], want.loss[w], want.norm[w])
		}
	}
	for i := range got.aux {
		if w := from + i; math.Float64bits(got.aux[i]) != math.Float64bits(want.aux[w]) {
			t.Errorf("%s step %d: aux loss %v, uninterrupted %v", what, w+1, got.aux[i], want.aux[w])
		}
	}
	for i := range got.load {
		if w := from + i; !reflect.DeepEqual(got.load[i], want.load[w]) {
			t.Errorf("%s step %d: expert load %v, uninterrupted %v", what, w+1, got.load[i], want.load[w])
		}
	}
	for i := range got.bias {
		if w := from + i; !reflect.DeepEqual(got.bias[i], want.bias[w]) {
			t.Errorf("%s step %d: balancing bias %v, uninterrupted %v", what, w+1, got.bias[i], want.bias[w])
		}
	}
}

// ckptParams reads the weights of checkpoint dir into a one-device trainer of cfg.
func ckptParams(t *testing.T, cfg *Config, dir string) map[string][]float32 {
	t.Helper()
	tr := newTrainer(t, cfg)
	if err := loadModelWeights(tr.model, dir); err != nil {
		t.Fatal(err)
	}
	return hostParams(t, tr)
}

// acrossCase is a layout of TestTrainersAcrossNodesMatchOneProcess: two nodes of devices
// each run layout, then resume in other.
type acrossCase struct {
	name    string
	moe     bool // the tiny qwen3_moe (aux loss and balancing on) instead of the dense qwen3
	devices string
	layout  []string
	other   []string
}

// Two trainers of cpu:K each, joined over TCP, step exactly as one trainer on cpu:2K with the
// same layout (losses, gradient norms, MoE aux losses, expert loads and balancing bias bit for
// bit, on every node), for dense layouts (fsdp, tp, cp spanning the nodes) and MoE ones (ep
// with expert groups inside a node and spanning the nodes, ep with fsdp, tp+etp+ep); moving
// the layout is refused; node 0's step-2 checkpoint holds the same weights and optimizer state
// as the one-process trainer's; resumed from it across nodes (in the same layout and in
// another one) or in one process, the run continues bit for bit as it would have.
func TestTrainersAcrossNodesMatchOneProcess(t *testing.T) {
	path := writeJSONL(t, t.TempDir(), "d.jsonl", pcRecords(24))
	fsdp, tp := []string{"--gradient_accumulation_steps=4", "--fsdp=true"}, []string{"--gradient_accumulation_steps=4", "--tensor_parallel_size=2"}
	for _, c := range []acrossCase{
		{"dense fsdp", false, "cpu:2", fsdp, tp},
		{"dense tp=2", false, "cpu:2", tp, fsdp},
		// The context group spans the nodes.
		{"dense cp=2 on cpu:1", false, "cpu", []string{"--context_parallel_size=2"}, []string{}},
		{"dense tp=2 cp=2", false, "cpu:2", []string{"--context_parallel_size=2", "--tensor_parallel_size=2"}, []string{"--tensor_parallel_size=2"}},
		// Each expert group spans the nodes: Params and Grads are collectives.
		{"moe ep=2 on cpu:1", true, "cpu", []string{"--gradient_accumulation_steps=2", "--expert_parallel_size=2"}, []string{"--gradient_accumulation_steps=2"}},
		// Each node holds whole expert groups; resumed with groups across the nodes.
		{"moe ep=2 on cpu:2", true, "cpu:2", []string{"--gradient_accumulation_steps=4", "--expert_parallel_size=2"}, []string{"--gradient_accumulation_steps=4", "--expert_parallel_size=4"}},
		{"moe ep=2 fsdp", true, "cpu:2", []string{"--gradient_accumulation_steps=4", "--expert_parallel_size=2", "--fsdp=true"},
			[]string{"--gradient_accumulation_steps=4", "--tensor_parallel_size=2", "--expert_tensor_parallel_size=2", "--expert_parallel_size=2"}},
		{"moe tp=2 etp=2 ep=2", true, "cpu:2", []string{"--gradient_accumulation_steps=4", "--tensor_parallel_size=2", "--expert_tensor_parallel_size=2", "--expert_parallel_size=2"}, fsdp},
	} {
		t.Run(c.name, func(t *testing.T) {
			const steps, saveAt = 4, 2
			dir := t.TempDir()
			k := 1
			if c.devices != "cpu" {
				k = 2
			}
			world := fmt.Sprintf("cpu:%d", 2*k)
			cfg := func(devices string, layout []string, extra ...string) *Config {
				args := append(append([]string{"--devices=" + devices}, layout...), extra...)
				if c.moe {
					return tinyMoEConfigKV(t, path, 2, append(args, "--moe_balancing_rate=0.02")...)
				}
				return tinyParallelConfig(t, path, args...)
			}
			refCkpt := filepath.Join(dir, "ref")
			want := stepOne(t, cfg(world, c.layout), steps, saveAt, refCkpt)
			if c.moe && (len(want.aux) != steps || want.aux[0] == 0 || isZero(want.bias[0])) {
				t.Fatalf("the MoE reference run has aux losses %v and bias %v: the aux loss and balancing must be on", want.aux, want.bias)
			}
			ckpt := filepath.Join(dir, "nodes")
			runs := trainAcross(t, 2, steps, func(int) *Config { return cfg(c.devices, c.layout) }, saveAt, ckpt)
			for node, r := range runs {
				if r.rank != node || r.n != 2 {
					t.Errorf("node %d: Node() = %d, %d", node, r.rank, r.n)
				}
				sameRun(t, fmt.Sprintf("node %d", node), r, want, 0)
				if r.layoutErr == nil || !strings.Contains(r.layoutErr.Error(), "SetLayout") || !strings.Contains(r.layoutErr.Error(), "a run across nodes supports") {
					t.Errorf("node %d: SetLayout across nodes gave %v, want a refusal naming what is supported", node, r.layoutErr)
				}
			}
			one := cfg("cpu", nil)
			if s := sameBits(ckptParams(t, one, ckpt), ckptParams(t, one, refCkpt)); s != "" {
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
			for node, r := range trainAcross(t, 2, steps-saveAt, func(int) *Config { return cfg(c.devices, c.layout, resume) }, 0, "") {
				sameRun(t, fmt.Sprintf("resumed across nodes: node %d", node), r, want, saveAt)
			}
			// Resumed in one process on cpu:2K.
			sameRun(t, "resumed in one process", stepOne(t, cfg(world, c.layout, resume), steps-saveAt, 0, ""), want, saveAt)
			// Resumed across nodes in the other layout: as one process resumed in that layout.
			other := stepOne(t, cfg(world, c.other, resume), steps-saveAt, 0, "")
			for node, r := range trainAcross(t, 2, steps-saveAt, func(int) *Config { return cfg(c.devices, c.other, resume) }, 0, "") {
				sameRun(t, fmt.Sprintf("resumed across nodes in layout %v: node %d", c.other, node), r, other, 0)
			}
		})
	}
}

// Two nodes of one GPU each training a tiny qwen3_moe with ep=2 (each expert group spans the
// nodes) join one world from the rendezvous and step as one process with ep=2 on two devices:
// the same losses, aux losses, expert loads and balancing bias on every node, node 0's
// checkpoint holding the same weights and optimizer state, and a run resumed from it across
// the nodes continuing as the uninterrupted one. The GPUs and NCCL are stood in for by CPU
// devices and an in-process world (fakeNCCL), so this checks the wiring, not NCCL.
func TestMoEOnGPUNodesMatchesOneProcess(t *testing.T) {
	path := writeJSONL(t, t.TempDir(), "d.jsonl", pcRecords(24))
	dir := t.TempDir()
	const steps, saveAt = 3, 2
	cfg := func(devices string, extra ...string) *Config {
		return tinyMoEConfigKV(t, path, 2, append([]string{"--devices=" + devices, "--expert_parallel_size=2", "--gradient_accumulation_steps=2", "--moe_balancing_rate=0.02"}, extra...)...)
	}
	refCkpt, ckpt := filepath.Join(dir, "ref"), filepath.Join(dir, "nodes")
	want := stepOne(t, cfg("cpu:2"), steps, saveAt, refCkpt)
	f := newFakeNCCL(2)
	gpu := func(node int, extra ...string) *Config {
		return cfg(fmt.Sprintf("cuda:%d", node), append([]string{"--device=auto"}, extra...)...)
	}
	for node, r := range trainAcrossWith(t, 2, steps, func(node int) *Config { return gpu(node) }, func(int) gpuNodeOps { return f.ops(nil, nil) }, saveAt, ckpt) {
		sameRun(t, fmt.Sprintf("node %d", node), r, want, 0)
	}
	one := tinyMoEConfigKV(t, path, 2)
	if s := sameBits(ckptParams(t, one, ckpt), ckptParams(t, one, refCkpt)); s != "" {
		t.Errorf("node 0's checkpoint: %s", s)
	}
	a, err := os.ReadFile(filepath.Join(ckpt, OptimizerFile))
	if err != nil {
		t.Fatal(err)
	}
	if b, err := os.ReadFile(filepath.Join(refCkpt, OptimizerFile)); err != nil || !bytes.Equal(a, b) {
		t.Errorf("node 0's %s differs from the one-process checkpoint's (%v)", OptimizerFile, err)
	}
	f = newFakeNCCL(2)
	for node, r := range trainAcrossWith(t, 2, steps-saveAt, func(node int) *Config { return gpu(node, "--resume_from_checkpoint="+ckpt) }, func(int) gpuNodeOps { return f.ops(nil, nil) }, 0, "") {
		sameRun(t, fmt.Sprintf("resumed: node %d", node), r, want, saveAt)
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

// A layout no run supports (here context parallelism of a mixture-of-experts model) is
// refused across nodes before the rendezvous, naming the rule, rather than waiting for nodes
// that never come.
func TestNewOnNodesRefusesBadLayoutsBeforeTheRendezvous(t *testing.T) {
	path := writeJSONL(t, t.TempDir(), "d.jsonl", pcRecords(8))
	cfg := tinyMoEConfig(t, path, "--devices=cpu:2", "--context_parallel_size=2", "--gradient_accumulation_steps=2")
	start := time.Now()
	_, err := NewOnNodes(context.Background(), cfg, rendezvous.Config{NNodes: 2, Addr: "127.0.0.1:1", Token: "x", Timeout: 20 * time.Second})
	if err == nil || !strings.Contains(err.Error(), "context parallelism of mixture-of-experts models is not supported") {
		t.Fatalf("got %v", err)
	}
	if el := time.Since(start); el > 10*time.Second {
		t.Errorf("the refusal took %s", el)
	}
}

// runOutputs are the files of a Run's output_dir that TestRunAcrossNodesWithExpertGroupsAcrossNodes
// compares, by name.
var runOutputs = []string{MetricsFile, "model.safetensors", "generation_eval.json", "checkpoint-2/" + OptimizerFile, "checkpoint-3/model.safetensors"}

// Run on two nodes of cpu:1 with ep=2, so each expert group spans both nodes and gathering the
// parameters (held-out evaluation every step, the checkpoints, the final model, generation
// eval) is a collective of both nodes: both nodes finish, and node 0 writes the same
// metrics.jsonl (losses, aux losses, expert loads, held-out losses), checkpoints, model and
// generation results as one process on cpu:2 with the same layout; node 1 writes nothing.
func TestRunAcrossNodesWithExpertGroupsAcrossNodes(t *testing.T) {
	path := writeJSONL(t, t.TempDir(), "d.jsonl", pcRecords(30))
	dir := t.TempDir()
	cfg := func(devices, out string) *Config {
		return tinyMoEConfigKV(t, path, 2, "--devices="+devices, "--expert_parallel_size=2", "--gradient_accumulation_steps=2",
			"--moe_balancing_rate=0.02", "--dataset.eval_split=0.2", "--eval_steps=1", "--save_steps=2", "--max_steps=3",
			"--generation_eval.max_samples=3", "--generation_eval.max_new_tokens=4", "--output_dir="+out)
	}
	ref := filepath.Join(dir, "ref")
	tr := newTrainer(t, cfg("cpu:2", ref))
	if _, err := Run(context.Background(), tr, RunOptions{}); err != nil {
		t.Fatal(err)
	}
	addr := freeAddr(t)
	outs := []string{filepath.Join(dir, "node0"), filepath.Join(dir, "node1")}
	errs := make([]error, 2)
	done := make(chan struct{})
	var wg sync.WaitGroup
	for node := range 2 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			tr, err := NewOnNodes(ctx, cfg("cpu", outs[node]), rendezvous.Config{NNodes: 2, NodeRank: node, Addr: addr, Token: "nodes-secret", Timeout: 30 * time.Second})
			if err != nil {
				errs[node] = err
				return
			}
			defer tr.Close()
			_, errs[node] = Run(ctx, tr, RunOptions{})
		}()
	}
	go func() { wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(2 * time.Minute):
		t.Fatal("the nodes did not finish in 2 minutes: one waits in a collective the other never calls")
	}
	for node, err := range errs {
		if err != nil {
			t.Fatalf("node %d: %v", node, err)
		}
	}
	for _, f := range runOutputs {
		a, err := os.ReadFile(filepath.Join(outs[0], f))
		if err != nil {
			t.Fatalf("node 0: %v", err)
		}
		b, err := os.ReadFile(filepath.Join(ref, f))
		if err != nil {
			t.Fatal(err)
		}
		if f == MetricsFile {
			a, b = dropTimes(t, a), dropTimes(t, b)
			if !bytes.Contains(a, []byte(`"eval_loss"`)) || !bytes.Contains(a, []byte(`"aux_loss"`)) {
				t.Errorf("node 0's %s lacks held-out or aux losses:\n%s", f, a)
			}
		}
		if !bytes.Equal(a, b) {
			t.Errorf("node 0's %s differs from the one-process run's:\n%s\nwant\n%s", f, a, b)
		}
	}
	if _, err := os.Stat(outs[1]); !os.IsNotExist(err) {
		t.Errorf("node 1 wrote %s (%v); only node 0 writes files", outs[1], err)
	}
}

// dropTimes removes the wall-clock fields of metrics.jsonl lines (step time, throughput).
func dropTimes(t *testing.T, raw []byte) []byte {
	t.Helper()
	var out []byte
	for _, line := range bytes.Split(bytes.TrimSpace(raw), []byte("\n")) {
		var m map[string]json.RawMessage
		if err := json.Unmarshal(line, &m); err != nil {
			t.Fatalf("%s: %v", line, err)
		}
		delete(m, "step_time_s")
		delete(m, "tokens_per_s")
		delete(m, "time_by_op_s")
		b, err := json.Marshal(m)
		if err != nil {
			t.Fatal(err)
		}
		out = append(append(out, b...), '\n')
	}
	return out
}

// freeAddr returns a localhost address whose port was free a moment ago, below the
// ephemeral range (testnet).
func freeAddr(t *testing.T) string {
	t.Helper()
	return testnet.FreeAddr(t)
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
