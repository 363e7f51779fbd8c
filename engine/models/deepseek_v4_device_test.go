package models

import (
	"math"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/halo-shell/halo-shell/engine/backend"
	"github.com/halo-shell/halo-shell/engine/hf/config"
	"github.com/halo-shell/halo-shell/engine/nn"
	"github.com/halo-shell/halo-shell/engine/tensor"
)

// dsv4Batch packs documents long enough for the compressed layers' entries (rate 4 and 8 in
// the fixture), a short one without any, and a few ignored targets.
func dsv4Batch() Batch {
	docs := [][]int32{
		{5, 17, 230, 44, 8, 91, 3, 120, 77, 61, 250, 12, 33, 9, 140, 200, 18, 7, 66, 101, 45, 2, 88, 19},
		{4, 99, 150},
		{13, 31, 60, 1, 247, 38, 72, 110, 5, 16, 27},
	}
	b := rowsBatch(docs)
	b.Targets[2], b.Targets[30] = backend.IgnoreIndex, backend.IgnoreIndex
	return b
}

// dsv4Run loads the deepseek_v4 fixture (or, with preset, builds the tiny preset) in dt with HALO_DSV4_PATH=path and returns the
// per-token log-probabilities, the loss sum and every parameter's gradient after one
// ForwardBackward of dsv4Batch.
func dsv4Run(t *testing.T, path string, dt tensor.DType, preset bool) ([]float32, float64, map[string][]float32) {
	t.Helper()
	t.Setenv("HALO_DSV4_PATH", path)
	var m *Model
	var err error
	if preset {
		// The tiny preset with four streams and clamps that hold, from random weights.
		c, err := config.Preset("deepseek_v4", "tiny")
		if err != nil {
			t.Fatal(err)
		}
		if c, err = ApplyOverrides(c, []string{"hc_mult=4", "swiglu_limit=1.0", "initializer_range=0.2"}); err != nil {
			t.Fatal(err)
		}
		if m, err = New(c, newCPU(), Options{DType: dt}); err != nil {
			t.Fatal(err)
		}
		if err := m.InitRandom(5); err != nil {
			t.Fatal(err)
		}
	} else if m, err = Load(filepath.Join("testdata", "parity", "deepseek_v4"), newCPU(), Options{DType: dt}); err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	if got := m.hostOnDevice(); got != (path == "device") {
		t.Fatalf("HALO_DSV4_PATH=%s: the device path runs %v (the CPU backend has DeepSeek-V4's ops: %v)", path, got, m.b.Optional().DSV4 != nil)
	}
	b := dsv4Batch()
	lp, err := m.TokenLogprobs(b)
	if err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	if err := m.ZeroGrads(); err != nil {
		t.Fatal(err)
	}
	sum, _, err := m.ForwardBackward(b, 1)
	if err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	grads := map[string][]float32{}
	for _, s := range m.Specs {
		if grads[s.Name], err = m.GradFloat32(s.Name); err != nil {
			t.Fatal(err)
		}
	}
	return lp, sum, grads
}

// TestDSV4DeviceMatchesHostTape: deepseek_v4 through the backend's ops (nn.DSV4Device, here
// the CPU backend's, with the fused sink attention and with its composition from matrix
// products) computes what the float64 host tape computes, on packed documents with
// sliding, compressed sparse and heavily compressed layers, hash and score routing: the same
// log-probabilities, loss and gradient of every parameter in float32, and within bf16's
// rounding with bf16 parameters and activations.
func TestDSV4DeviceMatchesHostTape(t *testing.T) {
	for _, tc := range []struct {
		dt tensor.DType
		// lpTol bounds each log-probability's difference (in bf16 their mean); gTol each
		// gradient's, relative to
		// its tensor's largest (0: not checked tensor by tensor); l2Tol the whole gradient's
		// relative L2 difference. In bf16 the activations and their gradients are rounded on
		// the device path and not on the host tape, and a router may choose other experts
		// for a token, so only the whole gradient is bounded.
		lpTol, gTol, l2Tol float64
		preset             bool
		attention          string // HALO_DSV4_ATTENTION
	}{
		{tensor.F32, 2e-5, 2e-4, 1e-5, false, "fused"}, {tensor.F32, 2e-5, 2e-4, 1e-5, false, "dense"},
		{tensor.BF16, 0.03, 0, 0.15, false, "fused"}, {tensor.BF16, 0.03, 0, 0.15, false, "dense"},
		{tensor.F32, 2e-5, 2e-4, 1e-5, true, "fused"}, {tensor.F32, 2e-5, 2e-4, 1e-5, true, "dense"},
	} {
		name := tc.dt.String() + "/" + tc.attention
		if tc.preset {
			name += "/tiny-4-streams"
		}
		t.Run(name, func(t *testing.T) {
			t.Setenv("HALO_DSV4_ATTENTION", tc.attention)
			lpH, sumH, gH := dsv4Run(t, "host", tc.dt, tc.preset)
			lpD, sumD, gD := dsv4Run(t, "device", tc.dt, tc.preset)
			worst, mean := 0.0, 0.0
			for i := range lpH {
				d := math.Abs(float64(lpH[i] - lpD[i]))
				worst, mean = math.Max(worst, d), mean+d/float64(len(lpH))
			}
			if tc.dt == tensor.F32 && worst > tc.lpTol {
				t.Errorf("log-probabilities differ by up to %.2g (tolerance %.2g)", worst, tc.lpTol)
			}
			if tc.dt == tensor.BF16 && mean > tc.lpTol {
				// In bf16 a token whose expert or indexer choice flips on a rounding moves
				// by more than rounding alone: the mean is bounded, not each token.
				t.Errorf("log-probabilities differ by %.2g on average, up to %.2g (tolerance %.2g on average)", mean, worst, tc.lpTol)
			}
			if math.Abs(sumH-sumD) > tc.lpTol*float64(len(lpH)) {
				t.Errorf("loss sum %.6f on the device, %.6f on the host tape", sumD, sumH)
			}
			nonzero := 0
			num, den := 0.0, 0.0
			for name, h := range gH {
				for i := range h {
					e := float64(h[i] - gD[name][i])
					num, den = num+e*e, den+float64(h[i])*float64(h[i])
				}
			}
			if l2 := math.Sqrt(num / den); l2 > tc.l2Tol {
				t.Errorf("the whole gradient differs by %.3g in relative L2 (tolerance %.2g)", l2, tc.l2Tol)
			}
			for name, h := range gH {
				d := gD[name]
				scale, diff := 0.0, 0.0
				for i := range h {
					scale = math.Max(scale, math.Abs(float64(h[i])))
					diff = math.Max(diff, math.Abs(float64(h[i]-d[i])))
				}
				if scale > 0 {
					nonzero++
				}
				if tc.gTol > 0 && diff > tc.gTol*scale+1e-7 {
					t.Errorf("%s: gradients differ by %.3g (largest %.3g)", name, diff, scale)
				}
			}
			if nonzero < len(gH)/2 {
				t.Errorf("only %d of %d gradients are nonzero", nonzero, len(gH))
			}
			t.Logf("%s: log-probability differences up to %.2g, %.2g on average", tc.dt, worst, mean)
		})
	}
}

// TestDSV4DevicePathSwitch: HALO_DSV4_PATH picks the decoder: under auto the CPU backend takes
// the host tape and another backend with DeepSeek-V4's ops the device path; none without them.
func TestDSV4DevicePathSwitch(t *testing.T) {
	for _, tc := range []struct {
		value, backend string
		ops, want      bool
	}{
		{"auto", "cpu", true, false}, {"auto", "cuda", true, true}, {"auto", "cuda", false, false},
		{"device", "cpu", true, true}, {"host", "cuda", true, false}, {"device", "cuda", false, false},
	} {
		t.Setenv("HALO_DSV4_PATH", tc.value)
		m := &Model{b: namedBackend{newCPU(), tc.backend, tc.ops}}
		if got := m.hostOnDevice(); got != tc.want {
			t.Errorf("HALO_DSV4_PATH=%s on %s (ops %v): device %v, want %v", tc.value, tc.backend, tc.ops, got, tc.want)
		}
	}
}

// namedBackend is a backend under another name, with or without DeepSeek-V4's ops.
type namedBackend struct {
	backend.Backend
	name string
	ops  bool
}

func (n namedBackend) Name() string { return n.name }

func (n namedBackend) Optional() backend.Optional {
	o := n.Backend.Optional()
	if !n.ops {
		o.DSV4 = nil
	}
	return o
}

// TestDSV4DeviceFreesItsTensors: a training pass through the device decoder leaves the
// backend's allocation where it found it (the tape releases each op's values and gradients
// once its backward has run, and the rest at the end), with either sink attention.
func TestDSV4DeviceFreesItsTensors(t *testing.T) {
	for _, attention := range []string{"fused", "dense"} {
		t.Run(attention, func(t *testing.T) {
			t.Setenv("HALO_DSV4_PATH", "device")
			t.Setenv("HALO_DSV4_ATTENTION", attention)
			b := newCPU()
			m, err := Load(filepath.Join("testdata", "parity", "deepseek_v4"), b, Options{})
			if err != nil {
				t.Fatal(err)
			}
			defer m.Close()
			if _, _, err := m.ForwardBackward(dsv4Batch(), 1); err != nil {
				t.Fatal(err)
			}
			before := b.MemStats().Allocated
			b.ResetPeak()
			if _, _, err := m.ForwardBackward(dsv4Batch(), 1); err != nil {
				t.Fatal(err)
			}
			st := b.MemStats()
			if st.Allocated != before {
				t.Errorf("a pass left %d bytes allocated beyond the %d before it", st.Allocated-before, before)
			}
			if st.Peak <= before {
				t.Errorf("peak %d bytes, not above the %d before the pass: the pass allocated nothing", st.Peak, before)
			}
		})
	}
}

// TestDSV4RefusesManyStreamsOffTheCPU: a backend other than the CPU refuses deepseek_v4 with
// more than 8 hyper-connection streams when the model is built, naming hc_mult; the CPU
// backend builds it (its host tape takes any).
func TestDSV4RefusesManyStreamsOffTheCPU(t *testing.T) {
	c, err := config.Preset("deepseek_v4", "tiny")
	if err != nil {
		t.Fatal(err)
	}
	if c, err = ApplyOverrides(c, []string{"hc_mult=9"}); err != nil {
		t.Fatal(err)
	}
	if _, err := New(c, namedBackend{newCPU(), "cuda", true}, Options{}); err == nil || !strings.Contains(err.Error(), "hc_mult 9") {
		t.Errorf("9 streams on cuda: %v, want a refusal naming hc_mult", err)
	}
	m, err := New(c, newCPU(), Options{})
	if err != nil {
		t.Fatalf("9 streams on the CPU: %v", err)
	}
	m.Close()
}

// TestDSV4Generates: deepseek_v4 generates by re-running each row (no KV cache), on the host
// tape and through the device decoder alike: greedy tokens are the argmax of the full
// sequence's logits at each position (the causal prefix's), both paths agree, a stop id ends
// the row (included), OnToken streams every token, and a seeded sampled run repeats itself.
func TestDSV4Generates(t *testing.T) {
	prompt := []int32{5, 17, 230, 44, 8, 91, 3, 120, 77}
	var greedy [][]int32
	for _, path := range []string{"host", "device"} {
		t.Run(path, func(t *testing.T) {
			t.Setenv("HALO_DSV4_PATH", path)
			m, err := Load(filepath.Join("testdata", "parity", "deepseek_v4"), newCPU(), Options{})
			if err != nil {
				t.Fatal(err)
			}
			defer m.Close()
			var streamed []int32
			got, err := m.Generate(prompt, GenerateOptions{MaxNewTokens: 6, OnToken: func(id int32) error {
				streamed = append(streamed, id)
				return nil
			}})
			if err != nil {
				t.Fatal(err)
			}
			if len(got) != 6 || !slices.Equal(streamed, got) {
				t.Fatalf("generated %v, streamed %v", got, streamed)
			}
			var tape nn.HostTape
			_, dec, err := m.hostTapeDecoder(&tape)
			if err != nil {
				t.Fatal(err)
			}
			seq := append(slices.Clone(prompt), got...)
			ids := make([]int, len(seq))
			for i, id := range seq {
				ids[i] = int(id)
			}
			l, err := dec.Logits(&tape, ids)
			if err != nil {
				t.Fatal(err)
			}
			for k, id := range got {
				row := l.V[(len(prompt)-1+k)*l.C : (len(prompt)+k)*l.C]
				best := 0
				for j, v := range row {
					if v > row[best] {
						best = j
					}
				}
				if int(id) != best {
					t.Errorf("new token %d is %d, the argmax of its position's logits is %d", k, id, best)
				}
			}
			greedy = append(greedy, got)
			stop, err := m.Generate(prompt, GenerateOptions{MaxNewTokens: 6, StopIDs: []int32{got[2]}})
			if err != nil {
				t.Fatal(err)
			}
			if want := got[:slices.Index(got, got[2])+1]; !slices.Equal(stop, want) {
				t.Errorf("stopping at %d: %v, want %v", got[2], stop, want)
			}
			o := GenerateOptions{MaxNewTokens: 5, Temperature: 1, Seed: 7}
			a, err := m.Generate(prompt, o)
			if err != nil {
				t.Fatal(err)
			}
			b, err := m.Generate(prompt, o)
			if err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(a, b) {
				t.Errorf("seeded sampling gave %v, then %v", a, b)
			}
		})
	}
	if len(greedy) == 2 && !slices.Equal(greedy[0], greedy[1]) {
		t.Errorf("greedy tokens on the host tape %v, through the device decoder %v", greedy[0], greedy[1])
	}
}

// TestJetMoeGenerates: jetmoe, whose mixture of attention heads keeps no KV cache, generates
// by re-running each row: every greedy token is the argmax of NextLogits over its prefix, a
// stop id ends the row, and two prompts batched decode as they do alone.
func TestJetMoeGenerates(t *testing.T) {
	m, err := Load(filepath.Join("testdata", "parity", "jetmoe"), newCPU(), Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	prompts := [][]int32{{3, 17, 40, 8, 21}, {9, 1, 30}}
	got, err := m.GenerateBatch(prompts, BatchGenerateOptions{GenerateOptions: GenerateOptions{MaxNewTokens: 4}})
	if err != nil {
		t.Fatal(err)
	}
	for r, p := range prompts {
		seq := slices.Clone(p)
		for k, id := range got[r] {
			l, err := m.NextLogits(seq)
			if err != nil {
				t.Fatal(err)
			}
			if want := Argmax(l); id != want {
				t.Errorf("row %d, new token %d: %d, the argmax of the prefix's logits is %d", r, k, id, want)
			}
			seq = append(seq, id)
		}
		alone, err := m.Generate(p, GenerateOptions{MaxNewTokens: 4})
		if err != nil {
			t.Fatal(err)
		}
		if !slices.Equal(alone, got[r]) {
			t.Errorf("row %d alone %v, batched %v", r, alone, got[r])
		}
	}
	stop, err := m.Generate(prompts[0], GenerateOptions{MaxNewTokens: 4, StopIDs: []int32{got[0][1]}})
	if err != nil {
		t.Fatal(err)
	}
	if want := got[0][:slices.Index(got[0], got[0][1])+1]; !slices.Equal(stop, want) {
		t.Errorf("stopping at %d: %v, want %v", got[0][1], stop, want)
	}
}
