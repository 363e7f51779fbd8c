package nccl

import (
	"encoding/json"
	"fmt"
	"math"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/halo-shell/halo-shell/engine/backend"
	"github.com/halo-shell/halo-shell/engine/backend/cpu"
	"github.com/halo-shell/halo-shell/engine/backend/cuda"
	"github.com/halo-shell/halo-shell/engine/comm"
	"github.com/halo-shell/halo-shell/engine/tensor"
)

// gpusOrSkip opens n GPUs, or skips with the reason NCCL or the GPUs cannot be used.
func gpusOrSkip(t testing.TB, n int) []*cuda.Backend {
	t.Helper()
	if err := Available(); err != nil {
		t.Skipf("needs NCCL and a GPU: %v", strings.SplitN(err.Error(), "\n", 2)[0])
	}
	if have := cuda.DeviceCount(); have < n {
		t.Skipf("needs %d GPUs, the driver sees %d", n, have)
	}
	bs := make([]*cuda.Backend, n)
	for i := range bs {
		b, err := cuda.New(i)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { b.Close() })
		bs[i] = b
	}
	return bs
}

// rankCounts are the world sizes the GPU tests run: one rank, and every local GPU.
func rankCounts() []int {
	n := cuda.DeviceCount()
	if n <= 1 {
		return []int{1}
	}
	return []int{1, n}
}

// scenario runs one collective on rank c and returns its result tensor's bytes. vals(r, n) are
// small integers (exact in bf16) so reductions agree across summation orders.
type scenario struct {
	name   string
	reduce tensor.DType // the dtype when results are compared with a tolerance; 0 when exact
	run    func(c comm.Communicator) ([]byte, error)
}

func upload(b backend.Backend, dt tensor.DType, v []float32, shape ...int) (tensor.Tensor, error) {
	t, err := b.Alloc(dt, shape...)
	if err != nil {
		return t, err
	}
	raw, err := tensor.EncodeFloat32(dt, v)
	if err != nil {
		return t, err
	}
	return t, b.Upload(t, raw)
}

func ints(rank, n, salt int) []float32 {
	v := make([]float32, n)
	for i := range v {
		v[i] = float32((rank*7 + i*3 + salt) % 17)
	}
	return v
}

func download(b backend.Backend, t tensor.Tensor) ([]byte, error) {
	out := make([]byte, t.Bytes())
	return out, b.Download(out, t)
}

func scenarios() []scenario {
	const width = 5
	return []scenario{
		{"all_reduce_sum_f32", tensor.F32, func(c comm.Communicator) ([]byte, error) {
			t, err := upload(c.Backend(), tensor.F32, ints(c.Rank(), 1031, 0), 1031)
			if err != nil {
				return nil, err
			}
			if err := c.AllReduce(t, comm.Sum); err != nil {
				return nil, err
			}
			return download(c.Backend(), t)
		}},
		{"all_reduce_avg_bf16", tensor.BF16, func(c comm.Communicator) ([]byte, error) {
			t, err := upload(c.Backend(), tensor.BF16, ints(c.Rank(), 64, 1), 8, 8)
			if err != nil {
				return nil, err
			}
			if err := c.AllReduce(t, comm.Avg); err != nil {
				return nil, err
			}
			return download(c.Backend(), t)
		}},
		{"all_gather_f32", 0, func(c comm.Communicator) ([]byte, error) {
			src, err := upload(c.Backend(), tensor.F32, ints(c.Rank(), 6, 2), 2, 3)
			if err != nil {
				return nil, err
			}
			dst, err := c.Backend().Alloc(tensor.F32, 2*c.Size(), 3)
			if err != nil {
				return nil, err
			}
			if err := c.AllGather(dst, src); err != nil {
				return nil, err
			}
			return download(c.Backend(), dst)
		}},
		{"reduce_scatter_sum_f32", tensor.F32, func(c comm.Communicator) ([]byte, error) {
			n := 4 * c.Size()
			src, err := upload(c.Backend(), tensor.F32, ints(c.Rank(), n, 3), n)
			if err != nil {
				return nil, err
			}
			dst, err := c.Backend().Alloc(tensor.F32, 4)
			if err != nil {
				return nil, err
			}
			if err := c.ReduceScatter(dst, src, comm.Sum); err != nil {
				return nil, err
			}
			return download(c.Backend(), dst)
		}},
		{"all_to_all_uneven_bf16", 0, func(c comm.Communicator) ([]byte, error) {
			// Rank r sends (r+j)%3 rows to rank j (some parts empty).
			n, r := c.Size(), c.Rank()
			send, recv := make([]int, n), make([]int, n)
			rowsOut, rowsIn := 0, 0
			for j := 0; j < n; j++ {
				send[j], recv[j] = (r+j)%3, (j+r)%3
				rowsOut += send[j]
				rowsIn += recv[j]
			}
			src, err := upload(c.Backend(), tensor.BF16, ints(r, max(rowsOut, 1)*width, 4)[:rowsOut*width], rowsOut, width)
			if err != nil {
				return nil, err
			}
			dst, err := c.Backend().Alloc(tensor.BF16, rowsIn, width)
			if err != nil {
				return nil, err
			}
			if err := c.AllToAll(dst, src, send, recv, comm.Dispatch); err != nil {
				return nil, err
			}
			return download(c.Backend(), dst)
		}},
		{"broadcast_from_last", 0, func(c comm.Communicator) ([]byte, error) {
			t, err := upload(c.Backend(), tensor.F32, ints(c.Rank(), 33, 5), 33)
			if err != nil {
				return nil, err
			}
			if err := c.Broadcast(t, c.Size()-1); err != nil {
				return nil, err
			}
			return download(c.Backend(), t)
		}},
		{"send_recv_pairs", 0, func(c comm.Communicator) ([]byte, error) {
			t, err := upload(c.Backend(), tensor.F32, ints(c.Rank(), 9, 6), 9)
			if err != nil {
				return nil, err
			}
			r := c.Rank()
			switch {
			case r%2 == 0 && r+1 < c.Size():
				err = c.Send(t, r+1)
			case r%2 == 1:
				err = c.Recv(t, r-1)
			}
			if err != nil {
				return nil, err
			}
			if err := c.Barrier(); err != nil {
				return nil, err
			}
			return download(c.Backend(), t)
		}},
	}
}

// spmd runs f on every rank, one goroutine each.
func spmd[C any](cs []C, f func(c C) ([]byte, error)) ([][]byte, []error) {
	out := make([][]byte, len(cs))
	errs := make([]error, len(cs))
	var wg sync.WaitGroup
	for i, c := range cs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			out[i], errs[i] = f(c)
		}()
	}
	wg.Wait()
	return out, errs
}

func cpuWorld(t *testing.T, n int) *comm.World {
	bs := make([]backend.Backend, n)
	for i := range bs {
		bs[i] = cpu.New(cpu.Options{Workers: 1})
	}
	w, err := comm.NewWorld(bs)
	if err != nil {
		t.Fatal(err)
	}
	return w
}

func compare(t *testing.T, what string, dt tensor.DType, got, want []byte) {
	t.Helper()
	if dt == 0 {
		if string(got) != string(want) {
			t.Fatalf("%s: NCCL gave %x, the in-process communicator %x", what, got, want)
		}
		return
	}
	g, _ := tensor.DecodeFloat32(dt, got)
	w, _ := tensor.DecodeFloat32(dt, want)
	eps := 1e-6
	if dt == tensor.BF16 {
		eps = 1.0 / 128
	}
	for i := range w {
		if math.Abs(float64(g[i]-w[i])) > 1e-6+eps*math.Abs(float64(w[i])) {
			t.Fatalf("%s: element %d: NCCL %g, in-process %g (tolerance %g relative)", what, i, g[i], w[i], eps)
		}
	}
}

func TestGPUCollectivesMatchInProcess(t *testing.T) {
	for _, n := range rankCounts() {
		t.Run(fmt.Sprintf("ranks=%d", n), func(t *testing.T) {
			w, err := NewLocalWorld(gpusOrSkip(t, n))
			if err != nil {
				t.Fatal(err)
			}
			defer w.Close()
			ref := cpuWorld(t, n)
			gcs := make([]comm.Communicator, n)
			rcs := make([]comm.Communicator, n)
			for i := range gcs {
				gcs[i], rcs[i] = w.Comm(i), ref.Comm(i)
			}
			for _, sc := range scenarios() {
				got, gerrs := spmd(gcs, sc.run)
				want, rerrs := spmd(rcs, sc.run)
				for r := range got {
					if gerrs[r] != nil || rerrs[r] != nil {
						t.Fatalf("%s rank %d: nccl %v, in-process %v", sc.name, r, gerrs[r], rerrs[r])
					}
					compare(t, fmt.Sprintf("%s rank %d", sc.name, r), sc.reduce, got[r], want[r])
				}
			}
			st := w.Comm(0).Stats()
			for _, k := range []string{comm.KindAllReduce, comm.KindAllGather, comm.KindReduceScatter, comm.KindAllToAllDispatch, comm.KindBroadcast, comm.KindBarrier} {
				if st[k].Calls == 0 || st[k].Time <= 0 {
					t.Errorf("stats of %s: %+v; want calls timed by CUDA events", k, st[k])
				}
			}
		})
	}
}

func TestGPUSplitGroupsMatchInProcess(t *testing.T) {
	n := cuda.DeviceCount()
	if n < 2 {
		n = 2 // gpusOrSkip says why
	}
	w, err := NewLocalWorld(gpusOrSkip(t, n))
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	var groups [][]int
	for g := 0; g < 2; g++ {
		var ranks []int
		for r := g; r < n; r += 2 {
			ranks = append(ranks, r)
		}
		groups = append(groups, ranks)
	}
	gcs, err := w.Split("dp", groups)
	if err != nil {
		t.Fatal(err)
	}
	ref := cpuWorld(t, n)
	rcs, err := ref.Split("dp", groups)
	if err != nil {
		t.Fatal(err)
	}
	run := scenarios()[0].run
	got, gerrs := spmd(gcs, func(c *Comm) ([]byte, error) { return run(c) })
	want, rerrs := spmd(rcs, func(c *comm.Comm) ([]byte, error) { return run(c) })
	for r := range got {
		if gerrs[r] != nil || rerrs[r] != nil {
			t.Fatalf("rank %d: nccl %v, in-process %v", r, gerrs[r], rerrs[r])
		}
		if gcs[r].Group() != rcs[r].Group() || gcs[r].Rank() != rcs[r].Rank() || gcs[r].Size() != rcs[r].Size() {
			t.Fatalf("rank %d: nccl group %s %d/%d, in-process %s %d/%d", r, gcs[r].Group(), gcs[r].Rank(), gcs[r].Size(), rcs[r].Group(), rcs[r].Rank(), rcs[r].Size())
		}
		compare(t, fmt.Sprintf("dp all-reduce rank %d", r), tensor.F32, got[r], want[r])
	}
}

func TestGPUArgumentErrors(t *testing.T) {
	w, err := NewLocalWorld(gpusOrSkip(t, 1))
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	c := w.Comm(0)
	host := cpu.New(cpu.Options{Workers: 1})
	ht, _ := host.Alloc(tensor.F32, 4)
	gi, _ := c.Backend().Alloc(tensor.I32, 4)
	g4, _ := c.Backend().Alloc(tensor.F32, 4)
	g3, _ := c.Backend().Alloc(tensor.F32, 3) // too small a gather target for any group size
	cases := []struct {
		name string
		err  error
		want string
	}{
		{"host tensor", c.AllReduce(ht, comm.Sum), "is not on cuda:0"},
		{"int reduction", c.AllReduce(gi, comm.Sum), "f32, bf16 or f16"},
		{"gather size", c.AllGather(g3, g4), "must hold 1 x 4"},
		{"all-to-all counts", c.AllToAll(g4, g4, []int{3}, []int{4}, comm.Dispatch), "send counts add up to 3 rows"},
		{"broadcast root", c.Broadcast(g4, 1), "root 1 is outside 0..0"},
		{"send to self", c.Send(g4, 0), "want another rank"},
	}
	for _, tc := range cases {
		if tc.err == nil || !strings.Contains(tc.err.Error(), tc.want) {
			t.Errorf("%s: got %v, want %q", tc.name, tc.err, tc.want)
		}
	}
}

// TestGPUBandwidthReport measures all-to-all, reduce-scatter, all-gather and all-reduce over
// every local GPU at the sizes of HALO_NCCL_SIZES (bytes, comma-separated) and writes them as
// JSON to HALO_NCCL_REPORT. Times are the CUDA-event times the communicator's Stats record (the
// same numbers profile spans carry). Bus bandwidth uses nccl-tests' factors.
func TestGPUBandwidthReport(t *testing.T) {
	path := os.Getenv("HALO_NCCL_REPORT")
	if path == "" {
		t.Skip("set HALO_NCCL_REPORT=FILE to measure collective bandwidth")
	}
	n := max(cuda.DeviceCount(), 1)
	w, err := NewLocalWorld(gpusOrSkip(t, n))
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	sizes := []int64{1 << 20, 16 << 20, 128 << 20}
	if s := os.Getenv("HALO_NCCL_SIZES"); s != "" {
		sizes = nil
		for _, f := range strings.Split(s, ",") {
			v, err := strconv.ParseInt(strings.TrimSpace(f), 10, 64)
			if err != nil || v <= 0 {
				t.Fatalf("HALO_NCCL_SIZES: %q is not a byte count", f)
			}
			sizes = append(sizes, v)
		}
	}
	iters := 20
	type row struct {
		Op       string  `json:"op"`
		Bytes    int64   `json:"bytes"`
		Ranks    int     `json:"ranks"`
		TimeUS   float64 `json:"time_us"`
		AlgBWGBs float64 `json:"algbw_gbs"`
		BusBWGBs float64 `json:"busbw_gbs"`
	}
	var rows []row
	cs := make([]*Comm, n)
	for i := range cs {
		cs[i] = w.Comm(i)
	}
	for _, size := range sizes {
		elems := int(size / 2 / int64(n) * int64(n)) // bf16, divisible by n
		per := elems / n
		ops := []struct {
			name, kind string
			factor     float64
			fn         func(c *Comm, a, b tensor.Tensor) error
		}{
			{"all_to_all", comm.KindAllToAllDispatch, float64(n-1) / float64(n), func(c *Comm, a, b tensor.Tensor) error {
				cnt := make([]int, n)
				for i := range cnt {
					cnt[i] = per
				}
				return c.AllToAll(b, a, cnt, cnt, comm.Dispatch)
			}},
			{"reduce_scatter", comm.KindReduceScatter, float64(n-1) / float64(n), func(c *Comm, a, b tensor.Tensor) error {
				v, _ := b.View(0, per)
				return c.ReduceScatter(v, a, comm.Sum)
			}},
			{"all_gather", comm.KindAllGather, float64(n-1) / float64(n), func(c *Comm, a, b tensor.Tensor) error {
				v, _ := a.View(0, per)
				return c.AllGather(b, v)
			}},
			{"all_reduce", comm.KindAllReduce, 2 * float64(n-1) / float64(n), func(c *Comm, a, b tensor.Tensor) error {
				return c.AllReduce(a, comm.Sum)
			}},
		}
		for _, op := range ops {
			before := cs[0].Stats()[op.kind]
			_, errs := spmd(cs, func(c *Comm) ([]byte, error) {
				a, err := c.Backend().Alloc(tensor.BF16, elems)
				if err != nil {
					return nil, err
				}
				defer c.Backend().Free(a)
				b, err := c.Backend().Alloc(tensor.BF16, elems)
				if err != nil {
					return nil, err
				}
				defer c.Backend().Free(b)
				for i := 0; i < iters; i++ {
					if err := op.fn(c, a, b); err != nil {
						return nil, err
					}
				}
				return nil, nil
			})
			for r, err := range errs {
				if err != nil {
					t.Fatalf("%s %d bytes rank %d: %v", op.name, size, r, err)
				}
			}
			after := cs[0].Stats()[op.kind]
			// The first of the iterations warms up; it is kept (the mean over 20 moves little).
			d := (after.Time - before.Time) / time.Duration(iters)
			bytes := int64(elems) * 2
			alg := float64(bytes) / d.Seconds() / 1e9
			rows = append(rows, row{op.name, bytes, n, float64(d.Nanoseconds()) / 1e3, alg, alg * op.factor})
			t.Logf("%-15s %11d B  %9.1f us  algbw %7.2f GB/s  busbw %7.2f GB/s", op.name, bytes, float64(d.Nanoseconds())/1e3, alg, alg*op.factor)
		}
	}
	v, _ := Version()
	rep := map[string]any{"nccl_version": versionString(v), "ranks": n, "iters": iters, "dtype": "bf16",
		"nvls_enable": os.Getenv("NCCL_NVLS_ENABLE"), "results": rows}
	b, _ := json.MarshalIndent(rep, "", "  ")
	if err := os.WriteFile(path, b, 0o644); err != nil {
		t.Fatal(err)
	}
}
