package backend_test

import (
	"encoding/json"
	"math"
	"os"
	"strings"
	"testing"

	"github.com/halo-shell/halo-shell/engine/backend"
	"github.com/halo-shell/halo-shell/engine/backend/cpu"
	"github.com/halo-shell/halo-shell/engine/tensor"
)

// ropeGolden is one case of testdata/rope_goldens.json, written by
// engine/optim/testdata/make_goldens.py from transformers' LlamaRotaryEmbedding.
type ropeGolden struct {
	Name      string         `json:"name"`
	Error     string         `json:"error"`
	Theta     float64        `json:"theta"`
	HeadDim   int            `json:"head_dim"`
	Partial   float64        `json:"partial"`
	MaxPos    int            `json:"max_pos"`
	Params    map[string]any `json:"params"`
	Seq       int            `json:"seq"`
	InvFreq   []float64      `json:"inv_freq"`
	Scaling   float64        `json:"attention_scaling"`
	Positions []int32        `json:"positions"`
	Cos       [][]float64    `json:"cos"`
	Sin       [][]float64    `json:"sin"`
}

func (g ropeGolden) config() backend.RoPEConfig {
	num := func(k string) float64 {
		v, _ := g.Params[k].(float64)
		return v
	}
	typ, _ := g.Params["rope_type"].(string)
	return backend.RoPEConfig{
		Type: typ, Theta: g.Theta, HeadDim: g.HeadDim, PartialRotaryFactor: g.Partial,
		MaxPositionEmbeddings: g.MaxPos, Factor: num("factor"),
		OriginalMaxPositionEmbeddings: int(num("original_max_position_embeddings")),
		LowFreqFactor:                 num("low_freq_factor"), HighFreqFactor: num("high_freq_factor"),
		BetaFast: num("beta_fast"), BetaSlow: num("beta_slow"), MScale: num("mscale"), MScaleAllDim: num("mscale_all_dim"),
		AttentionFactor: num("attention_factor"),
	}
}

func TestRoPEConfigMatchesTransformers(t *testing.T) {
	raw, err := os.ReadFile("testdata/rope_goldens.json")
	if err != nil {
		t.Fatal(err)
	}
	var file struct {
		Cases []ropeGolden `json:"cases"`
	}
	if err := json.Unmarshal(raw, &file); err != nil {
		t.Fatal(err)
	}
	if len(file.Cases) < 9 {
		t.Fatalf("only %d golden cases", len(file.Cases))
	}
	b := cpu.New(cpu.Options{Workers: 2})
	defer b.Close()
	for _, g := range file.Cases {
		t.Run(g.Name, func(t *testing.T) {
			if g.Error != "" {
				t.Fatalf("golden generation failed: %s", g.Error)
			}
			inv, scale, err := g.config().Compute(g.Seq)
			if err != nil {
				t.Fatal(err)
			}
			if len(inv) != len(g.InvFreq) {
				t.Fatalf("inv_freq has %d entries, transformers %d", len(inv), len(g.InvFreq))
			}
			for i := range inv {
				if d := math.Abs(float64(inv[i]) - g.InvFreq[i]); d > 2e-6*g.InvFreq[i] {
					t.Fatalf("inv_freq[%d] = %.9g, transformers %.9g", i, inv[i], g.InvFreq[i])
				}
			}
			if math.Abs(float64(scale)-g.Scaling) > 1e-6 {
				t.Fatalf("attention scaling %v, transformers %v", scale, g.Scaling)
			}
			// Rotating x = [1..1 (first half), 0..0] yields cos in the first half and sin in the second.
			hd := g.HeadDim
			half := len(inv)
			n := len(g.Positions)
			x := make([]float32, n*hd)
			for p := 0; p < n; p++ {
				for i := 0; i < half; i++ {
					x[p*hd+i] = 1
				}
			}
			X, err := backend.FromFloat32(b, x, tensor.F32, n, hd)
			if err != nil {
				t.Fatal(err)
			}
			pos, _ := backend.FromInt32(b, g.Positions, n)
			invT, _ := backend.FromFloat32(b, inv, tensor.F32, half)
			if err := b.RoPE(X, X, backend.RoPEArgs{Positions: pos, InvFreq: invT, Heads: 1, HeadDim: hd, AttentionScaling: scale}); err != nil {
				t.Fatal(err)
			}
			got, _ := backend.ToFloat32(b, X)
			for p := 0; p < n; p++ {
				for i := 0; i < half; i++ {
					c, s := float64(got[p*hd+i]), float64(got[p*hd+half+i])
					if math.Abs(c-g.Cos[p][i]) > 2e-5 || math.Abs(s-g.Sin[p][i]) > 2e-5 {
						t.Fatalf("position %d dim %d: cos,sin = %v,%v; transformers %v,%v", g.Positions[p], i, c, s, g.Cos[p][i], g.Sin[p][i])
					}
				}
			}
		})
	}
}

func TestRoPEConfigRejectsBadSettings(t *testing.T) {
	for _, tc := range []struct {
		name string
		c    backend.RoPEConfig
	}{
		{"zero theta", backend.RoPEConfig{HeadDim: 8}},
		{"odd rotary dim", backend.RoPEConfig{Theta: 1e4, HeadDim: 6, PartialRotaryFactor: 0.5}},
		{"linear without factor", backend.RoPEConfig{Type: "linear", Theta: 1e4, HeadDim: 8}},
		{"llama3 without original context", backend.RoPEConfig{Type: "llama3", Theta: 1e4, HeadDim: 8, Factor: 8, LowFreqFactor: 1, HighFreqFactor: 4}},
		{"unknown type", backend.RoPEConfig{Type: "longrope", Theta: 1e4, HeadDim: 8}},
		{"huge head_dim", backend.RoPEConfig{Theta: 1e4, HeadDim: 1 << 40}},
		{"NaN factor", backend.RoPEConfig{Type: "linear", Theta: 1e4, HeadDim: 8, Factor: math.NaN()}},
	} {
		if _, _, err := tc.c.Compute(16); err == nil {
			t.Errorf("%s: Compute succeeded", tc.name)
		}
	}
}

// FuzzRoPEConfig: any config values (as read from a config.json) give either an error or finite
// positive frequencies and a finite scaling; never a panic or a huge allocation.
func FuzzRoPEConfig(f *testing.F) {
	f.Add(uint8(0), 10000.0, 64, 1.0, 0.0, 2048, 0, 0.0, 0.0, 0.0, 0.0, 16)
	f.Add(uint8(3), 500000.0, 128, 1.0, 8.0, 131072, 8192, 1.0, 4.0, 0.0, 0.0, 100)
	f.Add(uint8(4), 10000.0, 64, 0.5, 4.0, 4096, 1024, 0.0, 0.0, 32.0, 1.0, 10)
	f.Add(uint8(2), 10000.0, 64, 1.0, 2.0, 64, 0, 0.0, 0.0, 0.0, 0.0, 1000)
	types := []string{"default", "linear", "dynamic", "llama3", "yarn", "longrope", ""}
	f.Fuzz(func(t *testing.T, typ uint8, theta float64, hd int, partial, factor float64, maxPos, origMax int,
		low, high, betaFast, betaSlow float64, seq int) {
		c := backend.RoPEConfig{Type: types[int(typ)%len(types)], Theta: theta, HeadDim: hd, PartialRotaryFactor: partial,
			Factor: factor, MaxPositionEmbeddings: maxPos, OriginalMaxPositionEmbeddings: origMax,
			LowFreqFactor: low, HighFreqFactor: high, BetaFast: betaFast, BetaSlow: betaSlow}
		inv, scale, err := c.Compute(seq)
		if err != nil {
			return
		}
		if len(inv) != c.RotaryDim()/2 {
			t.Fatalf("%d frequencies for rotary dim %d", len(inv), c.RotaryDim())
		}
		if math.IsNaN(float64(scale)) || math.IsInf(float64(scale), 0) {
			t.Fatalf("attention scaling %v", scale)
		}
		for i, v := range inv {
			if math.IsNaN(float64(v)) || v <= 0 {
				t.Fatalf("inv_freq[%d] = %v for %+v", i, v, c)
			}
		}
	})
}

// longrope's inverse frequencies and attention factor, computed by hand from transformers'
// formula: inv[i] = 1 / (ext[i] * theta^(2i/R)), ext the short factors up to the original
// context and the long ones past it, factor sqrt(1 + ln(max/orig) / ln(orig)).
func TestLongRoPE(t *testing.T) {
	c := backend.RoPEConfig{Type: "longrope", Theta: 100, HeadDim: 8, PartialRotaryFactor: 0.5,
		MaxPositionEmbeddings: 64, OriginalMaxPositionEmbeddings: 16,
		ShortFactor: []float64{1, 2}, LongFactor: []float64{4, 8}}
	if !c.DependsOnLength() || c.LongRoPE(16) || !c.LongRoPE(17) {
		t.Fatalf("longrope switches past the original context: %v %v", c.LongRoPE(16), c.LongRoPE(17))
	}
	wantScale := math.Sqrt(1 + math.Log(4)/math.Log(16))
	for _, tc := range []struct {
		seq  int
		want []float64
	}{{16, []float64{1 / 1.0, 1 / (2 * 10.0)}}, {17, []float64{1 / 4.0, 1 / (8 * 10.0)}}} {
		inv, scale, err := c.Compute(tc.seq)
		if err != nil {
			t.Fatal(err)
		}
		for i, w := range tc.want {
			if math.Abs(float64(inv[i])-w) > 1e-7 {
				t.Errorf("seq %d: inv_freq[%d] = %v, want %v", tc.seq, i, inv[i], w)
			}
		}
		if math.Abs(float64(scale)-wantScale) > 1e-6 {
			t.Errorf("seq %d: attention factor %v, want %v", tc.seq, scale, wantScale)
		}
	}
	// ShortFactorsOnly (phimoe): the short factors past the original context too, a table
	// that no longer depends on the length.
	so := c
	so.ShortFactorsOnly = true
	if so.DependsOnLength() || so.LongRoPE(17) {
		t.Errorf("ShortFactorsOnly: DependsOnLength %v, LongRoPE(17) %v; want neither", so.DependsOnLength(), so.LongRoPE(17))
	}
	inv, _, err := so.Compute(17)
	if err != nil {
		t.Fatal(err)
	}
	if want := []float64{1 / 1.0, 1 / (2 * 10.0)}; math.Abs(float64(inv[0])-want[0]) > 1e-7 || math.Abs(float64(inv[1])-want[1]) > 1e-7 {
		t.Errorf("ShortFactorsOnly: inv_freq at 17 tokens %v, want the short factors' %v", inv, want)
	}
	c.LongFactor = c.LongFactor[:1]
	if _, _, err := c.Compute(1); err == nil || !strings.Contains(err.Error(), "2 entries") {
		t.Errorf("short long_factor: %v", err)
	}
}

// TestProportionalRoPE checks Gemma 4's proportional RoPE against values worked by hand: the
// first floor(0.5 * 8 / 2) = 2 pairs of an 8-wide head rotate at 100^(-2i/8) / factor, the
// other two not at all, and the rotation spans the whole head.
func TestProportionalRoPE(t *testing.T) {
	c := backend.RoPEConfig{Type: "proportional", Theta: 100, HeadDim: 8, PartialRotaryFactor: 0.5, Factor: 2}
	inv, scale, err := c.Compute(1)
	if err != nil {
		t.Fatal(err)
	}
	want := []float32{0.5, float32(math.Pow(100, -0.25) / 2), 0, 0}
	if len(inv) != len(want) || scale != 1 || c.RotaryDim() != 8 {
		t.Fatalf("inv_freq %v (scale %v, rotary dim %d), want %v, 1, 8", inv, scale, c.RotaryDim(), want)
	}
	for i := range want {
		if math.Abs(float64(inv[i]-want[i])) > 1e-7 {
			t.Errorf("inv_freq[%d] = %v, want %v", i, inv[i], want[i])
		}
	}
	if _, _, err := (backend.RoPEConfig{Type: "proportional", Theta: 100, HeadDim: 8, PartialRotaryFactor: 0.1}).Compute(1); err == nil {
		t.Error("a factor that rotates no pair was accepted")
	}
}
