package cuda

import (
	"bytes"
	"fmt"
	"math"
	"strings"
	"testing"

	"github.com/halo-shell/halo-shell/engine/tensor"
)

// ceHostCase is one call of ce_rows: R rows of V logits starting at global row row0, logits and
// dlogits of the given dtypes (alias: the dlogits overwrite the logits), softcap cap and
// gradient scale, targets per global row (ignore index -100 and out-of-range targets included
// where the case says so).
type ceHostCase struct {
	r, v, row0 int
	dtl, dtdl  tensor.DType
	alias      bool
	cap, scale float32
	ignore     int // a row (in the chunk) whose target is the ignore index, or -1
	badRow     int // a row whose target is outside the vocabulary, or -1
}

func (c ceHostCase) String() string {
	return fmt.Sprintf("R %d V %d row0 %d logits %s dlogits %s alias %v cap %g", c.r, c.v, c.row0, c.dtl, c.dtdl, c.alias, c.cap)
}

// TestCrossEntropyKernelOnHost runs ce_rows (kernels/crossentropy.cu) as host C++
// (testdata/hostemu/crossentropy_check.cc) and compares loss, logprob, dlogits and the
// bad-target row with a float64 reference computed from the same (dtype-exact) logits: fp32
// and bf16 logits, dlogits beside them or written over them (HALO_CE_LOGITS=bf16 writes bf16
// dlogits over bf16 logits), the vectorised (V a multiple of 4) and scalar paths, a softcap, an
// ignored row and an out-of-range target. It needs a C++17 compiler (fails under CI without).
func TestCrossEntropyKernelOnHost(t *testing.T) {
	src, err := kernelSource("crossentropy.cu")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(src, "__shared__ float sm[32], ss[32];") {
		t.Fatal("crossentropy.cu no longer declares the shared arrays the harness turns into statics")
	}
	src = strings.ReplaceAll(src, "__shared__ ", "static ")
	// _FORTIFY_SOURCE would check _longjmp against the current stack, which a fiber switch leaves.
	bin := buildHostEmu(t, "cross-entropy", "crossentropy_check", src, "-O1", "-U_FORTIFY_SOURCE")
	f32, bf := tensor.F32, tensor.BF16
	cases := []ceHostCase{
		{r: 3, v: 256, row0: 0, dtl: f32, dtdl: f32, alias: true, scale: 0.25, ignore: 1, badRow: -1},
		{r: 3, v: 256, row0: 2, dtl: f32, dtdl: bf, scale: 0.5, ignore: -1, badRow: -1},
		{r: 4, v: 260, row0: 1, dtl: bf, dtdl: bf, alias: true, scale: 0.125, ignore: 2, badRow: -1},
		{r: 2, v: 203, row0: 0, dtl: bf, dtdl: bf, alias: true, cap: 3, scale: 1, ignore: -1, badRow: -1},
		{r: 3, v: 128, row0: 5, dtl: bf, dtdl: bf, alias: true, scale: 1, ignore: -1, badRow: 1},
	}
	round := func(dt tensor.DType, v float32) float32 {
		if dt == bf {
			return tensor.BF16ToF32(tensor.F32ToBF16(v))
		}
		return v
	}
	var in bytes.Buffer
	type ref struct {
		loss, lp, dl []float64
		bad          int
	}
	var refs []ref
	for ci, c := range cases {
		logits := make([]float32, c.r*c.v)
		for i := range logits {
			logits[i] = round(c.dtl, float32(4*math.Sin(float64(i)*0.37+float64(ci))+0.5*math.Cos(float64(i)*1.91)))
		}
		targets := make([]int32, c.row0+c.r)
		for i := range targets {
			targets[i] = int32((i*37 + 11) % c.v)
		}
		if c.ignore >= 0 {
			targets[c.row0+c.ignore] = -100
		}
		bad := c.row0 + c.r
		if c.badRow >= 0 {
			targets[c.row0+c.badRow] = int32(c.v + 3)
			bad = c.row0 + c.badRow
		}
		rf := ref{bad: bad}
		for r := 0; r < c.r; r++ {
			row := logits[r*c.v : (r+1)*c.v]
			capped := make([]float64, c.v)
			for j, x := range row {
				capped[j] = float64(x)
				if c.cap > 0 {
					capped[j] = float64(c.cap) * math.Tanh(float64(x)/float64(c.cap))
				}
			}
			mx := math.Inf(-1)
			for _, x := range capped {
				mx = math.Max(mx, x)
			}
			sum := 0.0
			for _, x := range capped {
				sum += math.Exp(x - mx)
			}
			lse := mx + math.Log(sum)
			tg := int(targets[c.row0+r])
			ignored := tg == -100 || tg < 0 || tg >= c.v
			lp := 0.0
			if !ignored {
				lp = capped[tg] - lse
			}
			rf.loss, rf.lp = append(rf.loss, -lp), append(rf.lp, lp)
			for j := range row {
				g := 0.0
				if !ignored {
					oh := 0.0
					if j == tg {
						oh = 1
					}
					d := 1.0
					if c.cap > 0 {
						th := math.Tanh(float64(row[j]) / float64(c.cap))
						d = 1 - th*th
					}
					g = float64(c.scale) * (math.Exp(capped[j]-lse) - oh) * d
				}
				rf.dl = append(rf.dl, g)
			}
		}
		refs = append(refs, rf)
		alias := 0
		if c.alias {
			alias = 1
		}
		fmt.Fprintf(&in, "%d %d %d %d %d %d %g %g\n", c.r, c.v, c.row0, int(c.dtl), int(c.dtdl), alias, c.cap, c.scale)
		writeFloats(&in, logits)
		for _, tg := range targets {
			fmt.Fprintf(&in, "%d ", tg)
		}
		in.WriteByte('\n')
	}
	gots := runHostEmu(t, bin, &in, 4, len(cases))
	for ci, c := range cases {
		got, rf := gots[ci], refs[ci]
		for name, want := range map[string][]float64{"loss": rf.loss, "logprob": rf.lp} {
			for i, w := range want {
				if g := float64(got[name][i]); math.Abs(g-w) > 2e-5*math.Max(1, math.Abs(w)) {
					t.Errorf("%v: %s[%d] = %.7g, want %.7g", c, name, c.row0+i, g, w)
				}
			}
		}
		// fp32 dlogits within fp32 rounding of the exp; bf16 ones within one bf16 unit.
		for i, w := range rf.dl {
			g := float64(got["dlogits"][i])
			tol := 1e-6 + 1e-5*math.Abs(w)
			if c.dtdl == bf {
				tol = 1e-6 + math.Abs(w)/128
			}
			if math.Abs(g-w) > tol {
				t.Errorf("%v: dlogits[%d] = %.7g, want %.7g", c, i, g, w)
				break
			}
		}
		if b := int(got["bad"][0]); b != rf.bad {
			t.Errorf("%v: bad row %d, want %d", c, b, rf.bad)
		}
	}
}
