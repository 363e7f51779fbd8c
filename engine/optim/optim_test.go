package optim

import (
	"encoding/json"
	"fmt"
	"math"
	"os"
	"strings"
	"testing"

	"github.com/halo-shell/halo-shell/engine/backend"
	"github.com/halo-shell/halo-shell/engine/backend/cpu"
	"github.com/halo-shell/halo-shell/engine/tensor"
)

// goldens is testdata/torch_goldens.json, written by testdata/make_goldens.py.
type goldens struct {
	Schedules []struct {
		Kind      string    `json:"kind"`
		LR        float64   `json:"lr"`
		Warmup    int       `json:"warmup"`
		Total     int       `json:"total"`
		NumCycles float64   `json:"num_cycles"`
		MinLR     float64   `json:"min_lr"`
		MinLRRate float64   `json:"min_lr_rate"`
		LRs       []float64 `json:"lrs"`
	} `json:"schedules"`
	AdamW []struct {
		LR         float64     `json:"lr"`
		Betas      []float64   `json:"betas"`
		Eps        float64     `json:"eps"`
		WD         float64     `json:"wd"`
		P0         []float32   `json:"p0"`
		Grads      [][]float32 `json:"grads"`
		Trajectory []struct {
			Param    []float64 `json:"param"`
			ExpAvg   []float64 `json:"exp_avg"`
			ExpAvgSq []float64 `json:"exp_avg_sq"`
		} `json:"trajectory"`
	} `json:"adamw"`
	Clip []struct {
		MaxNorm float64     `json:"max_norm"`
		Grads   [][]float32 `json:"grads"`
		Norm    float64     `json:"norm"`
		Clipped [][]float64 `json:"clipped"`
	} `json:"clip"`
}

func loadGoldens(t *testing.T) goldens {
	raw, err := os.ReadFile("testdata/torch_goldens.json")
	if err != nil {
		t.Fatal(err)
	}
	var g goldens
	if err := json.Unmarshal(raw, &g); err != nil {
		t.Fatal(err)
	}
	return g
}

func newCPU(t testing.TB) *cpu.Backend {
	b := cpu.New(cpu.Options{Workers: 2})
	t.Cleanup(func() { b.Close() })
	return b
}

func upload(t testing.TB, b backend.Backend, x []float32, dt tensor.DType) tensor.Tensor {
	t.Helper()
	ts, err := backend.FromFloat32(b, x, dt, len(x))
	if err != nil {
		t.Fatal(err)
	}
	return ts
}

func download(t testing.TB, b backend.Backend, x tensor.Tensor) []float32 {
	t.Helper()
	v, err := backend.ToFloat32(b, x)
	if err != nil {
		t.Fatal(err)
	}
	return v
}

func TestSchedulesMatchTransformers(t *testing.T) {
	g := loadGoldens(t)
	if len(g.Schedules) < 8 {
		t.Fatalf("only %d schedule goldens", len(g.Schedules))
	}
	for _, c := range g.Schedules {
		s := Schedule{Kind: c.Kind, LR: c.LR, WarmupSteps: c.Warmup, TotalSteps: c.Total, NumCycles: c.NumCycles, MinLR: c.MinLR, MinLRRate: c.MinLRRate}
		t.Run(fmt.Sprintf("%s_w%d_t%d", c.Kind, c.Warmup, c.Total), func(t *testing.T) {
			if err := s.Validate(); err != nil {
				t.Fatal(err)
			}
			for step, want := range c.LRs {
				if got := s.At(step); math.Abs(got-want) > 1e-12+1e-9*want {
					t.Fatalf("lr at step %d = %.12g, transformers %.12g", step, got, want)
				}
			}
		})
	}
}

func TestScheduleValidateNamesTheProblem(t *testing.T) {
	for _, tc := range []struct {
		s    Schedule
		want string
	}{
		{Schedule{Kind: "polynomial", LR: 1}, "polynomial"},
		{Schedule{Kind: "cosine", LR: 1}, "max_steps"},
		{Schedule{Kind: "linear", LR: 1, TotalSteps: 10, WarmupSteps: -1}, "warmup_steps"},
		{Schedule{Kind: "constant", LR: math.NaN()}, "learning_rate"},
		{Schedule{Kind: "cosine_with_min_lr", LR: 1, TotalSteps: 5}, "min_lr"},
	} {
		if err := tc.s.Validate(); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%+v: error %v, want it to mention %q", tc.s, err, tc.want)
		}
	}
}

func TestAdamWMatchesTorch(t *testing.T) {
	g := loadGoldens(t)
	for ci, c := range g.AdamW {
		for _, hideFused := range []bool{false, true} {
			t.Run(fmt.Sprintf("case%d_hostfallback%v", ci, hideFused), func(t *testing.T) {
				var b backend.Backend = newCPU(t)
				if hideFused {
					b = plainBackend{b}
				}
				p := upload(t, b, c.P0, tensor.F32)
				grad := upload(t, b, make([]float32, len(c.P0)), tensor.F32)
				o, err := NewAdamW(b, []Param{{Name: "w", Value: p, Grad: grad}}, Config{Beta1: c.Betas[0], Beta2: c.Betas[1], Eps: c.Eps, WeightDecay: c.WD})
				if err != nil {
					t.Fatal(err)
				}
				if onHost := o.fused == nil; onHost != hideFused {
					t.Fatalf("updates on the host: %v, want %v", onHost, hideFused)
				}
				for step, gr := range c.Grads {
					raw, _ := tensor.EncodeFloat32(tensor.F32, gr)
					if err := b.Upload(grad, raw); err != nil {
						t.Fatal(err)
					}
					if err := o.Step(c.LR, 1); err != nil {
						t.Fatal(err)
					}
					want := c.Trajectory[step]
					got := download(t, b, p)
					_, st, err := o.Export()
					if err != nil {
						t.Fatal(err)
					}
					m, _ := tensor.DecodeFloat32(tensor.F32, st[0].Data)
					v, _ := tensor.DecodeFloat32(tensor.F32, st[1].Data)
					for i := range got {
						if math.Abs(float64(got[i])-want.Param[i]) > 2e-7+1e-6*math.Abs(want.Param[i]) ||
							math.Abs(float64(m[i])-want.ExpAvg[i]) > 1e-6*math.Abs(want.ExpAvg[i])+1e-9 ||
							math.Abs(float64(v[i])-want.ExpAvgSq[i]) > 1e-6*math.Abs(want.ExpAvgSq[i])+1e-12 {
							t.Fatalf("step %d element %d: param %.9g m %.9g v %.9g; torch %.9g %.9g %.9g",
								step+1, i, got[i], m[i], v[i], want.Param[i], want.ExpAvg[i], want.ExpAvgSq[i])
						}
					}
				}
			})
		}
	}
}

// plainBackend drops the backend's optional capabilities, forcing the host fallback.
type plainBackend struct{ backend.Backend }

func (plainBackend) Optional() backend.Optional { return backend.Optional{} }

func TestAdamWFirstStepByHand(t *testing.T) {
	// After one step m = (1-b1) g, v = (1-b2) g^2, so the bias-corrected update is
	// lr * g / (|g| + eps), after decay p *= 1 - lr*wd (skipped for NoDecay parameters).
	b := newCPU(t)
	p0 := []float32{1, -2, 0.5, 3}
	g := []float32{0.5, -4, 0, 1e-3}
	const lr, wd, eps = 0.1, 0.01, 1e-8
	for _, noDecay := range []bool{false, true} {
		p := upload(t, b, p0, tensor.F32)
		o, err := NewAdamW(b, []Param{{Name: "p", Value: p, Grad: upload(t, b, g, tensor.F32), NoDecay: noDecay}}, Config{WeightDecay: wd, Eps: eps})
		if err != nil {
			t.Fatal(err)
		}
		if err := o.Step(lr, 1); err != nil {
			t.Fatal(err)
		}
		got := download(t, b, p)
		for i := range p0 {
			want := float64(p0[i])
			if !noDecay {
				want *= 1 - lr*wd
			}
			gi := float64(g[i])
			want -= lr * gi / (math.Abs(gi) + eps)
			if math.Abs(float64(got[i])-want) > 1e-6 {
				t.Errorf("noDecay=%v element %d: %v, want %v", noDecay, i, got[i], want)
			}
		}
	}
}

func TestAdamWMasterWeightsForBF16Model(t *testing.T) {
	// bf16 model weights with fp32 masters follow the fp32 trajectory; the model copy is the
	// master rounded to nearest.
	b := newCPU(t)
	n := 64
	p0, g := make([]float32, n), make([]float32, n)
	for i := range p0 {
		p0[i] = tensor.BF16ToF32(tensor.F32ToBF16(float32(math.Sin(float64(i)))))
		g[i] = float32(math.Cos(float64(3 * i)))
	}
	ref := upload(t, b, p0, tensor.F32)
	model := upload(t, b, p0, tensor.BF16)
	o32, _ := NewAdamW(b, []Param{{Name: "w", Value: ref, Grad: upload(t, b, g, tensor.F32)}}, Config{WeightDecay: 0.1})
	o16, err := NewAdamW(b, []Param{{Name: "w", Value: model, Grad: upload(t, b, g, tensor.BF16)}}, Config{WeightDecay: 0.1})
	if err != nil {
		t.Fatal(err)
	}
	for s := 0; s < 5; s++ {
		if err := o32.Step(1e-3, 1); err != nil {
			t.Fatal(err)
		}
		if err := o16.Step(1e-3, 1); err != nil {
			t.Fatal(err)
		}
	}
	want := download(t, b, ref)
	got := download(t, b, model)
	_, st, _ := o16.Export()
	if len(st) != 3 || st[2].Name != "w.master" {
		t.Fatalf("state of bf16 model = %d tensors, want exp_avg, exp_avg_sq, master", len(st))
	}
	master, _ := tensor.DecodeFloat32(tensor.F32, st[2].Data)
	for i := range want {
		// bf16 gradients differ from the fp32 ones by at most 2^-8 relative.
		if math.Abs(float64(master[i]-want[i])) > 1e-4 {
			t.Fatalf("master[%d] = %v, fp32 run %v", i, master[i], want[i])
		}
		if got[i] != tensor.BF16ToF32(tensor.F32ToBF16(master[i])) {
			t.Fatalf("model[%d] = %v is not the master %v rounded to bf16", i, got[i], master[i])
		}
	}
}

// runBF16 trains n identical parameters from 1.0 with a constant gradient for steps steps and
// returns the final weights.
func runBF16(t *testing.T, b backend.Backend, mode Mode, seed uint64, n, steps int, lr float64) []float32 {
	t.Helper()
	return runBF16Config(t, b, Config{Mode: mode, Seed: seed}, n, steps, lr)
}

func runBF16Config(t *testing.T, b backend.Backend, cfg Config, n, steps int, lr float64) []float32 {
	t.Helper()
	p0, g := make([]float32, n), make([]float32, n)
	for i := range p0 {
		p0[i], g[i] = 1, 0.25
	}
	dt := tensor.BF16
	if cfg.Mode == MasterF32 {
		dt = tensor.F32
	}
	p := upload(t, b, p0, dt)
	o, err := NewAdamW(b, []Param{{Name: "w", Value: p, Grad: upload(t, b, g, dt)}}, cfg)
	if err != nil {
		t.Fatal(err)
	}
	for s := 0; s < steps; s++ {
		if err := o.Step(lr, 1); err != nil {
			t.Fatal(err)
		}
	}
	return download(t, b, p)
}

func mean(x []float32) float64 {
	var s float64
	for _, v := range x {
		s += float64(v)
	}
	return s / float64(len(x))
}

func TestAdamWBF16IsDeterministicAndTracksFP32InMean(t *testing.T) {
	b := newCPU(t)
	const n, steps, lr = 4096, 40, 1e-3 // each update (1e-3) is far below bf16's spacing at 1.0 (2^-7)
	a1 := runBF16(t, b, BF16, 42, n, steps, lr)
	a2 := runBF16(t, b, BF16, 42, n, steps, lr)
	for i := range a1 {
		if a1[i] != a2[i] {
			t.Fatalf("same seed, element %d: %v then %v", i, a1[i], a2[i])
		}
	}
	a3 := runBF16(t, b, BF16, 43, n, steps, lr)
	same := 0
	for i := range a1 {
		if a1[i] == a3[i] {
			same++
		}
	}
	if same == n {
		t.Fatal("a different seed gave identical weights")
	}
	ref := runBF16(t, b, MasterF32, 0, 1, steps, lr)[0]
	moved := 1 - float64(ref) // about steps*lr
	if d := math.Abs(mean(a1) - float64(ref)); d > 0.05*moved {
		t.Fatalf("mean bf16 weight %.6f, fp32 AdamW %.6f: off by %.2g (%.0f%% of the distance moved)", mean(a1), ref, d, 100*d/moved)
	}
	// Every stored value is exactly representable in bf16 (6 bytes per parameter holds).
	for i, v := range a1 {
		if tensor.BF16ToF32(tensor.F32ToBF16(v)) != v {
			t.Fatalf("weight %d = %v is not a bf16 value", i, v)
		}
	}
}

// TestAdamWBF16NearestLosesSmallUpdates checks the round-to-nearest variant (torch.optim.AdamW's
// rule for bf16 parameters): an update far below half a bf16 unit of the weight is lost at every
// step, so the weights stay exactly where they started, and the result does not depend on the
// seed; a large enough update moves every weight by whole bf16 units.
func TestAdamWBF16NearestLosesSmallUpdates(t *testing.T) {
	b := newCPU(t)
	const n, steps = 256, 20
	small := runBF16Config(t, b, Config{Mode: BF16, Seed: 1, Nearest: true}, n, steps, 1e-3)
	other := runBF16Config(t, b, Config{Mode: BF16, Seed: 2, Nearest: true}, n, steps, 1e-3)
	for i := range small {
		if small[i] != 1 || other[i] != 1 {
			t.Fatalf("weight %d moved to %v (seed 1) / %v (seed 2): updates of 1e-3 are under half of bf16's 2^-7 at 1.0 and must be lost", i, small[i], other[i])
		}
	}
	stochastic := runBF16Config(t, b, Config{Mode: BF16, Seed: 1}, n, steps, 1e-3)
	if mean(stochastic) >= 1 {
		t.Fatalf("stochastic rounding kept no update (mean %v): the two modes are not distinguished", mean(stochastic))
	}
	big := runBF16Config(t, b, Config{Mode: BF16, Nearest: true}, n, 1, 1e-2)
	for i, v := range big {
		if v != big[0] || v >= 1 || tensor.BF16ToF32(tensor.F32ToBF16(v)) != v {
			t.Fatalf("weight %d = %v after an update of 1e-2: want one common bf16 value below 1", i, v)
		}
	}
}

func TestAdamWBF16RefusesF32Weights(t *testing.T) {
	b := newCPU(t)
	p := upload(t, b, []float32{1, 2}, tensor.F32)
	_, err := NewAdamW(b, []Param{{Name: "w", Value: p, Grad: p}}, Config{Mode: BF16})
	if err == nil || !strings.Contains(err.Error(), `"w"`) {
		t.Fatalf("error = %v, want one naming parameter \"w\"", err)
	}
}

func TestClipMatchesTorch(t *testing.T) {
	g := loadGoldens(t)
	b := newCPU(t)
	for ci, c := range g.Clip {
		var ts []tensor.Tensor
		for _, gr := range c.Grads {
			ts = append(ts, upload(t, b, gr, tensor.F32))
		}
		norm, err := GradNorm(b, ts)
		if err != nil {
			t.Fatal(err)
		}
		if math.Abs(norm-c.Norm) > 1e-6*c.Norm {
			t.Fatalf("case %d: norm %v, torch %v", ci, norm, c.Norm)
		}
		coef := ClipCoef(norm, c.MaxNorm)
		for k, gr := range c.Grads {
			for i, v := range gr {
				got := float64(v * float32(coef))
				if math.Abs(got-c.Clipped[k][i]) > 1e-7+1e-6*math.Abs(c.Clipped[k][i]) {
					t.Fatalf("case %d grad %d[%d]: clipped %v, torch %v", ci, k, i, got, c.Clipped[k][i])
				}
			}
		}
	}
	if ClipCoef(0.5, 1) != 1 || ClipCoef(100, 0) != 1 || !math.IsNaN(ClipCoef(math.NaN(), 1)) {
		t.Fatal("ClipCoef: no clipping below max_norm, none when disabled, NaN for a NaN norm")
	}
}

func TestStateExportImportResumesExactly(t *testing.T) {
	for _, mode := range []Mode{MasterF32, BF16} {
		t.Run(mode.String(), func(t *testing.T) {
			b := newCPU(t)
			dt := tensor.BF16
			p0 := []float32{0.5, -1, 2, 0.25, 3}
			g := []float32{0.1, -0.2, 0.3, 0.05, -1}
			mk := func() (*AdamW, tensor.Tensor) {
				p := upload(t, b, p0, dt)
				o, err := NewAdamW(b, []Param{{Name: "layer.w", Value: p, Grad: upload(t, b, g, dt)}}, Config{Mode: mode, Seed: 7, WeightDecay: 0.1})
				if err != nil {
					t.Fatal(err)
				}
				return o, p
			}
			a, pa := mk()
			for s := 0; s < 3; s++ {
				must(t, a.Step(1e-2, 1))
			}
			step, st, err := a.Export()
			must(t, err)
			c, pc := mk()
			raw := make([]byte, pa.Bytes())
			must(t, b.Download(raw, pa))
			must(t, b.Upload(pc, raw))
			must(t, c.Import(step, st))
			for s := 0; s < 2; s++ {
				must(t, a.Step(1e-2, 0.5))
				must(t, c.Step(1e-2, 0.5))
			}
			x, y := download(t, b, pa), download(t, b, pc)
			for i := range x {
				if x[i] != y[i] {
					t.Fatalf("element %d: uninterrupted %v, resumed %v", i, x[i], y[i])
				}
			}
			// Refusals name the problem.
			bad := append([]StateTensor(nil), st...)
			bad[0].Name = "other.exp_avg"
			if err := c.Import(step, bad); err == nil || !strings.Contains(err.Error(), "layer.w.exp_avg") {
				t.Fatalf("import with a renamed tensor: %v", err)
			}
			bad = append([]StateTensor(nil), st...)
			bad[1].Data = bad[1].Data[:2]
			if err := c.Import(step, bad); err == nil || !strings.Contains(err.Error(), "bytes") {
				t.Fatalf("import with a short tensor: %v", err)
			}
		})
	}
}

func TestStepRejectsNonFiniteScale(t *testing.T) {
	b := newCPU(t)
	p := upload(t, b, []float32{1}, tensor.F32)
	o, _ := NewAdamW(b, []Param{{Name: "w", Value: p, Grad: upload(t, b, []float32{1}, tensor.F32)}}, Config{})
	for _, s := range []float64{0, math.NaN(), math.Inf(1)} {
		if err := o.Step(1e-3, s); err == nil {
			t.Errorf("Step with gradient scale %v succeeded", s)
		}
	}
	if o.Steps() != 0 {
		t.Fatalf("refused steps were counted: %d", o.Steps())
	}
}

func must(t testing.TB, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

func TestStateIsOneAllocationPerKind(t *testing.T) {
	b := newCPU(t)
	w := upload(t, b, make([]float32, 12), tensor.BF16)
	bias := upload(t, b, make([]float32, 4), tensor.F32)
	before := b.MemStats().Allocated
	o, err := NewAdamW(b, []Param{
		{Name: "w", Value: w, Grad: upload(t, b, make([]float32, 12), tensor.BF16)},
		{Name: "b", Value: bias, Grad: upload(t, b, make([]float32, 4), tensor.F32), NoDecay: NoDecayByShape(bias.Shape())},
	}, Config{WeightDecay: 0.1})
	if err != nil {
		t.Fatal(err)
	}
	grads := int64(12*2 + 4*4)
	// exp_avg + exp_avg_sq for 16 parameters in fp32, plus an fp32 master for the 12 bf16 ones.
	if got, want := b.MemStats().Allocated-before-grads, int64(2*16*4+12*4); got != want {
		t.Fatalf("optimizer state uses %d bytes, want %d", got, want)
	}
	must(t, o.Step(1e-2, 1))
	_, st, err := o.Export()
	must(t, err)
	var names []string
	for _, s := range st {
		names = append(names, s.Name)
	}
	if strings.Join(names, ",") != "w.exp_avg,w.exp_avg_sq,w.master,b.exp_avg,b.exp_avg_sq" {
		t.Fatalf("state names %v", names)
	}
	o.Free()
	if got := b.MemStats().Allocated - before - grads; got != 0 {
		t.Fatalf("%d bytes still allocated after Free", got)
	}
	if !NoDecayByShape(tensor.Shape{8}) || NoDecayByShape(tensor.Shape{8, 8}) {
		t.Fatal("NoDecayByShape: 1-D parameters are excluded, matrices are not")
	}
}

func TestAdamWBF16StateIsFourBytesPerParameter(t *testing.T) {
	// bf16 weights (2 bytes, the model's own) + bf16 exp_avg and exp_avg_sq (4 bytes): 6 bytes
	// per parameter, no fp32 master.
	b := newCPU(t)
	w := upload(t, b, make([]float32, 1000), tensor.BF16)
	g := upload(t, b, make([]float32, 1000), tensor.BF16)
	before := b.MemStats().Allocated
	o, err := NewAdamW(b, []Param{{Name: "w", Value: w, Grad: g}}, Config{Mode: BF16})
	if err != nil {
		t.Fatal(err)
	}
	defer o.Free()
	if got := b.MemStats().Allocated - before; got != 4*1000 {
		t.Fatalf("adamw-bf16 state: %d bytes for 1000 parameters, want 4000", got)
	}
	_, st, err := o.Export()
	must(t, err)
	for _, s := range st {
		if s.DType != tensor.BF16 || strings.HasSuffix(s.Name, ".master") {
			t.Fatalf("state tensor %s is %s", s.Name, s.DType)
		}
	}
}
