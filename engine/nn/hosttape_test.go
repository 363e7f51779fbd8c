package nn

import (
	"math"
	"math/rand/v2"
	"slices"
	"sort"
	"testing"
)

// TestHostTapeGradients checks every HostTape op's backward against central finite
// differences of a random linear functional of its output, for each of its inputs.
func TestHostTapeGradients(t *testing.T) {
	type build func(t *HostTape, in []*HVar) *HVar
	mat := func(r, c int) [2]int { return [2]int{r, c} }
	cases := []struct {
		name   string
		shapes [][2]int
		f      build
	}{
		{"linear", [][2]int{mat(3, 4), mat(5, 4)}, func(t *HostTape, in []*HVar) *HVar { return t.Linear(in[0], in[1]) }},
		{"grouped linear", [][2]int{mat(3, 6), mat(4, 3)}, func(t *HostTape, in []*HVar) *HVar { return t.GroupedLinear(in[0], in[1], 2) }},
		{"add", [][2]int{mat(2, 3), mat(2, 3)}, func(t *HostTape, in []*HVar) *HVar { return t.Add(in[0], in[1]) }},
		{"add row", [][2]int{mat(2, 3), mat(1, 3)}, func(t *HostTape, in []*HVar) *HVar { return t.AddRow(in[0], in[1]) }},
		{"rows", [][2]int{mat(4, 3)}, func(t *HostTape, in []*HVar) *HVar { return t.Rows(in[0], []int{2, 0, 2}) }},
		{"scatter rows", [][2]int{mat(2, 3), mat(1, 3)}, func(t *HostTape, in []*HVar) *HVar {
			return t.ScatterRows(3, 3, in, [][]int{{2, 0}, {2}})
		}},
		{"concat rows", [][2]int{mat(2, 3), mat(1, 3)}, func(t *HostTape, in []*HVar) *HVar { return t.ConcatRows(in[0], in[1]) }},
		{"cols", [][2]int{mat(2, 5)}, func(t *HostTape, in []*HVar) *HVar { return t.Cols(in[0], 1, 4) }},
		{"rmsnorm weighted", [][2]int{mat(2, 6), mat(1, 3)}, func(t *HostTape, in []*HVar) *HVar { return t.RMSNorm(in[0], 3, in[1], 1e-6) }},
		{"rmsnorm", [][2]int{mat(2, 6)}, func(t *HostTape, in []*HVar) *HVar { return t.RMSNorm(in[0], 6, nil, 1e-6) }},
		{"rope", [][2]int{mat(3, 12)}, func(t *HostTape, in []*HVar) *HVar {
			return t.Rope(in[0], 6, []int{0, 3, 7}, RopeInvFreq(100, 4), 1)
		}},
		{"rope inverse", [][2]int{mat(2, 6)}, func(t *HostTape, in []*HVar) *HVar {
			return t.Rope(in[0], 6, []int{5, 1}, RopeInvFreq(100, 6), -1)
		}},
		{"rope scaled", [][2]int{mat(2, 8)}, func(t *HostTape, in []*HVar) *HVar {
			return t.RopeScaled(in[0], 8, []int{2, 9}, RopeInvFreq(50, 4), 1, 1.3)
		}},
		{"sigmoid", [][2]int{mat(2, 3)}, func(t *HostTape, in []*HVar) *HVar { return t.Sigmoid(in[0], 2, 0.5) }},
		{"sqrt softplus", [][2]int{mat(2, 3)}, func(t *HostTape, in []*HVar) *HVar { return t.SqrtSoftplus(in[0]) }},
		{"scale shift", [][2]int{mat(2, 4), mat(1, 2), mat(1, 4)}, func(t *HostTape, in []*HVar) *HVar {
			return t.ScaleShift(in[0], in[1], in[2], func(j int) int { return j / 2 })
		}},
		{"softmax", [][2]int{mat(2, 6)}, func(t *HostTape, in []*HVar) *HVar { return t.Softmax(in[0], 3) }},
		{"normalize columns", [][2]int{mat(2, 4)}, func(t *HostTape, in []*HVar) *HVar {
			return t.Normalize(t.Softmax(in[0], 2), 2, true, 1e-6)
		}},
		{"normalize rows", [][2]int{mat(2, 9)}, func(t *HostTape, in []*HVar) *HVar {
			return t.Normalize(t.Softmax(in[0], 3), 3, false, 1e-6)
		}},
		{"stream collapse", [][2]int{mat(2, 2), mat(2, 6)}, func(t *HostTape, in []*HVar) *HVar { return t.StreamCollapse(in[0], in[1]) }},
		{"stream expand", [][2]int{mat(2, 2), mat(2, 3), mat(2, 4), mat(2, 6)}, func(t *HostTape, in []*HVar) *HVar {
			return t.StreamExpand(in[0], in[1], in[2], in[3])
		}},
		{"repeat", [][2]int{mat(2, 3)}, func(t *HostTape, in []*HVar) *HVar { return t.Repeat(in[0], 3) }},
		{"clamped swiglu", [][2]int{mat(3, 4), mat(3, 4)}, func(t *HostTape, in []*HVar) *HVar { return t.ClampSwiGLU(in[0], in[1], 0.7) }},
		{"scale rows", [][2]int{mat(3, 2), mat(1, 4)}, func(t *HostTape, in []*HVar) *HVar { return t.ScaleRowsBy(in[0], in[1], []int{3, 0, 3}) }},
		{"route weights", [][2]int{mat(2, 4)}, func(t *HostTape, in []*HVar) *HVar {
			return t.RouteWeights(t.SqrtSoftplus(in[0]), []int{1, 3, 0, 2}, 2, 1.5)
		}},
		{"sink attention", [][2]int{mat(3, 8), mat(4, 4), mat(1, 2)}, func(t *HostTape, in []*HVar) *HVar {
			return t.SinkAttention(in[0], in[1], in[2], func(q, s int) bool { return s <= q || s == 3 && q == 2 }, 0.5)
		}},
		{"window pool", [][2]int{mat(7, 3), mat(7, 3), mat(3, 3)}, func(t *HostTape, in []*HVar) *HVar {
			return t.WindowPool(in[0], in[1], in[2], 3, false)
		}},
		{"window pool overlap", [][2]int{mat(6, 4), mat(6, 4), mat(2, 4)}, func(t *HostTape, in []*HVar) *HVar {
			return t.WindowPool(in[0], in[1], in[2], 2, true)
		}},
		{"token logprobs", [][2]int{mat(3, 5)}, func(t *HostTape, in []*HVar) *HVar { return t.TokenLogprobs(in[0], []int{4, -1, 0}) }},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			rng := rand.New(rand.NewPCG(1, 2))
			vals := make([][]float64, len(tc.shapes))
			for i, s := range tc.shapes {
				vals[i] = make([]float64, s[0]*s[1])
				for j := range vals[i] {
					vals[i][j] = rng.NormFloat64()
				}
			}
			var coef []float64
			run := func(grad bool) (float64, []*HVar) {
				var tp HostTape
				in := make([]*HVar, len(vals))
				for i, s := range tc.shapes {
					in[i] = tp.Leaf(append([]float64(nil), vals[i]...), s[0], s[1])
				}
				y := tc.f(&tp, in)
				if coef == nil {
					coef = make([]float64, len(y.V))
					for j := range coef {
						coef[j] = rng.NormFloat64()
					}
				}
				s := 0.0
				for j, v := range y.V {
					s += coef[j] * v
				}
				if grad {
					copy(y.G, coef)
					tp.Backward()
				}
				return s, in
			}
			_, in := run(true)
			const h = 1e-6
			for i := range vals {
				for j := range vals[i] {
					old := vals[i][j]
					vals[i][j] = old + h
					up, _ := run(false)
					vals[i][j] = old - h
					down, _ := run(false)
					vals[i][j] = old
					fd := (up - down) / (2 * h)
					if g := in[i].G[j]; math.Abs(g-fd) > 1e-6*math.Max(1, math.Abs(fd)) {
						t.Errorf("input %d element %d: gradient %.9g, finite difference %.9g", i, j, g, fd)
					}
				}
			}
		})
	}
}

// A query that may see no key puts all its weight on the sink: its output is zero.
func TestHostTapeSinkAttentionMasksAll(t *testing.T) {
	var tp HostTape
	q := tp.Leaf([]float64{1, 2, 3, 4}, 1, 4)
	kv := tp.Leaf([]float64{5, 6, 7, 8}, 1, 4)
	sinks := tp.Leaf([]float64{0.3}, 1, 1)
	y := tp.SinkAttention(q, kv, sinks, func(int, int) bool { return false }, 1)
	for _, v := range y.V {
		if v != 0 {
			t.Fatalf("a query that sees no key gives %v, want zeros (all weight on the sink)", y.V)
		}
	}
}

// torchTopK keeps, among equal values, the ones torch's CPU top-k keeps (seen on transformers'
// DeepSeek-V4 fixture, whose indexer scores tie at zero), and the k largest otherwise.
func TestTorchTopK(t *testing.T) {
	inf := math.Inf(-1)
	for _, tc := range []struct {
		v    []float64
		k    int
		want []int
	}{
		{[]float64{0, 0.58, 0, inf}, 2, []int{1, 2}},
		{[]float64{0, 0, 0}, 2, []int{0, 1}},
		{[]float64{-0.03, 0, 0, inf}, 2, []int{1, 2}},
		{[]float64{3, 1, 2}, 3, []int{0, 1, 2}},
		{[]float64{0.2, inf, inf, inf}, 2, nil}, // checked below: 0 and one of the -inf
	} {
		got := torchTopK(tc.v, tc.k)
		sort.Ints(got)
		if tc.want != nil && !slices.Equal(got, tc.want) {
			t.Errorf("top %d of %v: %v, want %v", tc.k, tc.v, got, tc.want)
		}
		if len(got) != tc.k || !slices.Contains(got, 0) && tc.v[0] > 0 {
			t.Errorf("top %d of %v: %v", tc.k, tc.v, got)
		}
	}
	rng := rand.New(rand.NewPCG(3, 4))
	for trial := 0; trial < 200; trial++ {
		n := 1 + rng.IntN(40)
		k := 1 + rng.IntN(n)
		v := make([]float64, n)
		for i := range v {
			v[i] = rng.NormFloat64()
		}
		got := torchTopK(v, k)
		sorted := slices.Clone(v)
		sort.Sort(sort.Reverse(sort.Float64Slice(sorted)))
		for _, i := range got {
			if v[i] < sorted[k-1] {
				t.Fatalf("top %d of %v picked %v (value %v below the k-th %v)", k, v, got, v[i], sorted[k-1])
			}
		}
		if len(got) != k {
			t.Fatalf("top %d gave %d indices", k, len(got))
		}
	}
}
