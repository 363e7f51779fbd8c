package nn

import (
	"fmt"
	"math"
	"testing"
)

// mlaCase is one shape of latent attention under test.
type mlaCase struct {
	nh, nope, rope, v, r, qr int
	interleaved              bool
	bias                     bool // on q_a_proj (or none for q_proj), kv_a_proj_with_mqa and o_proj
}

func (c mlaCase) String() string {
	return fmt.Sprintf("NH%d_nope%d_rope%d_v%d_r%d_qr%d_interleaved=%v_bias=%v", c.nh, c.nope, c.rope, c.v, c.r, c.qr, c.interleaved, c.bias)
}

func newMLA(e *env, cc int, c mlaCase) *MLA {
	lin := func(out, in int, bias bool) Linear {
		l := Linear{W: e.randn(0.3, out, in), GW: e.zeros(out, in)}
		if bias {
			l.B, l.GB = e.randn(0.1, out), e.zeros(out)
		}
		return l
	}
	qk := c.nope + c.rope
	a := &MLA{Name: "mla", NH: c.nh, Nope: c.nope, Rope: c.rope, V: c.v, KVRank: c.r, QRank: c.qr,
		Interleaved: c.interleaved, Scale: 0.37,
		KVA:     lin(c.r+c.rope, cc, c.bias),
		KVANorm: RMSNorm{W: e.ones(0.2, c.r), GW: e.zeros(c.r), Eps: 1e-6},
		KVB:     lin(c.nh*(c.nope+c.v), c.r, false),
		O:       lin(cc, c.nh*c.v, c.bias)}
	if c.qr > 0 {
		a.QA, a.QB = lin(c.qr, cc, c.bias), lin(c.nh*qk, c.qr, false)
		a.QANorm = RMSNorm{W: e.ones(0.2, c.qr), GW: e.zeros(c.qr), Eps: 1e-6}
	} else {
		a.Q = lin(c.nh*qk, cc, false)
	}
	return a
}

func mlaLayer(a *MLA) layer {
	l := layer{
		fwd: func(p *Pass, x T, keep bool) (T, error) { return a.Forward(p, x, keep) },
		bwd: func(p *Pass, _ T, dy T) (T, error) { return a.Backward(p, dy) },
	}
	for _, lin := range []*Linear{&a.Q, &a.QA, &a.QB, &a.KVA, &a.KVB, &a.O} {
		if lin.W.IsNil() {
			continue
		}
		l.param, l.grad = append(l.param, lin.W), append(l.grad, lin.GW)
		if !lin.B.IsNil() {
			l.param, l.grad = append(l.param, lin.B), append(l.grad, lin.GB)
		}
	}
	l.param, l.grad = append(l.param, a.KVANorm.W), append(l.grad, a.KVANorm.GW)
	if a.QRank > 0 {
		l.param, l.grad = append(l.param, a.QANorm.W), append(l.grad, a.QANorm.GW)
	}
	return l
}

// refMLA computes the block in float64 the way transformers' DeepseekV3Attention writes it:
// heads laid out nope | rope, the rotary dims of interleaved checkpoints moved to the
// rotate-half layout before rotating, keys and values from kv_b_proj, causal softmax within
// each document, o_proj.
func refMLA(e *env, a *MLA, x []float32, lens []int, theta float64) []float64 {
	f64 := func(t T) []float64 {
		if t.IsNil() {
			return nil
		}
		v := e.get(t)
		out := make([]float64, len(v))
		for i, x := range v {
			out[i] = float64(x)
		}
		return out
	}
	linear := func(in []float64, n, cin int, l Linear) []float64 {
		w, b := f64(l.W), f64(l.B)
		cout := len(w) / cin
		out := make([]float64, n*cout)
		for t := 0; t < n; t++ {
			for o := 0; o < cout; o++ {
				s := 0.0
				if b != nil {
					s = b[o]
				}
				for i := 0; i < cin; i++ {
					s += in[t*cin+i] * w[o*cin+i]
				}
				out[t*cout+o] = s
			}
		}
		return out
	}
	rms := func(in []float64, n, c int, nm RMSNorm) []float64 {
		w := f64(nm.W)
		out := make([]float64, len(in))
		for t := 0; t < n; t++ {
			ss := 0.0
			for i := 0; i < c; i++ {
				ss += in[t*c+i] * in[t*c+i]
			}
			rs := 1 / math.Sqrt(ss/float64(c)+float64(nm.Eps))
			for i := 0; i < c; i++ {
				out[t*c+i] = in[t*c+i] * rs * w[i]
			}
		}
		return out
	}
	n, c := 0, a.KVA.W.Dim(1)
	for _, l := range lens {
		n += l
	}
	xs := make([]float64, len(x))
	for i, v := range x {
		xs[i] = float64(v)
	}
	nh, nope, rope, vd, r := a.NH, a.Nope, a.Rope, a.V, a.KVRank
	qk := nope + rope
	var q []float64
	if a.QRank > 0 {
		q = linear(rms(linear(xs, n, c, a.QA), n, a.QRank, a.QANorm), n, a.QRank, a.QB)
	} else {
		q = linear(xs, n, c, a.Q)
	}
	kva := linear(xs, n, c, a.KVA)
	ckv := make([]float64, n*r)
	for t := 0; t < n; t++ {
		copy(ckv[t*r:(t+1)*r], kva[t*(r+rope):t*(r+rope)+r])
	}
	kvb := linear(rms(ckv, n, r, a.KVANorm), n, r, a.KVB)
	rotate := func(v []float64, pos int) []float64 {
		in := append([]float64(nil), v...)
		if a.Interleaved {
			for i := 0; i < rope/2; i++ {
				in[i], in[i+rope/2] = v[2*i], v[2*i+1]
			}
		}
		out := make([]float64, rope)
		for i := 0; i < rope/2; i++ {
			f := float64(float32(1 / math.Pow(theta, float64(2*i)/float64(rope))))
			ang := float64(float32(pos) * float32(f))
			cs, sn := math.Cos(ang), math.Sin(ang)
			out[i] = in[i]*cs - in[i+rope/2]*sn
			out[i+rope/2] = in[i+rope/2]*cs + in[i]*sn
		}
		return out
	}
	query := make([][]float64, n*nh) // per token and head: nope | rotated rope
	key := make([][]float64, n*nh)
	val := make([][]float64, n*nh)
	start := 0
	for _, l := range lens {
		for i := 0; i < l; i++ {
			t := start + i
			kr := rotate(kva[t*(r+rope)+r:(t+1)*(r+rope)], i)
			for h := 0; h < nh; h++ {
				qh := q[t*nh*qk+h*qk : t*nh*qk+(h+1)*qk]
				query[t*nh+h] = append(append([]float64(nil), qh[:nope]...), rotate(qh[nope:], i)...)
				kh := kvb[t*nh*(nope+vd)+h*(nope+vd) : t*nh*(nope+vd)+(h+1)*(nope+vd)]
				key[t*nh+h] = append(append([]float64(nil), kh[:nope]...), kr...)
				val[t*nh+h] = kh[nope:]
			}
		}
		start += l
	}
	attn := make([]float64, n*nh*vd)
	start = 0
	for _, l := range lens {
		for i := 0; i < l; i++ {
			t := start + i
			for h := 0; h < nh; h++ {
				sc := make([]float64, i+1)
				mx := math.Inf(-1)
				for j := 0; j <= i; j++ {
					s := 0.0
					for d := 0; d < qk; d++ {
						s += query[t*nh+h][d] * key[(start+j)*nh+h][d]
					}
					sc[j] = s * float64(a.Scale)
					mx = math.Max(mx, sc[j])
				}
				sum := 0.0
				for j := range sc {
					sc[j] = math.Exp(sc[j] - mx)
					sum += sc[j]
				}
				for j := range sc {
					for d := 0; d < vd; d++ {
						attn[t*nh*vd+h*vd+d] += sc[j] / sum * val[(start+j)*nh+h][d]
					}
				}
			}
		}
		start += l
	}
	return linear(attn, n, nh*vd, a.O)
}

var mlaCases = []mlaCase{
	{nh: 3, nope: 6, rope: 4, v: 5, r: 7, qr: 5, interleaved: true, bias: true}, // V < QK: values padded
	{nh: 2, nope: 4, rope: 4, v: 8, r: 6, qr: 0},                                // V = QK, plain q_proj
	{nh: 2, nope: 2, rope: 6, v: 11, r: 5, qr: 4, interleaved: true},            // V > QK: queries and keys padded
	{nh: 4, nope: 0, rope: 4, v: 3, r: 6, qr: 0, bias: true},                    // no unrotated dims
}

// TestMLAForwardMatchesReference compares the block with refMLA (transformers' formulation
// in float64) over packed documents, for every case's head layout.
func TestMLAForwardMatchesReference(t *testing.T) {
	const C = 10
	lens := []int{5, 1, 4}
	for _, c := range mlaCases {
		t.Run(c.String(), func(t *testing.T) {
			e := newEnv(t)
			a := newMLA(e, C, c)
			p := e.pass(lens, c.rope)
			x := e.randn(1, p.N, C)
			y, err := a.Forward(p, x, false)
			if err != nil {
				t.Fatal(err)
			}
			got, want := e.get(y), refMLA(e, a, e.get(x), lens, 10000)
			for i := range want {
				if d := math.Abs(float64(got[i]) - want[i]); d > 1e-5+1e-5*math.Abs(want[i]) {
					t.Fatalf("y[%d] = %.7g, transformers' formulation gives %.7g", i, got[i], want[i])
				}
			}
		})
	}
}

// TestMLAGradients checks dx and every parameter gradient of the block against central
// differences, for every case's head layout.
func TestMLAGradients(t *testing.T) {
	const C = 10
	for _, c := range mlaCases {
		t.Run(c.String(), func(t *testing.T) {
			e := newEnv(t)
			a := newMLA(e, C, c)
			p := e.pass([]int{4, 3}, c.rope)
			checkGradients(t, e, p, e.randn(1, p.N, C), mlaLayer(a))
		})
	}
}

// TestMLAInsideAttention: an Attention whose Latent is set runs the latent block.
func TestMLAInsideAttention(t *testing.T) {
	e := newEnv(t)
	a := newMLA(e, 10, mlaCases[0])
	at := &Attention{Name: "attn", Latent: a}
	p := e.pass([]int{3}, 4)
	x := e.randn(1, p.N, 10)
	y1, err := at.Forward(p, x, false)
	if err != nil {
		t.Fatal(err)
	}
	y2, err := a.Forward(p, x, false)
	if err != nil {
		t.Fatal(err)
	}
	if fmt.Sprint(e.get(y1)) != fmt.Sprint(e.get(y2)) {
		t.Fatal("Attention with Latent set differs from the latent block")
	}
}
