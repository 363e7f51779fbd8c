package parallel

import (
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"testing"

	"github.com/halo-shell/halo-shell/engine/backend"
	"github.com/halo-shell/halo-shell/engine/backend/cpu"
	"github.com/halo-shell/halo-shell/engine/comm"
	"github.com/halo-shell/halo-shell/engine/tensor"
)

// expertFn is the toy expert e used by the tests: y = (e+1)·x + e.
func expertFn(e int32, x float32) float32 { return float32(e+1)*x + float32(e) }

func TestExpertRouteDispatchAndCombine(t *testing.T) {
	const experts, k, width = 8, 2, 3
	for _, ep := range []int{1, 2, 4, 8} {
		t.Run(fmt.Sprint(ep), func(t *testing.T) {
			bs := make([]backend.Backend, ep)
			for i := range bs {
				bs[i] = cpu.New(cpu.Options{Workers: 1})
				defer bs[i].Close()
			}
			w, err := comm.NewWorld(bs)
			if err != nil {
				t.Fatal(err)
			}
			errs := make([]error, ep)
			var wg sync.WaitGroup
			for r := 0; r < ep; r++ {
				wg.Add(1)
				go func() {
					defer wg.Done()
					errs[r] = checkRoute(w.Comm(r), r, experts, k, width)
				}()
			}
			wg.Wait()
			for r, err := range errs {
				if err != nil {
					t.Errorf("rank %d: %v", r, err)
				}
			}
		})
	}
}

// checkRoute routes rank r's tokens (a rank-dependent, uneven number, some ranks none) through
// the toy experts and checks forward and backward against a direct computation.
func checkRoute(c *comm.Comm, r, experts, k, width int) error {
	b := c.Backend()
	rng := rand.New(rand.NewPCG(uint64(r), 3))
	n := (r * 5) % 7 // 0 tokens on rank 0
	sel := make([]int32, n*k)
	for i := range sel {
		sel[i] = int32(rng.IntN(experts))
	}
	xs := make([]float32, n*width)
	for i := range xs {
		xs[i] = float32(rng.NormFloat64())
	}
	route, err := NewExpertRoute(c, sel, n, k, experts)
	if err != nil {
		return err
	}
	x, err := fromRows(b, xs, n, width)
	if err != nil {
		return err
	}
	recv, err := route.Dispatch(x)
	if err != nil {
		return err
	}
	m := route.Received()
	lo, hi := c.Rank()*experts/c.Size(), (c.Rank()+1)*experts/c.Size()
	rv, _ := backend.ToFloat32(b, recv)
	for i := 0; i < m; i++ {
		e := route.RecvExperts[i]
		if int(e) < lo || int(e) >= hi {
			return fmt.Errorf("received a row for expert %d, which rank %d does not own", e, c.Rank())
		}
		for j := 0; j < width; j++ {
			rv[i*width+j] = expertFn(e, rv[i*width+j])
		}
	}
	y, err := fromRows(b, rv[:m*width], m, width)
	if err != nil {
		return err
	}
	out, err := route.Combine(y)
	if err != nil {
		return err
	}
	got, _ := backend.ToFloat32(b, out)
	for a := 0; a < n*k; a++ {
		for j := 0; j < width; j++ {
			want := expertFn(sel[a], xs[(a/k)*width+j])
			if got[a*width+j] != want {
				return fmt.Errorf("token %d slot %d (expert %d) column %d: %v, want %v", a/k, a%k, sel[a], j, got[a*width+j], want)
			}
		}
	}
	// Backward with upstream gradient g[a] = a+1 per assignment: dx[t] = sum over slots of
	// (e+1)·g.
	gs := make([]float32, n*k*width)
	for i := range gs {
		gs[i] = float32(i/width + 1)
	}
	g, err := fromRows(b, gs, n*k, width)
	if err != nil {
		return err
	}
	dRecv, err := route.CombineBackward(g)
	if err != nil {
		return err
	}
	dv, _ := backend.ToFloat32(b, dRecv)
	for i := 0; i < m; i++ {
		for j := 0; j < width; j++ {
			dv[i*width+j] *= float32(route.RecvExperts[i] + 1)
		}
	}
	dr, err := fromRows(b, dv[:m*width], m, width)
	if err != nil {
		return err
	}
	dx, err := route.DispatchBackward(dr)
	if err != nil {
		return err
	}
	gotDX, _ := backend.ToFloat32(b, dx)
	for tok := 0; tok < n; tok++ {
		want := float32(0)
		for s := 0; s < k; s++ {
			a := tok*k + s
			want += float32(sel[a]+1) * float32(a+1)
		}
		for j := 0; j < width; j++ {
			if gotDX[tok*width+j] != want {
				return fmt.Errorf("dx token %d column %d: %v, want %v", tok, j, gotDX[tok*width+j], want)
			}
		}
	}
	return nil
}

// fromRows uploads v as [rows, width] (one zero row when rows is 0).
func fromRows(b backend.Backend, v []float32, rows, width int) (T, error) {
	if rows == 0 {
		return b.Alloc(tensor.F32, 1, width)
	}
	return backend.FromFloat32(b, v, tensor.F32, rows, width)
}

func TestExpertRouteRejectsBadRouting(t *testing.T) {
	b := cpu.New(cpu.Options{Workers: 1})
	defer b.Close()
	bs := []backend.Backend{b, cpu.New(cpu.Options{Workers: 1})}
	defer bs[1].Close()
	w, _ := comm.NewWorld(bs)
	c := w.Comm(0)
	for _, tc := range []struct {
		sel     []int32
		n, k, e int
		want    string
	}{
		{[]int32{0, 1}, 1, 2, 3, "3 experts do not split over 2 ranks"},
		{[]int32{0, 9}, 1, 2, 4, "chose expert 9 of 4"},
		{[]int32{0}, 1, 2, 4, "1 choices for 1 tokens x 2 slots"},
	} {
		if _, err := NewExpertRoute(c, tc.sel, tc.n, tc.k, tc.e); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("got %v, want an error containing %q", err, tc.want)
		}
	}
}
