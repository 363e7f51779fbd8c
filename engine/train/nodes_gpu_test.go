package train

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/halo-shell/halo-shell/engine/backend"
	"github.com/halo-shell/halo-shell/engine/comm"
	"github.com/halo-shell/halo-shell/engine/comm/nccl"
	"github.com/halo-shell/halo-shell/engine/comm/rendezvous"
	"github.com/halo-shell/halo-shell/engine/mesh"
	"github.com/halo-shell/halo-shell/engine/profile"
)

// fakeNCCL stands in for the GPUs and NCCL of the nodes of a run across nodes on GPUs whose
// trainers run in one test process: "GPU" i is a CPU device, and the nodes' NCCL world is one
// in-process world (comm.World) over every node's devices, made once all size ranks joined.
// It checks that every node joins with node 0's unique id, the world's size and its ranks.
type fakeNCCL struct {
	size  int
	id    nccl.UniqueID // what node 0's newID makes
	ready chan struct{} // closed once every rank joined

	mu     sync.Mutex
	devs   []backend.Backend
	joined int
	w      *comm.World
	err    error
	splits map[string]*fakeSplit
	ids    []nccl.UniqueID // the id each join was given
}

type fakeSplit struct {
	once sync.Once
	cs   []*comm.Comm
	err  error
}

func newFakeNCCL(size int) *fakeNCCL {
	f := &fakeNCCL{size: size, ready: make(chan struct{}), devs: make([]backend.Backend, size), splits: map[string]*fakeSplit{}}
	for i := range f.id.Internal {
		f.id.Internal[i] = byte(3*i + 1)
	}
	return f
}

// ops returns a node's gpuNodeOps: CPU devices for GPUs, readyErr from ready, openErr from
// open, and the shared world.
func (f *fakeNCCL) ops(readyErr, openErr error) gpuNodeOps {
	return gpuNodeOps{
		open: func(id int, recs []*profile.Recorder, r int) (backend.Backend, error) {
			if openErr != nil {
				return nil, openErr
			}
			return openRank("cpu", id, recs, r)
		},
		ready: func() error { return readyErr },
		newID: func() (nccl.UniqueID, error) { return f.id, nil },
		world: f.join,
	}
}

func (f *fakeNCCL) join(local mesh.Devices, devs []backend.Backend, id nccl.UniqueID, size, first int) (comm.Fabric, error) {
	if size != f.size || first < 0 || first+len(devs) > size || local.Len() != len(devs) {
		return nil, fmt.Errorf("fake NCCL: %s joins as ranks %d..%d of %d, the world has %d", local, first, first+len(devs)-1, size, f.size)
	}
	f.mu.Lock()
	f.ids = append(f.ids, id)
	for i, b := range devs {
		f.devs[first+i] = b
	}
	f.joined += len(devs)
	if f.joined == f.size {
		f.w, f.err = comm.NewWorld(f.devs)
		close(f.ready)
	}
	f.mu.Unlock()
	select {
	case <-f.ready:
	case <-time.After(30 * time.Second):
		return nil, errors.New("fake NCCL: the other ranks did not join")
	}
	if f.err != nil {
		return nil, f.err
	}
	return &fakeFabric{f: f, first: first, n: len(devs)}, nil
}

// fakeFabric is one node's view of the shared world: its ranks, global Split.
type fakeFabric struct {
	f        *fakeNCCL
	first, n int
	calls    int // Splits so far: every node splits in the same order
}

func (ff *fakeFabric) Size() int                    { return ff.n }
func (ff *fakeFabric) Comm(i int) comm.Communicator { return ff.f.w.Comm(ff.first + i) }
func (ff *fakeFabric) Abort(err error)              { ff.f.w.Abort(err) }
func (ff *fakeFabric) Close() error                 { return nil }

func (ff *fakeFabric) Split(name string, groups [][]int) ([]comm.Communicator, error) {
	key := fmt.Sprintf("%d %s", ff.calls, name)
	ff.calls++
	ff.f.mu.Lock()
	s := ff.f.splits[key]
	if s == nil {
		s = &fakeSplit{}
		ff.f.splits[key] = s
	}
	ff.f.mu.Unlock()
	s.once.Do(func() { s.cs, s.err = ff.f.w.Split(name, groups) })
	if s.err != nil {
		return nil, s.err
	}
	out := make([]comm.Communicator, ff.n)
	for i := range out {
		out[i] = s.cs[ff.first+i]
	}
	return out, nil
}

// Two nodes of one GPU each (node 0 on cuda:0, node 1 on cuda:1: the lists may differ) join
// one world from node 0's NCCL id carried by the rendezvous, as ranks 0 and 1, and train as
// one process on two devices: the same losses and gradient norms on every node, node 0's
// checkpoint (a collective) holding the same weights, and a run resumed from it across the
// nodes continuing as the uninterrupted one. The GPUs and NCCL are stood in for by
// CPU devices and an in-process world, so this checks the wiring, not NCCL.
func TestNodesOnGPUsJoinOneWorldFromTheRendezvous(t *testing.T) {
	path := writeJSONL(t, t.TempDir(), "d.jsonl", pcRecords(24))
	dir := t.TempDir()
	for _, layout := range [][]string{{"--fsdp=true"}, {}} {
		t.Run(strings.Join(append([]string{"dp=2"}, layout...), " "), func(t *testing.T) {
			const steps, saveAt = 3, 2
			refCkpt, ckpt := filepath.Join(dir, "ref"+fmt.Sprint(len(layout))), filepath.Join(dir, "nodes"+fmt.Sprint(len(layout)))
			want := stepOne(t, tinyParallelConfig(t, path, append([]string{"--devices=cpu:2"}, layout...)...), steps, saveAt, refCkpt)
			f := newFakeNCCL(2)
			runs := trainAcrossWith(t, 2, steps, func(node int) *Config {
				return tinyParallelConfig(t, path, append([]string{fmt.Sprintf("--devices=cuda:%d", node), "--device=auto"}, layout...)...)
			}, func(int) gpuNodeOps { return f.ops(nil, nil) }, saveAt, ckpt)
			for node, r := range runs {
				if r.err == nil && (r.rank != node || r.n != 2) {
					t.Errorf("node %d: Node() = %d, %d", node, r.rank, r.n)
				}
				if l := r.layout; r.err == nil && (l.Devices != "cuda:0-1" || l.NodeDevices != fmt.Sprintf("cuda:%d", node)) {
					t.Errorf("node %d: Layout() = %+v, want the world's cuda:0-1 and the node's own cuda:%d", node, l, node)
				}
				sameRun(t, fmt.Sprintf("node %d", node), r, want, 0)
			}
			if len(f.ids) != 2 || f.ids[0] != f.id || f.ids[1] != f.id {
				t.Errorf("the nodes joined with ids %v, want node 0's on both", f.ids)
			}
			if s := sameBits(checkpointParams(t, path, ckpt), checkpointParams(t, path, refCkpt)); s != "" {
				t.Errorf("node 0's checkpoint: %s", s)
			}
			// Resumed from node 0's checkpoint across the GPU nodes, the run continues as it would have.
			f = newFakeNCCL(2)
			resumed := trainAcrossWith(t, 2, steps-saveAt, func(node int) *Config {
				return tinyParallelConfig(t, path, append([]string{fmt.Sprintf("--devices=cuda:%d", node), "--device=auto", "--resume_from_checkpoint=" + ckpt}, layout...)...)
			}, func(int) gpuNodeOps { return f.ops(nil, nil) }, 0, "")
			for node, r := range resumed {
				sameRun(t, fmt.Sprintf("resumed: node %d", node), r, want, saveAt)
			}
		})
	}
}

// A node that cannot open its GPUs or load NCCL, or has another number of GPUs than node 0,
// stops every node quickly (the rendezvous tells them), each error naming the node at fault
// and the node's own error saying what it lacks. Nodes whose configs disagree on what they
// must share stop once in the world, before the plan, each naming the parts that differ.
func TestNodesOnGPUsRefuseANodeThatCannotTakePart(t *testing.T) {
	path := writeJSONL(t, t.TempDir(), "d.jsonl", pcRecords(8))
	other := writeJSONL(t, t.TempDir(), "other.jsonl", pcRecords(12))
	// A checkpoint of one process at step 1, in the layout of the nodes.
	ckpt := filepath.Join(t.TempDir(), "ck")
	stepOne(t, tinyParallelConfig(t, path, "--devices=cpu:2", "--gradient_accumulation_steps=4"), 1, 1, ckpt)
	noNCCL := errors.New("nccl: libnccl.so.2 not found (searched LD_LIBRARY_PATH)")
	noGPU := errors.New("cuda: device 0 is out of range")
	for _, tc := range []struct {
		name    string
		devices [2]string
		ready   [2]error
		open    [2]error
		want    [2][]string
		extra   [2][]string // config overrides of each node
		joined  int         // ranks that reach the NCCL world
	}{
		{"node 1 lacks NCCL", [2]string{"cuda:0", "cuda:0"}, [2]error{nil, noNCCL}, [2]error{},
			[2][]string{{"node 1 (", "cannot train on its GPUs", "its own error says which"}, {"node 1 of 2 cannot train on its GPUs (cuda:0): NCCL: nccl: libnccl.so.2 not found", "the other nodes were told"}}, [2][]string{}, 0},
		{"node 0 lacks NCCL", [2]string{"cuda:0", "cuda:0"}, [2]error{noNCCL, nil}, [2]error{},
			[2][]string{{"node 0 of 2 cannot train on its GPUs (cuda:0): NCCL: nccl: libnccl.so.2 not found"}, {"node 0 (", "cannot train on its GPUs"}}, [2][]string{}, 0},
		{"node 1 cannot open its GPU", [2]string{"cuda:0", "cuda:5"}, [2]error{}, [2]error{nil, noGPU},
			[2][]string{{"node 1 (", "cannot train on its GPUs"}, {"node 1 of 2 cannot train on its GPUs (cuda:5): opening cuda:5: cuda: device 0 is out of range"}}, [2][]string{}, 0},
		{"node 1 has two GPUs, node 0 one", [2]string{"cuda:0", "cuda:0-1"}, [2]error{}, [2]error{},
			[2][]string{{"the nodes have different GPU counts", "node 1 (", "has 2 GPUs and node 0 (", "has 1", "(this node has 1)"}, {"has 2 GPUs and node 0", "(this node has 2)"}}, [2][]string{}, 0},
		{"node 1 has another seed and learning rate", [2]string{"cuda:0", "cuda:1"}, [2]error{}, [2]error{},
			[2][]string{{"the nodes' configs disagree: node 1 differs from node 0 in optimizer, seed; run every node with the same config"}, {"node 1 differs from node 0 in optimizer, seed;"}},
			[2][]string{nil, {"--seed=8", "--learning_rate=1e-3"}}, 2},
		{"node 1 shards with FSDP, node 0 does not", [2]string{"cuda:0", "cuda:1"}, [2]error{}, [2]error{},
			[2][]string{{"node 1 differs from node 0 in devices per node and layout;"}, {"node 1 differs from node 0 in devices per node and layout;"}},
			[2][]string{nil, {"--fsdp=true"}}, 2},
		{"node 1 resumes, node 0 starts afresh", [2]string{"cuda:0", "cuda:1"}, [2]error{}, [2]error{},
			[2][]string{{"node 1 differs from node 0 in resume step"}, {"node 1 differs from node 0 in resume step"}},
			[2][]string{nil, {"--resume_from_checkpoint=" + ckpt}}, 2},
		{"node 1 trains on other data", [2]string{"cuda:0", "cuda:1"}, [2]error{}, [2]error{},
			[2][]string{{"node 1 differs from node 0 in training data;"}, {"node 1 differs from node 0 in training data;"}},
			[2][]string{nil, {"--dataset.path=" + other}}, 2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newFakeNCCL(2)
			start := time.Now()
			runs := trainAcrossWith(t, 2, 1, func(node int) *Config {
				return tinyParallelConfig(t, path, append([]string{"--devices=" + tc.devices[node], "--device=auto", "--gradient_accumulation_steps=4"}, tc.extra[node]...)...)
			}, func(node int) gpuNodeOps { return f.ops(tc.ready[node], tc.open[node]) }, 0, "")
			for node, r := range runs {
				if r.err == nil {
					t.Errorf("node %d trained", node)
					continue
				}
				for _, w := range tc.want[node] {
					if !strings.Contains(r.err.Error(), w) {
						t.Errorf("node %d: %v\nwant it to contain %q", node, r.err, w)
					}
				}
			}
			if f.joined != tc.joined {
				t.Errorf("%d ranks joined the NCCL world, want %d", f.joined, tc.joined)
			}
			if el := time.Since(start); el > 15*time.Second {
				t.Errorf("the nodes took %s to stop: one waited for the rendezvous to time out", el)
			}
		})
	}
}

// gpuWorldID accepts a world whose nodes all report node 0's GPU count and whose payload is
// an NCCL unique id, and names what is wrong otherwise.
func TestNCCLIDComesFromACheckedRendezvousWorld(t *testing.T) {
	id := make([]byte, nccl.UniqueIDBytes)
	for i := range id {
		id[i] = byte(i)
	}
	nodes := func(devs ...int) []rendezvous.Node {
		ns := make([]rendezvous.Node, len(devs))
		for i, d := range devs {
			ns[i] = rendezvous.Node{Rank: i, Devices: d, Host: fmt.Sprintf("gpu%02d", i)}
		}
		return ns
	}
	for _, tc := range []struct {
		name    string
		w       rendezvous.World
		self, k int
		want    string // "" = accepted
	}{
		{"two nodes of two GPUs", rendezvous.World{Nodes: nodes(2, 2), Payload: id}, 1, 2, ""},
		{"one node", rendezvous.World{Nodes: nodes(8), Payload: id}, 0, 8, ""},
		{"no payload", rendezvous.World{Nodes: nodes(1, 1)}, 1, 1, "node 0 sent 0 bytes as the NCCL unique id, want 128"},
		{"short payload", rendezvous.World{Nodes: nodes(1, 1), Payload: id[:100]}, 0, 1, "node 0 sent 100 bytes as the NCCL unique id, want 128"},
		{"long payload", rendezvous.World{Nodes: nodes(1, 1), Payload: append(id, 0)}, 0, 1, "sent 129 bytes"},
		{"a node that cannot take part", rendezvous.World{Nodes: nodes(2, 2, 0), Payload: id}, 0, 2, "node 2 (gpu02) cannot train on its GPUs"},
		{"two nodes that cannot", rendezvous.World{Nodes: nodes(0, 2, 0), Payload: id}, 1, 2, "node 0 (gpu00) cannot train on its GPUs (it could not open them or load NCCL; its own error says which)\nnode 2 (gpu02)"},
		{"GPU counts differ", rendezvous.World{Nodes: nodes(2, 4, 2, 1), Payload: id}, 0, 2, "node 1 (gpu01) has 4 GPUs and node 0 (gpu00) has 2\nnode 3 (gpu03) has 1 GPUs and node 0 (gpu00) has 2"},
		{"this node is not listed as it is", rendezvous.World{Nodes: nodes(2, 2), Payload: id}, 1, 3, "does not list this node (1) with its 3 GPUs"},
		{"no nodes", rendezvous.World{Payload: id}, 0, 1, "no nodes"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := gpuWorldID(tc.w, tc.self, tc.k)
			if tc.want == "" {
				if err != nil || string(got.Internal[:]) != string(id) {
					t.Fatalf("got %v, %v; want the payload as the id", got.Internal[:4], err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("got %v, want an error containing %q", err, tc.want)
			}
		})
	}
}

// gpuWorldID reads a world that came over the network: whatever the payload and the device
// counts, it returns an error or an id, never panics, and accepts only a world whose every node
// reports node 0's nonzero GPU count (this node's among them) with a 128-byte payload, which it
// returns as the id.
func FuzzGPUWorldID(f *testing.F) {
	f.Add(make([]byte, nccl.UniqueIDBytes), []byte{2, 2}, 1)
	f.Add([]byte{}, []byte{1, 1}, 0)
	f.Add(make([]byte, 5), []byte{1, 0, 3}, 2)
	f.Add(make([]byte, nccl.UniqueIDBytes+1), []byte{}, 0)
	f.Fuzz(func(t *testing.T, payload, devs []byte, self int) {
		if len(devs) > 64 {
			devs = devs[:64]
		}
		w := rendezvous.World{Payload: payload}
		for i, d := range devs {
			w.Nodes = append(w.Nodes, rendezvous.Node{Rank: i, Devices: int(d)})
		}
		k := 1
		if self >= 0 && self < len(devs) {
			k = int(devs[self])
		}
		id, err := gpuWorldID(w, self, k)
		if err != nil {
			return
		}
		if len(payload) != nccl.UniqueIDBytes || string(id.Internal[:]) != string(payload) {
			t.Fatalf("accepted a payload of %d bytes as id %x", len(payload), id.Internal[:8])
		}
		for _, n := range w.Nodes {
			if n.Devices == 0 || n.Devices != int(devs[0]) {
				t.Fatalf("accepted node %d with %d GPUs (node 0 has %d)", n.Rank, n.Devices, devs[0])
			}
		}
		if self < 0 || self >= len(devs) {
			t.Fatalf("accepted self %d outside the %d nodes", self, len(devs))
		}
	})
}

// TestNCCLWorldThatDoesNotFormStopsTheNode checks the bound on NCCL's setup after the
// rendezvous: a world that never forms (a node stopped after the rendezvous) is an error naming
// what to check once the wait is over, a cancelled run stops at once, and a world that forms is
// returned as it is.
func TestNCCLWorldThatDoesNotFormStopsTheNode(t *testing.T) {
	local, err := mesh.ParseDevices("cuda:0-1")
	if err != nil {
		t.Fatal(err)
	}
	never := make(chan struct{})
	defer close(never)
	blocking := gpuNodeOps{world: func(mesh.Devices, []backend.Backend, nccl.UniqueID, int, int) (comm.Fabric, error) {
		<-never
		return nil, errors.New("unreachable")
	}}
	devs := make([]backend.Backend, 2)
	start := time.Now()
	_, err = joinWorldWithin(context.Background(), 50*time.Millisecond, blocking, local, devs, nccl.UniqueID{}, 4, 2)
	if !errors.Is(err, errWorldNotFormed) || !strings.Contains(err.Error(), "within 50ms of the rendezvous (ranks 2..3 of 4 on cuda:0-1)") ||
		!strings.Contains(err.Error(), "NCCL_SOCKET_IFNAME") {
		t.Fatalf("got %v, want the world named as not formed with what to check", err)
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Fatalf("took %v to give up after a 50ms wait", d)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := joinWorldWithin(ctx, time.Hour, blocking, local, devs, nccl.UniqueID{}, 4, 2); !errors.Is(err, errWorldNotFormed) || !strings.Contains(err.Error(), "canceled") {
		t.Fatalf("cancelled: got %v", err)
	}
	f := newFakeNCCL(2)
	cpu := f.ops(nil, nil)
	b0, err := cpu.open(0, make([]*profile.Recorder, 2), 0)
	if err != nil {
		t.Fatal(err)
	}
	b1, err := cpu.open(1, make([]*profile.Recorder, 2), 1)
	if err != nil {
		t.Fatal(err)
	}
	defer b0.Close()
	defer b1.Close()
	fab, err := joinWorldWithin(context.Background(), time.Minute, cpu, local, []backend.Backend{b0, b1}, f.id, 2, 0)
	if err != nil || fab == nil {
		t.Fatalf("a world that forms: %v, %v", fab, err)
	}
	_ = fab.Close()
}
