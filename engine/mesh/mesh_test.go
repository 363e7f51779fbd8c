package mesh

import (
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/goccy/go-yaml"

	"github.com/halo-shell/halo-shell/engine/hf/config"
)

// dense is a small Llama-like shape: 8 heads, 4 KV heads, MLP width 48.
var dense = ModelShape{Hidden: 32, Intermediate: 48, Heads: 8, KVHeads: 4, HeadDim: 4, Layers: 2, Vocab: 64}

// moe is a small MoE shape: 8 experts.
var moe = ModelShape{Hidden: 32, Heads: 8, KVHeads: 4, HeadDim: 4, Layers: 2, Vocab: 64, Experts: 8, ExpertIntermediate: 16, TopK: 2, MoELayers: 2}

func TestParseDevices(t *testing.T) {
	for _, tc := range []struct {
		in   string
		kind string
		ids  []int
		back string
	}{
		{"cpu", "cpu", []int{0}, "cpu:1"},
		{"cpu:4", "cpu", []int{0, 1, 2, 3}, "cpu:4"},
		{"cuda", "cuda", []int{0}, "cuda:0"},
		{"cuda:0-7", "cuda", []int{0, 1, 2, 3, 4, 5, 6, 7}, "cuda:0-7"},
		{"cuda:0,2,5", "cuda", []int{0, 2, 5}, "cuda:0,2,5"},
		{" cuda:1-2,4 ", "cuda", []int{1, 2, 4}, "cuda:1,2,4"},
	} {
		d, err := ParseDevices(tc.in)
		if err != nil {
			t.Fatalf("%q: %v", tc.in, err)
		}
		if d.Kind != tc.kind || fmt.Sprint(d.IDs) != fmt.Sprint(tc.ids) || d.String() != tc.back {
			t.Errorf("%q: got %s %v (%s), want %s %v (%s)", tc.in, d.Kind, d.IDs, d, tc.kind, tc.ids, tc.back)
		}
	}
}

func TestParseDevicesErrors(t *testing.T) {
	for _, tc := range []struct{ in, want string }{
		{"gpu:2", `unknown kind "gpu"`},
		{"cpu:0", "number of simulated devices"},
		{"cpu:x", "number of simulated devices"},
		{"cpu:100000", "1 to 4096"},
		{"cuda:3-1", `"3-1" is not a device index`},
		{"cuda:0,0", "listed twice or out of order"},
		{"cuda:", `"" is not a device index`},
		{"cuda:0-99999", "is not a device index"},
	} {
		_, err := ParseDevices(tc.in)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%q: got %v, want an error containing %q", tc.in, err, tc.want)
		}
	}
}

func TestParseLayout(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want Layout
	}{
		{"ep=2 tp=2", Layout{EP: 2, TP: 2}},
		{"dp=2,fsdp,cp=2", Layout{DP: 2, FSDP: true, CP: 2}},
		{"fsdp=false tp=4 etp=4", Layout{TP: 4, ETP: 4}},
		{"", Layout{}},
		{"TP=2", Layout{TP: 2}},
	} {
		got, err := ParseLayout(tc.in)
		if err != nil {
			t.Fatalf("%q: %v", tc.in, err)
		}
		if got != tc.want {
			t.Errorf("%q: got %+v, want %+v", tc.in, got, tc.want)
		}
		back, err := ParseLayout(got.Norm(8).String())
		if err != nil || back.Norm(8) != got.Norm(8) {
			t.Errorf("%q: String round trip gave %+v, %v", tc.in, back, err)
		}
	}
}

func TestParseLayoutErrors(t *testing.T) {
	for _, tc := range []struct{ in, want string }{
		{"pp=2", `unknown key "pp"`},
		{"tp", "tp needs a degree"},
		{"tp=0", "tp needs a degree"},
		{"tp=-1", "tp needs a degree"},
		{"tp=2 tp=4", "tp is given twice"},
		{"fsdp=maybe", "fsdp=maybe"},
	} {
		_, err := ParseLayout(tc.in)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%q: got %v, want an error containing %q", tc.in, err, tc.want)
		}
	}
}

func TestConfigFromYAML(t *testing.T) {
	src := `
devices: cpu:8
fsdp: true
tensor_parallel_size: 2
context_parallel_size: 2
expert_parallel_size: 1
`
	var c Config
	if err := yaml.UnmarshalWithOptions([]byte(src), &c, yaml.Strict()); err != nil {
		t.Fatal(err)
	}
	d, l, err := c.Resolve()
	if err != nil {
		t.Fatal(err)
	}
	want := Layout{DP: 2, FSDP: true, TP: 2, CP: 2, EP: 1, ETP: 1}
	if d.Len() != 8 || l != want {
		t.Fatalf("got %v %+v, want 8 devices %+v", d, l, want)
	}
	if _, _, err := (Config{Devices: "cpu:2", TensorParallelSize: -1}).Resolve(); err == nil || !strings.Contains(err.Error(), "tensor_parallel_size") {
		t.Errorf("negative tp: got %v", err)
	}
}

func TestCheckRefusesWithRuleAndWorkingSuggestion(t *testing.T) {
	for _, tc := range []struct {
		name   string
		l      string
		n      int
		m      ModelShape
		seq    int
		rule   string
		detail string
	}{
		{"tp does not divide devices", "tp=4", 6, dense, 0, RuleDegrees, "does not divide the 6 devices"},
		{"dp disagrees with devices", "dp=3 tp=2", 4, dense, 0, RuleDegrees, "there are 4 devices"},
		{"tp does not divide kv heads", "tp=8", 8, dense, 0, RuleTPHeads, "4 key/value heads"},
		{"tp does not divide mlp width", "tp=4", 4, ModelShape{Heads: 8, KVHeads: 8, Intermediate: 50}, 0, RuleTPWidth, "intermediate_size 50"},
		{"full qk norm", "tp=2", 2, ModelShape{Heads: 8, KVHeads: 8, Intermediate: 48, QKNorm: config.QKNormProjection}, 0, RuleTPQKNorm, "whole projection"},
		{"latent attention", "tp=2", 2, ModelShape{Heads: 8, KVHeads: 8, Intermediate: 48, Latent: config.LatentShape{KVRank: 16, Rope: 4, V: 8}}, 0, RuleTPLatent, "latent attention"},
		{"etp with shared experts", "tp=2 etp=2", 2, ModelShape{Heads: 8, KVHeads: 8, Experts: 4, MoELayers: 1, ExpertIntermediate: 8, TopK: 2, SharedExpert: 16}, 0, RuleETP, "shared experts"},
		{"gpt-oss experts under tp", "tp=2", 2, ModelShape{Heads: 8, KVHeads: 8, Intermediate: 48, Experts: 4, TopK: 2, MoELayers: 2, ExpertIntermediate: 8, ExpertBias: true}, 0, RuleExpertBias, "gpt_oss"},
		{"gpt-oss experts under ep", "ep=2", 2, ModelShape{Heads: 8, KVHeads: 8, Intermediate: 48, Experts: 4, TopK: 2, MoELayers: 2, ExpertIntermediate: 8, ExpertBias: true}, 0, RuleExpertBias, "expert_parallel_size 2"},
		{"short convolutions under tp", "tp=2", 2, ModelShape{Heads: 8, KVHeads: 8, Intermediate: 48, Conv: config.ConvShape{Layers: []bool{true, false}, Taps: 3}}, 0, RuleTPConv, "in_proj"},
		{"short convolutions under cp", "cp=2", 2, ModelShape{Heads: 8, KVHeads: 8, Intermediate: 48, Conv: config.ConvShape{Layers: []bool{true, false}, Taps: 3}}, 16, RuleCPConv, "context chunks"},
		{"tp does not divide the global kv heads", "tp=2", 2, ModelShape{Heads: 8, KVHeads: 4, Intermediate: 48, Global: config.GlobalShape{Full: []bool{false, true}, HeadDim: 32, KVHeads: 1, KEqV: true}}, 0, RuleTPHeads, "num_global_key_value_heads"},
		{"gemma4 per-layer inputs under tp", "tp=2", 2, ModelShape{Heads: 8, KVHeads: 8, Intermediate: 48, Global: config.GlobalShape{Full: []bool{false, true}, HeadDim: 16, KVHeads: 8, PerLayerInput: 8, PerLayerVocab: 64}}, 0, RuleGemma4Parts, "per-layer input"},
		{"gemma4 shared kv layers under tp", "tp=2", 2, ModelShape{Heads: 8, KVHeads: 8, Intermediate: 48, Global: config.GlobalShape{Full: []bool{false, true, false}, HeadDim: 16, KVHeads: 8, SharedFrom: []int{-1, -1, 0}}}, 0, RuleGemma4Parts, "shared KV layers"},
		{"host decoder under tp", "tp=2", 2, ModelShape{Heads: 8, KVHeads: 1, Intermediate: 48, V4: config.V4Shape{HC: 2}}, 0, RuleHostDecoder, "tensor_parallel_size 2"},
		{"mixture of attention under tp", "tp=2", 2, ModelShape{Heads: 8, KVHeads: 4, Intermediate: 48, MoA: true}, 0, RuleMoA, "tensor_parallel_size 2"},
		{"mixture of attention under cp", "cp=2", 2, ModelShape{Heads: 8, KVHeads: 4, Intermediate: 48, MoA: true}, 16, RuleMoA, "context_parallel_size 2"},
		{"host decoder under ep", "ep=2", 2, ModelShape{Heads: 8, KVHeads: 1, Intermediate: 48, Experts: 4, TopK: 2, MoELayers: 1, ExpertIntermediate: 8, V4: config.V4Shape{HC: 2}}, 0, RuleHostDecoder, "expert_parallel_size 2"},
		{"gemma4 moe block under ep", "ep=2", 2, ModelShape{Heads: 8, KVHeads: 8, Intermediate: 48, Global: config.GlobalShape{Full: []bool{false, true}, HeadDim: 16, KVHeads: 8, BesideExperts: 4, BesideWidth: 8, BesideTopK: 2}}, 0, RuleGemma4Parts, "expert_parallel_size 2"},
		{"fused qkv", "tp=2", 2, ModelShape{Heads: 8, KVHeads: 8, Intermediate: 48, FusedQKV: true}, 0, RuleTPFused, "qkv_proj"},
		{"fused gate_up", "tp=2", 2, ModelShape{Heads: 8, KVHeads: 8, Intermediate: 48, FusedGateUp: true}, 0, RuleTPFused, "gate_up_proj"},
		{"cp needs even chunks", "cp=4", 4, dense, 12, RuleCPSeq, "multiple of 8"},
		{"ep on dense", "ep=2", 2, dense, 0, RuleEPExperts, "no experts"},
		{"ep does not divide experts", "ep=3", 3, moe, 0, RuleEPExperts, "divide the 8 experts"},
		{"ep beyond data ranks", "ep=4 tp=2", 4, moe, 0, RuleEPExperts, "dp × cp = 2"},
		{"etp differs from tp", "etp=2", 2, moe, 0, RuleETP, "equal tensor_parallel_size 1"},
		{"etp on dense", "etp=2 tp=2", 2, dense, 0, RuleETP, "needs a mixture-of-experts"},
		{"etp does not divide expert width", "tp=4 etp=4", 4, ModelShape{Heads: 8, KVHeads: 8, Experts: 8, ExpertIntermediate: 6, TopK: 2, MoELayers: 1}, 0, RuleETP, "expert width 6"},
		{"ep beyond dp with etp", "ep=4 tp=2 etp=2", 4, moe, 0, RuleEPExperts, "dp × cp = 2"},
		// The support matrix: valid degrees, combinations not offered.
		{"ep with cp", "ep=2 cp=2", 4, moe, 16, RuleSupport, "load-balancing loss"},
		{"etp with cp", "tp=2 etp=2 cp=2", 4, moe, 16, RuleSupport, "load-balancing loss"},
		{"cp on moe", "cp=2", 2, moe, 16, RuleSupport, "load-balancing loss"},
		{"cp+tp on moe", "cp=2 tp=2", 4, moe, 16, RuleSupport, "load-balancing loss"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			l, err := ParseLayout(tc.l)
			if err != nil {
				t.Fatal(err)
			}
			err = Check(l, tc.n, tc.m, tc.seq)
			var le *LayoutError
			if !errors.As(err, &le) {
				t.Fatalf("got %v, want a *LayoutError", err)
			}
			if le.Rule != tc.rule || !strings.Contains(le.Detail, tc.detail) {
				t.Fatalf("got rule %s (%s), want %s containing %q", le.Rule, le.Detail, tc.rule, tc.detail)
			}
			if !strings.Contains(err.Error(), "a layout that works") {
				t.Errorf("message does not propose a layout: %v", err)
			}
			if err := Check(le.Suggest, tc.n, tc.m, tc.seq); err != nil {
				t.Errorf("suggested layout %s does not pass: %v", le.Suggest, err)
			}
			if le.Suggest.FSDP != l.FSDP {
				t.Errorf("suggestion %s changed the fsdp choice", le.Suggest)
			}
		})
	}
}

func TestSuggestStaysClose(t *testing.T) {
	// tp=8 breaks the 4 KV heads; the nearest valid layout keeps as much tp as possible.
	got := Suggest(Layout{TP: 8}, 8, dense, 0)
	if got.TP != 4 || got.Size() != 8 {
		t.Errorf("got %s, want tp=4 on 8 devices", got)
	}
}

func TestCheckAcceptsSupportedLayouts(t *testing.T) {
	for _, tc := range []struct {
		l   string
		n   int
		m   ModelShape
		seq int
	}{
		{"", 1, dense, 16},
		{"", 8, dense, 16},
		{"fsdp", 4, dense, 16},
		{"tp=4", 4, dense, 16},
		{"cp=2", 2, dense, 16},
		{"cp=2 tp=2 fsdp", 8, dense, 16},
		{"dp=2 tp=2", 4, dense, 16},
		{"", 4, moe, 16},
		{"fsdp", 2, moe, 16},
		{"tp=2", 2, moe, 16},
		{"ep=2", 2, moe, 16},
		{"ep=8", 8, moe, 16},
		{"ep=2 fsdp", 4, moe, 16},
		{"ep=2 tp=2", 4, moe, 16},
		{"tp=2 etp=2", 2, moe, 16},
		{"ep=2 tp=2 etp=2", 4, moe, 16},
		{"ep=2 tp=2 etp=2 fsdp", 8, moe, 16},
	} {
		l, _ := ParseLayout(tc.l)
		if err := Check(l, tc.n, tc.m, tc.seq); err != nil {
			t.Errorf("%q on %d: %v", tc.l, tc.n, err)
		}
	}
}

func TestMeshCoordsAndGroups(t *testing.T) {
	m, err := New(Devices{Kind: "cpu", IDs: []int{0, 1, 2, 3, 4, 5, 6, 7}}, Layout{TP: 2, CP: 2}, dense, 16)
	if err != nil {
		t.Fatal(err)
	}
	for r := 0; r < 8; r++ {
		if got := m.Rank(m.Coord(r)); got != r {
			t.Fatalf("rank %d -> %+v -> %d", r, m.Coord(r), got)
		}
	}
	if c := m.Coord(5); c != (Coord{DP: 1, CP: 0, TP: 1}) {
		t.Errorf("coord of 5 = %+v", c)
	}
	for _, tc := range []struct {
		dim  Dim
		want string
	}{
		{DimTP, "[[0 1] [2 3] [4 5] [6 7]]"},
		{DimCP, "[[0 2] [1 3] [4 6] [5 7]]"},
		{DimDP, "[[0 4] [1 5] [2 6] [3 7]]"},
		{DimData, "[[0 2 4 6] [1 3 5 7]]"},
	} {
		g, err := m.Groups(tc.dim)
		if err != nil || fmt.Sprint(g) != tc.want {
			t.Errorf("%s groups = %v (%v), want %s", tc.dim, g, err, tc.want)
		}
	}
	// Expert groups: 8 ranks, tp=2, dp=4, ep=2. Data groups [0 2 4 6] and [1 3 5 7] are cut
	// into expert blocks of two consecutive data ranks; replicas share d mod 2.
	em, err := New(Devices{Kind: "cpu", IDs: []int{0, 1, 2, 3, 4, 5, 6, 7}}, Layout{TP: 2, EP: 2}, moe, 16)
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		dim  Dim
		want string
	}{
		{DimEP, "[[0 2] [1 3] [4 6] [5 7]]"},
		{DimEData, "[[0 4] [1 5] [2 6] [3 7]]"},
	} {
		g, err := em.Groups(tc.dim)
		if err != nil || fmt.Sprint(g) != tc.want {
			t.Errorf("%s groups = %v (%v), want %s", tc.dim, g, err, tc.want)
		}
	}
	if _, err := m.Groups("pp"); err == nil {
		t.Error("unknown dimension accepted")
	}
}

func FuzzParseLayout(f *testing.F) {
	for _, s := range []string{"ep=2 tp=2", "dp=2,fsdp", "fsdp=true cp=4", "tp=99999", "x", "tp==2"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		l, err := ParseLayout(s)
		if err != nil {
			return
		}
		for _, d := range []int{l.DP, l.TP, l.CP, l.EP, l.ETP} {
			if d < 0 || d > maxDevices {
				t.Fatalf("%q: degree %d out of range", s, d)
			}
		}
		_ = Check(l, 8, dense, 16)
	})
}

func FuzzParseDevices(f *testing.F) {
	for _, s := range []string{"cpu:4", "cuda:0-7", "cuda:0,2", "cuda:1-", "cpu"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		d, err := ParseDevices(s)
		if err != nil {
			return
		}
		if d.Len() < 1 || d.Len() > maxDevices {
			t.Fatalf("%q: %d devices", s, d.Len())
		}
		if _, err := ParseDevices(d.String()); err != nil {
			t.Fatalf("%q: String %q does not parse: %v", s, d, err)
		}
	})
}

func TestCheckAdaptersAllowsPlainDataParallelOnly(t *testing.T) {
	for _, c := range []struct {
		l  Layout
		n  int
		ok bool
	}{
		{Layout{}, 1, true},
		{Layout{DP: 1, TP: 1, CP: 1}, 1, true},
		{Layout{}, 2, true},
		{Layout{DP: 4}, 4, true},
		{Layout{FSDP: true}, 4, false},
		{Layout{TP: 2}, 2, false},
		{Layout{CP: 2}, 2, false},
		{Layout{EP: 2}, 2, false},
	} {
		err := CheckAdapters(c.l, c.n)
		if (err == nil) != c.ok || err != nil && !strings.Contains(err.Error(), "rule "+RuleAdapters) {
			t.Errorf("layout %+v on %d devices: %v", c.l, c.n, err)
		}
	}
}
