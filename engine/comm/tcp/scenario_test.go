package tcp

import (
	"bytes"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"sort"
	"strings"
	"sync"

	"github.com/halo-shell/halo-shell/engine/backend"
	"github.com/halo-shell/halo-shell/engine/backend/cpu"
	"github.com/halo-shell/halo-shell/engine/comm"
	"github.com/halo-shell/halo-shell/engine/tensor"
)

// A scenario case runs one collective on one rank: it makes its inputs from the rank's global
// rank and the case's seed, runs the collective and returns the bytes of every output. The same
// case runs on the in-process communicator (every rank of the world in this process) and on the
// tcp one (this process's ranks), and the bytes must be equal.
type scase struct {
	name string
	run  func(c comm.Communicator, global int) ([]byte, error)
	// mismatch marks a case whose ranks disagree on purpose: it must fail on the same ranks
	// on both communicators and leave the world usable.
	mismatch bool
}

// fill makes a tensor of numel elements (shape given) of dtype dt with values drawn from seed.
func fill(b backend.Backend, dt tensor.DType, seed uint64, shape ...int) (tensor.Tensor, error) {
	x, err := b.Alloc(dt, shape...)
	if err != nil {
		return x, err
	}
	r := rand.New(rand.NewPCG(seed, 99))
	if dt.IsFloat() {
		// Magnitudes spread over many binades, so that float64 sums of three or more values
		// are inexact and a different summation order gives different bits.
		spread := 30
		if dt == tensor.F16 {
			spread = 6
		}
		v := make([]float32, x.Numel())
		for i := range v {
			v[i] = float32(math.Ldexp(r.NormFloat64(), r.IntN(2*spread+1)-spread))
		}
		raw, err := tensor.EncodeFloat32(dt, v)
		if err != nil {
			return x, err
		}
		return x, b.Upload(x, raw)
	}
	raw := make([]byte, x.Bytes())
	for i := range raw {
		raw[i] = byte(r.Uint32())
	}
	return x, b.Upload(x, raw)
}

func read(b backend.Backend, ts ...tensor.Tensor) ([]byte, error) {
	var out []byte
	for _, t := range ts {
		buf := make([]byte, t.Bytes())
		if err := b.Download(buf, t); err != nil {
			return nil, err
		}
		out = append(out, buf...)
	}
	return out, nil
}

func seedOf(name string, global int) uint64 {
	var h uint64 = 1469598103934665603
	for _, c := range []byte(name) {
		h = (h ^ uint64(c)) * 1099511628211
	}
	return h ^ uint64(global)*0x9e3779b97f4a7c15
}

// a2aCount is how many rows rank from sends to rank to in an all-to-all case (0..3, uneven).
func a2aCount(name string, from, to int) int {
	return int(seedOf(name, from*131+to) % 4)
}

// cases lists every collective with several dtypes and sizes, including empty tensors and
// uneven all-to-all, and a few deliberate mismatches.
func cases() []scase {
	var cs []scase
	for _, dt := range []tensor.DType{tensor.F32, tensor.BF16, tensor.F16} {
		for _, op := range []comm.ReduceOp{comm.Sum, comm.Avg} {
			for _, numel := range []int{0, 1, 7, 1000} {
				name := fmt.Sprintf("all_reduce/%s/%s/%d", dt, op, numel)
				cs = append(cs, scase{name: name, run: func(c comm.Communicator, g int) ([]byte, error) {
					x, err := fill(c.Backend(), dt, seedOf(name, g), numel)
					if err != nil {
						return nil, err
					}
					if err := c.AllReduce(x, op); err != nil {
						return nil, err
					}
					return read(c.Backend(), x)
				}})
			}
		}
	}
	cs = append(cs, scase{name: "all_reduce/f32/sum/65537", run: func(c comm.Communicator, g int) ([]byte, error) {
		x, err := fill(c.Backend(), tensor.F32, seedOf("big", g), 65537)
		if err != nil {
			return nil, err
		}
		if err := c.AllReduce(x, comm.Sum); err != nil {
			return nil, err
		}
		return read(c.Backend(), x)
	}})
	for _, dt := range []tensor.DType{tensor.F32, tensor.BF16, tensor.I32, tensor.I64, tensor.U8} {
		for _, numel := range []int{0, 1, 13} {
			name := fmt.Sprintf("all_gather/%s/%d", dt, numel)
			cs = append(cs, scase{name: name, run: func(c comm.Communicator, g int) ([]byte, error) {
				src, err := fill(c.Backend(), dt, seedOf(name, g), numel)
				if err != nil {
					return nil, err
				}
				dst, err := c.Backend().Alloc(dt, numel*c.Size())
				if err != nil {
					return nil, err
				}
				if err := c.AllGather(dst, src); err != nil {
					return nil, err
				}
				return read(c.Backend(), dst)
			}})
		}
	}
	for _, dt := range []tensor.DType{tensor.F32, tensor.BF16, tensor.F16} {
		for _, op := range []comm.ReduceOp{comm.Sum, comm.Avg} {
			for _, per := range []int{0, 1, 5} {
				name := fmt.Sprintf("reduce_scatter/%s/%s/%d", dt, op, per)
				cs = append(cs, scase{name: name, run: func(c comm.Communicator, g int) ([]byte, error) {
					src, err := fill(c.Backend(), dt, seedOf(name, g), per*c.Size())
					if err != nil {
						return nil, err
					}
					dst, err := c.Backend().Alloc(dt, per)
					if err != nil {
						return nil, err
					}
					if err := c.ReduceScatter(dst, src, op); err != nil {
						return nil, err
					}
					return read(c.Backend(), dst)
				}})
			}
		}
	}
	for _, dt := range []tensor.DType{tensor.F32, tensor.BF16, tensor.I32} {
		for _, width := range []int{1, 3} {
			for _, phase := range []comm.Phase{comm.Dispatch, comm.Combine} {
				for _, empty := range []bool{false, true} {
					name := fmt.Sprintf("all_to_all/%s/w%d/phase%d/empty=%v", dt, width, phase, empty)
					cs = append(cs, scase{name: name, run: func(c comm.Communicator, g int) ([]byte, error) {
						return allToAll(c, g, name, dt, width, phase, empty, false)
					}})
				}
			}
		}
	}
	for _, dt := range []tensor.DType{tensor.F32, tensor.U8} {
		for _, numel := range []int{0, 5} {
			for root := range 4 {
				name := fmt.Sprintf("broadcast/%s/%d/root%d", dt, numel, root)
				cs = append(cs, scase{name: name, run: func(c comm.Communicator, g int) ([]byte, error) {
					x, err := fill(c.Backend(), dt, seedOf(name, g), numel)
					if err != nil {
						return nil, err
					}
					if err := c.Broadcast(x, root%c.Size()); err != nil {
						return nil, err
					}
					return read(c.Backend(), x)
				}})
			}
		}
	}
	cs = append(cs, scase{name: "send_recv/ring", run: func(c comm.Communicator, g int) ([]byte, error) {
		n, r := c.Size(), c.Rank()
		if n == 1 {
			return nil, nil
		}
		for k := range 3 {
			x, err := fill(c.Backend(), tensor.BF16, seedOf(fmt.Sprint("p2p", k), g), 4+k)
			if err != nil {
				return nil, err
			}
			if err := c.Send(x, (r+1)%n); err != nil {
				return nil, err
			}
		}
		var out []byte
		for k := range 3 {
			x, err := c.Backend().Alloc(tensor.BF16, 4+k)
			if err != nil {
				return nil, err
			}
			if err := c.Recv(x, (r+n-1)%n); err != nil {
				return nil, err
			}
			b, err := read(c.Backend(), x)
			if err != nil {
				return nil, err
			}
			out = append(out, b...)
		}
		return out, nil
	}})
	cs = append(cs, scase{name: "barrier", run: func(c comm.Communicator, g int) ([]byte, error) {
		return nil, c.Barrier()
	}})
	// Deliberate mismatches: every rank must fail, and the next cases must still pass.
	cs = append(cs, scase{name: "mismatch/all_reduce_sizes", mismatch: true, run: func(c comm.Communicator, g int) ([]byte, error) {
		x, err := fill(c.Backend(), tensor.F32, 1, 4+c.Rank())
		if err != nil {
			return nil, err
		}
		return nil, c.AllReduce(x, comm.Sum)
	}})
	cs = append(cs, scase{name: "mismatch/all_to_all_counts", mismatch: true, run: func(c comm.Communicator, g int) ([]byte, error) {
		return allToAll(c, g, "a2a-bad", tensor.F32, 2, comm.Dispatch, false, true)
	}})
	cs = append(cs, scase{name: "mismatch/all_gather_dtype", mismatch: true, run: func(c comm.Communicator, g int) ([]byte, error) {
		dt := tensor.F32
		if c.Rank() == 0 {
			dt = tensor.I32
		}
		src, err := fill(c.Backend(), dt, 1, 3)
		if err != nil {
			return nil, err
		}
		dst, err := c.Backend().Alloc(dt, 3*c.Size())
		if err != nil {
			return nil, err
		}
		return nil, c.AllGather(dst, src)
	}})
	cs = append(cs, scase{name: "after_mismatch/all_reduce", run: func(c comm.Communicator, g int) ([]byte, error) {
		x, err := fill(c.Backend(), tensor.F32, seedOf("after", g), 9)
		if err != nil {
			return nil, err
		}
		if err := c.AllReduce(x, comm.Avg); err != nil {
			return nil, err
		}
		return read(c.Backend(), x)
	}})
	return cs
}

// allToAll runs an uneven all-to-all whose counts come from a2aCount (all zero when empty;
// with bad, the last rank expects one row too many from rank 0).
func allToAll(c comm.Communicator, g int, name string, dt tensor.DType, width int, phase comm.Phase, empty, bad bool) ([]byte, error) {
	n, r := c.Size(), c.Rank()
	send, recv := make([]int, n), make([]int, n)
	if !empty {
		for j := range n {
			send[j] = a2aCount(name, r, j)
			recv[j] = a2aCount(name, j, r)
		}
	}
	if bad && n > 1 && r == n-1 {
		recv[0]++
	}
	srows, rrows := 0, 0
	for j := range n {
		srows += send[j]
		rrows += recv[j]
	}
	src, err := fill(c.Backend(), dt, seedOf(name, g), srows, width)
	if err != nil {
		return nil, err
	}
	dst, err := c.Backend().Alloc(dt, rrows, width)
	if err != nil {
		return nil, err
	}
	if err := c.AllToAll(dst, src, send, recv, phase); err != nil {
		return nil, err
	}
	return read(c.Backend(), dst)
}

// splitGroups is the sub-group layout the scenario also runs on: groups that cross processes,
// in an order other than the ranks' order, and a group of one rank when the size is odd.
func splitGroups(size int) [][]int {
	var gs [][]int
	for r := 0; r+1 < size; r += 2 {
		gs = append(gs, []int{size - 1 - r, size - 2 - r})
	}
	if size%2 == 1 {
		gs = append(gs, []int{0})
	}
	return gs
}

// result is one case's outcome on one rank.
type result struct {
	data []byte
	err  error
}

// span is one recorded collective.
type span struct {
	kind, group string
	bytes       int64
}

type recorder struct {
	mu    sync.Mutex
	spans []span
}

func (r *recorder) Collective(kind, group string, bytes int64, fn func() error) error {
	r.mu.Lock()
	r.spans = append(r.spans, span{kind, group, bytes})
	r.mu.Unlock()
	return fn()
}

// runRanks runs every case on the given communicators (one goroutine per rank, cases in
// order) and returns results[rank index][case].
func runRanks(cs []scase, comms []comm.Communicator, globals []int) [][]result {
	out := make([][]result, len(comms))
	var wg sync.WaitGroup
	for i, c := range comms {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for _, sc := range cs {
				d, err := sc.run(c, globals[i])
				out[i] = append(out[i], result{d, err})
			}
		}()
	}
	wg.Wait()
	return out
}

// layoutComms holds the world and split communicators a scenario runs on.
type layoutComms struct {
	world, split []comm.Communicator
}

// compareWithInproc runs the scenario on this process's ranks of w and on an in-process world
// of the same size, and reports every difference: output bytes, errors, stats and recorded
// spans.
func compareWithInproc(w *World) error {
	size := w.Size()
	bs := make([]backend.Backend, size)
	for i := range bs {
		bs[i] = cpu.New(cpu.Options{Workers: 1})
	}
	defer func() {
		for _, b := range bs {
			b.Close()
		}
	}()
	ref, err := comm.NewWorld(bs)
	if err != nil {
		return err
	}
	refSplit, err := ref.Split("x", splitGroups(size))
	if err != nil {
		return err
	}
	split, err := w.Split("x", splitGroups(size))
	if err != nil {
		return err
	}
	cs := cases()
	var refL, gotL layoutComms
	var globals, localGlobals []int
	refRec, gotRec := make([]*recorder, size), make([]*recorder, w.Local())
	for r := range size {
		refRec[r] = &recorder{}
		ref.Comm(r).SetRecorder(refRec[r])
		refSplit[r].SetRecorder(refRec[r])
		refL.world = append(refL.world, ref.Comm(r))
		refL.split = append(refL.split, refSplit[r])
		globals = append(globals, r)
	}
	for i := range w.Local() {
		gotRec[i] = &recorder{}
		w.Comm(i).SetRecorder(gotRec[i])
		split[i].SetRecorder(gotRec[i])
		gotL.world = append(gotL.world, w.Comm(i))
		gotL.split = append(gotL.split, split[i])
		localGlobals = append(localGlobals, w.FirstRank()+i)
	}
	var errs []error
	for _, layout := range []string{"world", "split"} {
		rc, gc := refL.world, gotL.world
		if layout == "split" {
			rc, gc = refL.split, gotL.split
		}
		want := runRanks(cs, rc, globals)
		got := runRanks(cs, gc, localGlobals)
		for i, g := range localGlobals {
			for k, sc := range cs {
				wr, gr := want[g][k], got[i][k]
				where := fmt.Sprintf("%s: global rank %d: %s", layout, g, sc.name)
				switch {
				case sc.mismatch && (wr.err == nil) != (gr.err == nil):
					errs = append(errs, fmt.Errorf("%s: want the same outcome on both communicators, got in-process %v, tcp %v", where, wr.err, gr.err))
				case sc.mismatch:
				case wr.err != nil || gr.err != nil:
					errs = append(errs, fmt.Errorf("%s: in-process error %v, tcp error %v", where, wr.err, gr.err))
				case !bytes.Equal(wr.data, gr.data):
					errs = append(errs, fmt.Errorf("%s: tcp result (%d bytes) differs from the in-process one (%d bytes)", where, len(gr.data), len(wr.data)))
				}
			}
		}
	}
	// Stats: the same calls and bytes per kind, for the world and the split communicator.
	for i, g := range localGlobals {
		for _, pair := range [][2]comm.Communicator{{refL.world[g], gotL.world[i]}, {refL.split[g], gotL.split[i]}} {
			ws, gs := pair[0].Stats(), pair[1].Stats()
			for k, v := range ws {
				if gs[k].Calls != v.Calls || gs[k].Bytes != v.Bytes {
					errs = append(errs, fmt.Errorf("global rank %d group %s: stats of %s: tcp %d calls %d bytes, in-process %d calls %d bytes", g, pair[1].Group(), k, gs[k].Calls, gs[k].Bytes, v.Calls, v.Bytes))
				}
				if gs[k].Calls > 0 && gs[k].Time <= 0 {
					errs = append(errs, fmt.Errorf("global rank %d group %s: %d calls of %s took no time", g, pair[1].Group(), gs[k].Calls, k))
				}
			}
			if len(ws) != len(gs) {
				errs = append(errs, fmt.Errorf("global rank %d: stats kinds %v, in-process %v", g, keys(gs), keys(ws)))
			}
		}
		if a, b := spanList(refRec[g]), spanList(gotRec[i]); a != b {
			errs = append(errs, fmt.Errorf("global rank %d: recorded spans differ:\nin-process %s\ntcp        %s", g, a, b))
		}
	}
	if len(errs) > 10 {
		errs = append(errs[:10], fmt.Errorf("... and %d more", len(errs)-10))
	}
	return errors.Join(errs...)
}

func keys(s comm.Stats) []string {
	var out []string
	for k := range s {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

func spanList(r *recorder) string {
	var b strings.Builder
	for _, s := range r.spans {
		fmt.Fprintf(&b, "%s/%s/%d ", s.kind, s.group, s.bytes)
	}
	return b.String()
}
