package comm

import (
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"testing"

	"github.com/halo-shell/halo-shell/engine/backend"
	"github.com/halo-shell/halo-shell/engine/backend/cpu"
	"github.com/halo-shell/halo-shell/engine/tensor"
)

// newWorld makes n ranks with one single-worker CPU backend each.
func newWorld(t *testing.T, n int) *World {
	t.Helper()
	bs := make([]backend.Backend, n)
	for i := range bs {
		b := cpu.New(cpu.Options{Workers: 1})
		t.Cleanup(func() { _ = b.Close() })
		bs[i] = b
	}
	w, err := NewWorld(bs)
	if err != nil {
		t.Fatal(err)
	}
	return w
}

// spmd runs fn on every communicator in cs, one goroutine each, and returns their errors.
func spmd(cs []*Comm, fn func(c *Comm) error) []error {
	errs := make([]error, len(cs))
	var wg sync.WaitGroup
	for i, c := range cs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[i] = fn(c)
		}()
	}
	wg.Wait()
	return errs
}

func worldComms(w *World) []*Comm {
	cs := make([]*Comm, w.Size())
	for i := range cs {
		cs[i] = w.Comm(i)
	}
	return cs
}

func must(t *testing.T, errs []error) {
	t.Helper()
	for r, err := range errs {
		if err != nil {
			t.Fatalf("rank %d: %v", r, err)
		}
	}
}

// data returns the deterministic input of a rank.
func data(rank, n int) []float32 {
	r := rand.New(rand.NewPCG(uint64(rank), 7))
	v := make([]float32, n)
	for i := range v {
		v[i] = float32(r.NormFloat64())
	}
	return v
}

// serialSum is the reference reduction: float64 sum in rank order, rounded once.
func serialSum(inputs [][]float32, lo, hi int, avg bool) []float32 {
	out := make([]float32, hi-lo)
	for i := lo; i < hi; i++ {
		s := 0.0
		for _, in := range inputs {
			s += float64(in[i])
		}
		if avg {
			s /= float64(len(inputs))
		}
		out[i-lo] = float32(s)
	}
	return out
}

func upload(t *testing.T, b backend.Backend, v []float32, dt tensor.DType, shape ...int) tensor.Tensor {
	x, err := backend.FromFloat32(b, v, dt, shape...)
	if err != nil {
		t.Fatal(err)
	}
	return x
}

func equal(got, want []float32) error {
	if len(got) != len(want) {
		return fmt.Errorf("%d values, want %d", len(got), len(want))
	}
	for i := range got {
		if got[i] != want[i] {
			return fmt.Errorf("element %d = %v, want %v", i, got[i], want[i])
		}
	}
	return nil
}

func roundTo(dt tensor.DType, v []float32) []float32 {
	raw, _ := tensor.EncodeFloat32(dt, v)
	out, _ := tensor.DecodeFloat32(dt, raw)
	return out
}

var sizes = []int{1, 2, 4, 8}

func TestAllReduceMatchesSerialSum(t *testing.T) {
	for _, n := range sizes {
		for _, dt := range []tensor.DType{tensor.F32, tensor.BF16} {
			for _, op := range []ReduceOp{Sum, Avg} {
				t.Run(fmt.Sprintf("n%d_%s_%s", n, dt, op), func(t *testing.T) {
					const numel = 37
					w := newWorld(t, n)
					inputs := make([][]float32, n)
					for r := range inputs {
						inputs[r] = roundTo(dt, data(r, numel))
					}
					want := roundTo(dt, serialSum(inputs, 0, numel, op == Avg))
					must(t, spmd(worldComms(w), func(c *Comm) error {
						x := upload(t, c.Backend(), inputs[c.Rank()], dt, numel)
						if err := c.AllReduce(x, op); err != nil {
							return err
						}
						got, err := backend.ToFloat32(c.Backend(), x)
						if err != nil {
							return err
						}
						return equal(got, want)
					}))
				})
			}
		}
	}
}

func TestAllGatherConcatenatesInRankOrder(t *testing.T) {
	for _, n := range sizes {
		t.Run(fmt.Sprint(n), func(t *testing.T) {
			const numel = 6
			w := newWorld(t, n)
			var want []float32
			for r := 0; r < n; r++ {
				want = append(want, data(r, numel)...)
			}
			must(t, spmd(worldComms(w), func(c *Comm) error {
				src := upload(t, c.Backend(), data(c.Rank(), numel), tensor.F32, 2, 3)
				dst, _ := c.Backend().Alloc(tensor.F32, 2*n, 3)
				if err := c.AllGather(dst, src); err != nil {
					return err
				}
				got, _ := backend.ToFloat32(c.Backend(), dst)
				return equal(got, want)
			}))
		})
	}
}

func TestAllGatherInt32(t *testing.T) {
	w := newWorld(t, 4)
	must(t, spmd(worldComms(w), func(c *Comm) error {
		src, _ := backend.FromInt32(c.Backend(), []int32{int32(c.Rank()), int32(10 * c.Rank())}, 2)
		dst, _ := c.Backend().Alloc(tensor.I32, 8)
		if err := c.AllGather(dst, src); err != nil {
			return err
		}
		got, _ := backend.ToInt32(c.Backend(), dst)
		want := []int32{0, 0, 1, 10, 2, 20, 3, 30}
		if fmt.Sprint(got) != fmt.Sprint(want) {
			return fmt.Errorf("got %v, want %v", got, want)
		}
		return nil
	}))
}

func TestReduceScatterGivesEachRankItsPart(t *testing.T) {
	for _, n := range sizes {
		for _, op := range []ReduceOp{Sum, Avg} {
			t.Run(fmt.Sprintf("n%d_%s", n, op), func(t *testing.T) {
				const part = 5
				w := newWorld(t, n)
				inputs := make([][]float32, n)
				for r := range inputs {
					inputs[r] = data(r, part*n)
				}
				must(t, spmd(worldComms(w), func(c *Comm) error {
					src := upload(t, c.Backend(), inputs[c.Rank()], tensor.F32, n*part)
					dst, _ := c.Backend().Alloc(tensor.F32, part)
					if err := c.ReduceScatter(dst, src, op); err != nil {
						return err
					}
					got, _ := backend.ToFloat32(c.Backend(), dst)
					return equal(got, serialSum(inputs, c.Rank()*part, (c.Rank()+1)*part, op == Avg))
				}))
			})
		}
	}
}

// sendCount is an uneven, sometimes zero, number of rows rank i sends to rank j.
func sendCount(i, j int) int { return (i*3 + j*5 + 1) % 4 }

func TestAllToAllUnevenSplits(t *testing.T) {
	for _, n := range sizes {
		t.Run(fmt.Sprint(n), func(t *testing.T) {
			const width = 3
			w := newWorld(t, n)
			// Row k that rank i sends to rank j holds the values (i, j, k).
			row := func(i, j, k int) []float32 { return []float32{float32(i), float32(j), float32(k)} }
			must(t, spmd(worldComms(w), func(c *Comm) error {
				me := c.Rank()
				send, recv := make([]int, n), make([]int, n)
				var src, want []float32
				for j := 0; j < n; j++ {
					send[j] = sendCount(me, j)
					recv[j] = sendCount(j, me)
					for k := 0; k < send[j]; k++ {
						src = append(src, row(me, j, k)...)
					}
					for k := 0; k < recv[j]; k++ {
						want = append(want, row(j, me, k)...)
					}
				}
				st := allocRows(c.Backend(), src, width)
				dt := allocRows(c.Backend(), want, width)
				if err := c.AllToAll(dt, st, send, recv, Dispatch); err != nil {
					return err
				}
				got, _ := backend.ToFloat32(c.Backend(), dt)
				if len(want) == 0 {
					return nil
				}
				return equal(got, want)
			}))
		})
	}
}

// allocRows uploads v as [len(v)/width, width] (a [1, width] zero row when v is empty, used
// with zero counts: AllToAll with no rows must then leave it alone).
func allocRows(b backend.Backend, v []float32, width int) tensor.Tensor {
	if len(v) == 0 {
		t, _ := b.Alloc(tensor.F32, 0+1, width)
		r, _ := t.Rows(0, 0)
		return r
	}
	t, _ := backend.FromFloat32(b, v, tensor.F32, len(v)/width, width)
	return t
}

func TestAllToAllRejectsCountMismatch(t *testing.T) {
	w := newWorld(t, 2)
	errs := spmd(worldComms(w), func(c *Comm) error {
		src, _ := c.Backend().Alloc(tensor.F32, 2, 4)
		dst, _ := c.Backend().Alloc(tensor.F32, 2, 4)
		recv := []int{1, 1}
		if c.Rank() == 1 {
			recv = []int{2, 0} // rank 0 sends 1 row to rank 1, not 0
		}
		return c.AllToAll(dst, src, []int{1, 1}, recv, Combine)
	})
	if errs[1] == nil || !strings.Contains(errs[1].Error(), "sends 1 rows to this rank, which expects 2") {
		t.Fatalf("rank 1: want a count mismatch error, got %v", errs[1])
	}
}

func TestBroadcastFromEveryRoot(t *testing.T) {
	for _, n := range sizes {
		for root := 0; root < n; root++ {
			t.Run(fmt.Sprintf("n%d_root%d", n, root), func(t *testing.T) {
				w := newWorld(t, n)
				want := data(root, 9)
				must(t, spmd(worldComms(w), func(c *Comm) error {
					x := upload(t, c.Backend(), data(c.Rank(), 9), tensor.F32, 9)
					if err := c.Broadcast(x, root); err != nil {
						return err
					}
					got, _ := backend.ToFloat32(c.Backend(), x)
					return equal(got, want)
				}))
			})
		}
	}
}

func TestSendRecvRing(t *testing.T) {
	for _, n := range sizes[1:] {
		t.Run(fmt.Sprint(n), func(t *testing.T) {
			w := newWorld(t, n)
			must(t, spmd(worldComms(w), func(c *Comm) error {
				me := c.Rank()
				next, prev := (me+1)%n, (me+n-1)%n
				x := upload(t, c.Backend(), data(me, 4), tensor.F32, 4)
				if err := c.Send(x, next); err != nil {
					return err
				}
				y, _ := c.Backend().Alloc(tensor.F32, 4)
				if err := c.Recv(y, prev); err != nil {
					return err
				}
				got, _ := backend.ToFloat32(c.Backend(), y)
				return equal(got, data(prev, 4))
			}))
		})
	}
}

func TestSplitGroupsReduceIndependently(t *testing.T) {
	// 8 ranks as a 2x4 grid: rows {0..3},{4..7} and columns {0,4},{1,5},...
	w := newWorld(t, 8)
	rows, err := w.Split("row", [][]int{{0, 1, 2, 3}, {4, 5, 6, 7}})
	if err != nil {
		t.Fatal(err)
	}
	cols, err := w.Split("col", [][]int{{0, 4}, {1, 5}, {2, 6}, {3, 7}})
	if err != nil {
		t.Fatal(err)
	}
	must(t, spmd(worldComms(w), func(c *Comm) error {
		r := c.Rank()
		rc, cc := rows[r], cols[r]
		if rc.Rank() != r%4 || cc.Rank() != r/4 || rc.Size() != 4 || cc.Size() != 2 {
			return fmt.Errorf("world rank %d: row rank %d/%d col rank %d/%d", r, rc.Rank(), rc.Size(), cc.Rank(), cc.Size())
		}
		x := upload(t, c.Backend(), []float32{float32(r)}, tensor.F32, 1)
		if err := rc.AllReduce(x, Sum); err != nil {
			return err
		}
		if err := cc.AllReduce(x, Sum); err != nil {
			return err
		}
		got, _ := backend.ToFloat32(c.Backend(), x)
		// sum over rows then columns = sum of all ranks = 28
		if got[0] != 28 {
			return fmt.Errorf("world rank %d: got %v, want 28", r, got[0])
		}
		if g := rc.Group(); g != fmt.Sprintf("row%d", r/4) {
			return fmt.Errorf("world rank %d: row group %q", r, g)
		}
		return nil
	}))
}

func TestSplitRejectsBadPartitions(t *testing.T) {
	w := newWorld(t, 4)
	for _, tc := range []struct {
		groups [][]int
		want   string
	}{
		{[][]int{{0, 1}, {1, 2, 3}}, "rank 1 is in more than one group"},
		{[][]int{{0, 1}, {2}}, "rank 3 is in no group"},
		{[][]int{{0, 1, 2, 3, 4}}, "names rank 4"},
		{[][]int{{0, 1, 2, 3}, {}}, "group 1 is empty"},
	} {
		_, err := w.Split("g", tc.groups)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("Split(%v): got %v, want an error containing %q", tc.groups, err, tc.want)
		}
	}
}

func TestMismatchedCollectivesAreErrors(t *testing.T) {
	w := newWorld(t, 2)
	errs := spmd(worldComms(w), func(c *Comm) error {
		x, _ := c.Backend().Alloc(tensor.F32, 4)
		if c.Rank() == 0 {
			return c.AllReduce(x, Sum)
		}
		return c.Broadcast(x, 0)
	})
	for r, err := range errs {
		if err == nil || !strings.Contains(err.Error(), "every rank must run the same collectives") {
			t.Errorf("rank %d: got %v", r, err)
		}
	}
	errs = spmd(worldComms(w), func(c *Comm) error {
		x, _ := c.Backend().Alloc(tensor.F32, 4+c.Rank())
		return c.AllReduce(x, Sum)
	})
	for r, err := range errs {
		if err == nil || !strings.Contains(err.Error(), "same shape") {
			t.Errorf("rank %d: got %v", r, err)
		}
	}
}

func TestArgumentErrors(t *testing.T) {
	w := newWorld(t, 1)
	c := w.Comm(0)
	b := c.Backend()
	i32, _ := b.Alloc(tensor.I32, 4)
	f4, _ := b.Alloc(tensor.F32, 4)
	f3, _ := b.Alloc(tensor.F32, 3)
	for _, tc := range []struct {
		name string
		err  error
		want string
	}{
		{"allreduce int", c.AllReduce(i32, Sum), "reductions need f32"},
		{"allgather size", c.AllGather(f3, f4), "must hold 1 x 4"},
		{"reducescatter size", c.ReduceScatter(f3, f4, Sum), "must hold 1 x 3"},
		{"alltoall counts", c.AllToAll(f4, f4, []int{1, 2}, []int{4}, Dispatch), "2 send and 1 recv counts"},
		{"alltoall sum", c.AllToAll(f4, f4, []int{3}, []int{4}, Dispatch), "add up to 3 rows"},
		{"broadcast root", c.Broadcast(f4, 1), "root 1 is outside"},
		{"send self", c.Send(f4, 0), "must be another rank"},
	} {
		if tc.err == nil || !strings.Contains(tc.err.Error(), tc.want) {
			t.Errorf("%s: got %v, want an error containing %q", tc.name, tc.err, tc.want)
		}
	}
}

type spanLog struct {
	mu    sync.Mutex
	kinds []string
	bytes []int64
	group []string
}

func (s *spanLog) Collective(kind, group string, bytes int64, fn func() error) error {
	err := fn()
	s.mu.Lock()
	s.kinds, s.bytes, s.group = append(s.kinds, kind), append(s.bytes, bytes), append(s.group, group)
	s.mu.Unlock()
	return err
}

func TestCollectivesAreRecorded(t *testing.T) {
	w := newWorld(t, 2)
	logs := []*spanLog{{}, {}}
	must(t, spmd(worldComms(w), func(c *Comm) error {
		c.SetRecorder(logs[c.Rank()])
		x, _ := c.Backend().Alloc(tensor.F32, 8)
		y, _ := c.Backend().Alloc(tensor.F32, 16)
		z, _ := c.Backend().Alloc(tensor.F32, 4)
		if err := c.AllReduce(x, Sum); err != nil {
			return err
		}
		if err := c.AllGather(y, x); err != nil {
			return err
		}
		if err := c.ReduceScatter(x, y, Sum); err != nil {
			return err
		}
		if err := c.AllToAll(x, x, []int{4, 4}, []int{4, 4}, Combine); err != nil {
			return err
		}
		return c.Broadcast(z, 1)
	}))
	wantKinds := []string{KindAllReduce, KindAllGather, KindReduceScatter, KindAllToAllCombine, KindBroadcast}
	wantBytes := []int64{32, 32, 64, 32, 16}
	for r, l := range logs {
		if fmt.Sprint(l.kinds) != fmt.Sprint(wantKinds) || fmt.Sprint(l.bytes) != fmt.Sprint(wantBytes) {
			t.Errorf("rank %d: recorded %v %v, want %v %v", r, l.kinds, l.bytes, wantKinds, wantBytes)
		}
		for _, g := range l.group {
			if g != "world" {
				t.Errorf("rank %d: group %q, want world", r, g)
			}
		}
		s := w.Comm(r).Stats()
		if s[KindAllReduce].Calls != 1 || s[KindAllReduce].Bytes != 32 || s.Total().Calls != 5 {
			t.Errorf("rank %d: stats %+v", r, s)
		}
	}
}

func TestRepeatedCollectivesAreBitReproducible(t *testing.T) {
	// Many back-to-back reductions reuse the rendezvous; results must not depend on timing.
	run := func() [][]float32 {
		w := newWorld(t, 4)
		out := make([][]float32, 4)
		must(t, spmd(worldComms(w), func(c *Comm) error {
			x := upload(t, c.Backend(), data(c.Rank(), 64), tensor.F32, 64)
			for i := 0; i < 50; i++ {
				if err := c.AllReduce(x, Avg); err != nil {
					return err
				}
				if err := c.Backend().Scale(x, 1.0001+float32(c.Rank())*1e-4); err != nil {
					return err
				}
			}
			out[c.Rank()], _ = backend.ToFloat32(c.Backend(), x)
			return nil
		}))
		return out
	}
	a, b := run(), run()
	for r := range a {
		if err := equal(a[r], b[r]); err != nil {
			t.Fatalf("rank %d differs between runs: %v", r, err)
		}
	}
}

func TestAbortReleasesWaitingRanks(t *testing.T) {
	w := newWorld(t, 3)
	sub, err := w.Split("pair", [][]int{{0, 1}, {2}})
	if err != nil {
		t.Fatal(err)
	}
	errs := spmd(worldComms(w), func(c *Comm) error {
		x, _ := c.Backend().Alloc(tensor.F32, 4)
		switch c.Rank() {
		case 0:
			return c.AllReduce(x, Sum) // waits for ranks 1 and 2
		case 1:
			return sub[1].Recv(x, 0) // waits for a message rank 0 never sends
		default:
			w.Abort(fmt.Errorf("rank 2 failed"))
			return nil
		}
	})
	for r, err := range errs[:2] {
		if err == nil || !strings.Contains(err.Error(), "aborted") || !strings.Contains(err.Error(), "rank 2 failed") {
			t.Errorf("rank %d: got %v, want the abort error", r, err)
		}
	}
	if err := w.Comm(0).Barrier(); err == nil {
		t.Error("a collective after Abort succeeded")
	}
}

func TestNewWorldRejectsSharedOrMissingBackends(t *testing.T) {
	b := cpu.New(cpu.Options{Workers: 1})
	defer b.Close()
	if _, err := NewWorld([]backend.Backend{b, b}); err == nil || !strings.Contains(err.Error(), "ranks 0 and 1 share one backend") {
		t.Errorf("shared backend: got %v", err)
	}
	if _, err := NewWorld([]backend.Backend{b, nil}); err == nil || !strings.Contains(err.Error(), "rank 1 is nil") {
		t.Errorf("nil backend: got %v", err)
	}
	if _, err := NewWorld(nil); err == nil {
		t.Error("empty world accepted")
	}
}
