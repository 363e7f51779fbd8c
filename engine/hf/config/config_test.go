package config

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"flag"
	"io/fs"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"
)

var update = flag.Bool("update", false, "rewrite testdata/golden from this package's output")

// hubFiles are the config.json files as published on the Hub (testdata/hub); for each,
// testdata/transformers/saved holds what transformers 5.17 writes after loading it and
// testdata/transformers/full its resolved to_dict() (made by testdata/make_reference.py).
func hubFiles(t testing.TB) []string {
	t.Helper()
	paths, err := filepath.Glob("testdata/hub/*.json")
	if err != nil || len(paths) == 0 {
		t.Fatalf("no testdata/hub files: %v", err)
	}
	var names []string
	for _, p := range paths {
		names = append(names, strings.TrimSuffix(filepath.Base(p), ".json"))
	}
	return names
}

// needReference skips a test whose transformers reference has not been made yet (a file or
// family added since make_reference.py last ran).
func needReference(t *testing.T, path string) {
	t.Helper()
	if _, err := os.Stat(path); errors.Is(err, fs.ErrNotExist) {
		t.Skipf("no transformers reference %s yet: run testdata/make_reference.py with transformers 5.17", path)
	}
}

func readFile(t testing.TB, path string) []byte {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func mustParse(t testing.TB, path string) *Config {
	t.Helper()
	c, err := Parse(readFile(t, path), path)
	if err != nil {
		t.Fatalf("Parse: %v", err)
	}
	return c
}

func mustMarshal(t testing.TB, c *Config) []byte {
	t.Helper()
	b, err := c.MarshalJSON()
	if err != nil {
		t.Fatalf("MarshalJSON: %v", err)
	}
	return b
}

func diffLines(a, b []byte) string {
	al, bl := strings.Split(string(a), "\n"), strings.Split(string(b), "\n")
	for i := 0; i < len(al) || i < len(bl); i++ {
		var x, y string
		if i < len(al) {
			x = al[i]
		}
		if i < len(bl) {
			y = bl[i]
		}
		if x != y {
			return "line " + itoa(i+1) + ":\n  got:  " + x + "\n  want: " + y
		}
	}
	return ""
}

func itoa(i int) string { b, _ := json.Marshal(i); return string(b) }

// A 4.x Hub file, parsed and written, gives byte for byte what transformers 5.17 save_pretrained
// writes after loading the same file; the 5.x file transformers wrote parses to the same bytes.
func TestWritesWhatTransformersWrites(t *testing.T) {
	for _, name := range hubFiles(t) {
		t.Run(name, func(t *testing.T) {
			needReference(t, "testdata/transformers/saved/"+name+".json")
			want := readFile(t, "testdata/transformers/saved/"+name+".json")
			got := mustMarshal(t, mustParse(t, "testdata/hub/"+name+".json"))
			if !bytes.Equal(got, want) {
				t.Errorf("4.x file: written config differs from transformers' at %s", diffLines(got, want))
			}
			got5 := mustMarshal(t, mustParse(t, "testdata/transformers/saved/"+name+".json"))
			if !bytes.Equal(got5, want) {
				t.Errorf("5.x file: written config differs from transformers' at %s", diffLines(got5, want))
			}
		})
	}
}

// Every key the family understands resolves to the value transformers resolves (its to_dict()),
// including defaults of absent keys and rope_parameters.
func TestResolvedValuesMatchTransformers(t *testing.T) {
	for _, name := range hubFiles(t) {
		t.Run(name, func(t *testing.T) {
			needReference(t, "testdata/transformers/full/"+name+".json")
			c := mustParse(t, "testdata/hub/"+name+".json")
			var full map[string]json.RawMessage
			if err := json.Unmarshal(readFile(t, "testdata/transformers/full/"+name+".json"), &full); err != nil {
				t.Fatal(err)
			}
			f := c.Family()
			written, err := c.toPy()
			if err != nil {
				t.Fatal(err)
			}
			checked := 0
			for _, k := range append(append([]string{}, f.Keys...), f.Optional...) {
				raw, ok := full[k]
				if !ok {
					if slices.Contains(f.Keys, k) {
						t.Errorf("transformers has no %q for %s", k, c.ModelType)
					}
					continue
				}
				want, _ := decodePy(raw)
				if !pyEqual(written[k], want) {
					t.Errorf("%s: got %s, transformers %s", k, pyString(written[k]), raw)
				}
				checked++
			}
			// written holds rope_parameters as the family writes it: one dictionary, or one per
			// layer type (Family.RopePerLayerType).
			rope := written["rope_parameters"]
			want, _ := decodePy(full["rope_parameters"])
			if !pyEqual(rope, want) {
				t.Errorf("rope_parameters: got %s, transformers %s", pyString(rope), full["rope_parameters"])
			}
			if checked < 15 {
				t.Errorf("only %d keys compared", checked)
			}
		})
	}
}

func pyString(v pyValue) string {
	b, err := encodePy(v)
	if err != nil {
		return err.Error()
	}
	return strings.TrimSpace(string(b))
}

func pyEqual(a, b pyValue) bool { return pyString(a) == pyString(b) }

// New gives the values of transformers' config classes built without arguments, and writes
// what their save_pretrained writes.
func TestDefaultsMatchTransformers(t *testing.T) {
	for _, mt := range Families() {
		t.Run(mt, func(t *testing.T) {
			c, err := New(mt)
			if err != nil {
				t.Fatal(err)
			}
			path := "testdata/transformers/defaults_saved/" + mt + ".json"
			if _, err := os.Stat(path); errors.Is(err, fs.ErrNotExist) {
				t.Skipf("no transformers reference for %s yet: run testdata/make_reference.py with transformers 5.17 to write %s", mt, path)
			}
			want := readFile(t, path)
			// Without Validate: a class's defaults need not describe a buildable model
			// (glm4_moe's head_dim 4096 // 96 = 42 rotates 21 dims).
			obj, err := c.toPy()
			if err != nil {
				t.Fatal(err)
			}
			got, err := encodePy(obj)
			if err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(got, want) {
				t.Errorf("defaults differ from transformers' at %s", diffLines(got, want))
			}
		})
	}
}

// The benchmark presets hold the values of the models' Hub config.json files.
func TestPresetsMatchHubFiles(t *testing.T) {
	for _, tc := range []struct{ family, preset, hub string }{
		{"qwen3", "qwen3-0.6b", "qwen3-0.6b"},
		{"llama", "llama-3.2-1b", "llama-3.2-1b"},
		{"qwen3_moe", "qwen3-moe-30b-a3b", "qwen3-30b-a3b"},
		{"qwen2", "qwen2.5-0.5b", "qwen2.5-0.5b"},
		{"mistral", "mistral-7b", "mistral-7b-v0.1"},
		{"mixtral", "mixtral-8x7b", "mixtral-8x7b-v0.1"},
		{"olmoe", "olmoe-1b-7b", "olmoe-1b-7b-0924"},
	} {
		t.Run(tc.preset, func(t *testing.T) {
			p, err := Preset(tc.family, tc.preset)
			if err != nil {
				t.Fatal(err)
			}
			hub := mustParse(t, "testdata/hub/"+tc.hub+".json")
			hub.extra = slices.DeleteFunc(hub.extra, func(kv rawKey) bool { return !kv.understood })
			got, want := mustMarshal(t, p), mustMarshal(t, hub)
			if !bytes.Equal(got, want) {
				t.Errorf("preset differs from the Hub file at %s", diffLines(got, want))
			}
		})
	}
}

// Our own written output for every preset, kept as goldens (go test -update rewrites them).
func TestPresetGoldens(t *testing.T) {
	for _, mt := range Families() {
		names, err := Presets(mt)
		if err != nil {
			t.Fatal(err)
		}
		if !slices.Contains(names, "tiny") {
			t.Errorf("%s has no tiny preset", mt)
		}
		for _, name := range names {
			t.Run(mt+"/"+name, func(t *testing.T) {
				c, err := Preset(mt, name)
				if err != nil {
					t.Fatal(err)
				}
				got := mustMarshal(t, c)
				path := filepath.Join("testdata", "golden", mt+"."+name+".json")
				if *update {
					if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
						t.Fatal(err)
					}
					if err := os.WriteFile(path, got, 0o644); err != nil {
						t.Fatal(err)
					}
				}
				if want := readFile(t, path); !bytes.Equal(got, want) {
					t.Errorf("output differs from %s at %s", path, diffLines(got, want))
				}
				back, err := Parse(got, path)
				if err != nil {
					t.Fatalf("written preset does not parse: %v", err)
				}
				if again := mustMarshal(t, back); !bytes.Equal(again, got) {
					t.Errorf("round trip changed the file at %s", diffLines(again, got))
				}
			})
		}
	}
}

func TestTinyPresetShape(t *testing.T) {
	for _, mt := range Families() {
		c, err := Preset(mt, "tiny")
		if err != nil {
			t.Fatal(err)
		}
		if c.IsLatent() {
			continue // TestLatentTinyShape
		}
		s := c.Shape()
		f := c.Family()
		want := Shape{ModelType: mt, Vocab: TinyVocab, Hidden: 64, Intermediate: c.IntermediateSize, Layers: 2,
			Heads: 4, KVHeads: 2, HeadDim: 16, QKVBias: c.QKVBias(), OBias: c.OProjBias(), QKNorm: c.QKNormKind(),
			Tied: c.TieWordEmbeddings, Norms: f.Norms, FusedQKV: f.FusedQKV, FusedGateUp: f.FusedGateUp,
			Sinks: f.Sinks, ExpertBias: f.ExpertBias, HeadGate: f.HeadGate, MoA: f.MoA}
		if c.IsMoE() {
			want.Experts, want.ExpertIntermediate, want.TopK, want.MoELayers = 8, 32, 2, 2
			if mt == "glm4_moe" {
				want.MoELayers = 1 // the first layer is dense (first_k_dense_replace)
				want.RouterBias = true
			}
			if f.SharedExpert != nil {
				want.SharedExpert, want.SharedExpertGate = f.SharedExpert(c)
			}
			want.RouterBias = want.RouterBias || f.RouterBiasParam // ernie4_5_moe's moe_statics
			want.RouterBiasParam = f.RouterBiasParam
		}
		want.NormBias = f.LayerNorm // phimoe's LayerNorms
		// phimoe's LayerNorms and cohere2_moe's (without bias, rms_norm_eps null) centre.
		want.NormCenter = f.LayerNorm || mt == "cohere2_moe"
		if f.AttnOutputGate {
			// qwen3_next, qwen3_5_moe_text: 4 layers alternating linear and full attention.
			want.Layers, want.MoELayers, want.AttnOutputGate = 4, 4, true
			want.Linear = LinearShape{Layers: 2, KeyHeads: 2, ValueHeads: 4, KeyDim: 16, ValueDim: 16, Conv: 4}
		}
		switch mt {
		case "gemma4_text":
			// A sliding layer of 16-wide heads, then a full layer of 32-wide heads over one
			// shared key/value projection.
			want.Global = GlobalShape{Full: []bool{false, true}, HeadDim: 32, KVHeads: 1, KEqV: true}
		case "lfm2_moe":
			// conv, attention, conv; the first layer dense.
			want.Layers, want.MoELayers, want.RouterBias = 3, 2, true
			want.Conv = ConvShape{Layers: []bool{true, false, true}, Taps: 3, Bias: true}
		case "deepseek_v4":
			// One layer of each attention kind over one shared key/value head, every layer
			// routed (the first by hash), 2 hyper-connection streams.
			want.Layers, want.KVHeads, want.MoELayers, want.RouterBias = 3, 1, 3, true
			want.V4 = V4Shape{QRank: 24, OGroups: 2, ORank: 16, HC: 2,
				LayerTypes: []string{DSV4Sliding, DSV4CSA, DSV4HCA}, Rates: []int{0, 4, 8},
				IndexHeads: 2, IndexDim: 8, Hash: []bool{true, false, false}}
		}
		if !reflect.DeepEqual(s, want) {
			t.Errorf("%s tiny: shape %+v, want %+v", mt, s, want)
		}
		rot := 16
		if c.Rope.PartialRotaryFactor != 0 {
			rot = int(16 * c.Rope.PartialRotaryFactor) // glm4, glm4_moe rotate half of each head
		}
		kv := 32
		if mt == "deepseek_v4" {
			kv = 16 // one key/value head
		}
		if s.QDim() != 64 || s.KVDim() != kv || c.RotaryDim() != rot {
			t.Errorf("%s tiny: q %d, kv %d, rotary %d; want 64, %d, %d", mt, s.QDim(), s.KVDim(), c.RotaryDim(), kv, rot)
		}
	}
}

func TestPresetErrors(t *testing.T) {
	if _, err := Preset("qwen3", "qwen3-999b"); err == nil || !strings.Contains(err.Error(), "presets: qwen3-0.6b, tiny") {
		t.Errorf("unknown preset: %v", err)
	}
	if _, err := Preset("gpt2", "tiny"); !errors.Is(err, ErrUnsupportedModelType) {
		t.Errorf("unknown family: %v", err)
	}
}

// TestDerivedShape checks the structure each family's rules give the Hub files: sizes, which
// biases and q/k norms exist, and the mixture-of-experts layout.
func TestDerivedShape(t *testing.T) {
	for _, tc := range []struct {
		file  string
		shape Shape
	}{
		{"qwen2.5-0.5b", Shape{ModelType: "qwen2", Vocab: 151936, Hidden: 896, Intermediate: 4864, Layers: 24, Heads: 14, KVHeads: 2, HeadDim: 64,
			Tied: true, QKVBias: true}},
		{"qwen3-0.6b", Shape{ModelType: "qwen3", Vocab: 151936, Hidden: 1024, Intermediate: 3072, Layers: 28, Heads: 16, KVHeads: 8, HeadDim: 128,
			Tied: true, QKNorm: QKNormPerHead}},
		{"llama-3.2-1b", Shape{ModelType: "llama", Vocab: 128256, Hidden: 2048, Intermediate: 8192, Layers: 16, Heads: 32, KVHeads: 8, HeadDim: 64,
			Tied: true}},
		{"mistral-7b-v0.1", Shape{ModelType: "mistral", Vocab: 32000, Hidden: 4096, Intermediate: 14336, Layers: 32, Heads: 32, KVHeads: 8, HeadDim: 128}},
		{"qwen3-30b-a3b", Shape{ModelType: "qwen3_moe", Vocab: 151936, Hidden: 2048, Intermediate: 6144, Layers: 48, Heads: 32, KVHeads: 4, HeadDim: 128,
			QKNorm: QKNormPerHead, Experts: 128, ExpertIntermediate: 768, TopK: 8, MoELayers: 48}},
		{"mixtral-8x7b-v0.1", Shape{ModelType: "mixtral", Vocab: 32000, Hidden: 4096, Intermediate: 14336, Layers: 32, Heads: 32, KVHeads: 8, HeadDim: 128,
			Experts: 8, ExpertIntermediate: 14336, TopK: 2, MoELayers: 32}},
		{"olmoe-1b-7b-0924", Shape{ModelType: "olmoe", Vocab: 50304, Hidden: 2048, Intermediate: 1024, Layers: 16, Heads: 16, KVHeads: 16, HeadDim: 128,
			QKNorm: QKNormProjection, Experts: 64, ExpertIntermediate: 1024, TopK: 8, MoELayers: 16}},
	} {
		t.Run(tc.file, func(t *testing.T) {
			c := mustParse(t, "testdata/hub/"+tc.file+".json")
			s := c.Shape()
			if !reflect.DeepEqual(s, tc.shape) {
				t.Errorf("shape %+v\nwant  %+v", s, tc.shape)
			}
			if c.QKVBias() != s.QKVBias || c.OProjBias() != s.OBias || c.QKNormKind() != s.QKNorm || c.KVHeads() != s.KVHeads {
				t.Errorf("config accessors disagree with the shape: qkv bias %v, o bias %v, qk norm %v, kv heads %d",
					c.QKVBias(), c.OProjBias(), c.QKNormKind(), c.KVHeads())
			}
		})
	}
}

func TestMixtralRenormalisesTopK(t *testing.T) {
	c := mustParse(t, "testdata/hub/mixtral-8x7b-v0.1.json")
	if !c.NormTopKProb {
		t.Error("mixtral must renormalise top-k weights")
	}
	if o := mustParse(t, "testdata/hub/olmoe-1b-7b-0924.json"); o.NormTopKProb {
		t.Error("olmoe-1b-7b sets norm_topk_prob false")
	}
}

func TestIsMoELayer(t *testing.T) {
	moe := func(mt string, edit func(*Config)) *Config {
		c, err := Preset(mt, "tiny")
		if err != nil {
			t.Fatal(err)
		}
		c.NumHiddenLayers = 6
		edit(c)
		if err := c.Validate(); err != nil {
			t.Fatal(err)
		}
		return c
	}
	for _, tc := range []struct {
		name string
		c    *Config
		want []bool
	}{
		{"qwen3_moe every layer", moe("qwen3_moe", func(c *Config) {}), []bool{true, true, true, true, true, true}},
		{"qwen3_moe step 2", moe("qwen3_moe", func(c *Config) { c.DecoderSparseStep = 2 }), []bool{false, true, false, true, false, true}},
		{"qwen3_moe step 3, mlp_only 2", moe("qwen3_moe", func(c *Config) { c.DecoderSparseStep = 3; c.MLPOnlyLayers = []int{2} }), []bool{false, false, false, false, false, true}},
		{"qwen3_moe mlp_only 0 1", moe("qwen3_moe", func(c *Config) { c.MLPOnlyLayers = []int{0, 1} }), []bool{false, false, true, true, true, true}},
		{"mixtral", moe("mixtral", func(c *Config) {}), []bool{true, true, true, true, true, true}},
		{"olmoe", moe("olmoe", func(c *Config) {}), []bool{true, true, true, true, true, true}},
		{"qwen3 dense", moe("qwen3", func(c *Config) {}), []bool{false, false, false, false, false, false}},
	} {
		var got []bool
		for i := 0; i < tc.c.NumHiddenLayers; i++ {
			got = append(got, tc.c.IsMoELayer(i))
		}
		if !slices.Equal(got, tc.want) {
			t.Errorf("%s: %v, want %v", tc.name, got, tc.want)
		}
		if tc.c.IsMoELayer(-1) || tc.c.IsMoELayer(6) {
			t.Errorf("%s: out-of-range layer reported as MoE", tc.name)
		}
	}
}

func TestSlidingLayers(t *testing.T) {
	c := mustParse(t, "testdata/hub/qwen3-0.6b-sliding.json")
	for i := 0; i < c.NumHiddenLayers; i++ {
		if got, want := c.IsSlidingLayer(i), i >= 20; got != want {
			t.Errorf("qwen3 sliding layer %d: %v", i, got)
		}
	}
	if c.SlidingWindow != 4096 {
		t.Errorf("sliding window %d", c.SlidingWindow)
	}
	m := mustParse(t, "testdata/hub/mistral-7b-v0.1.json")
	if !m.IsSlidingLayer(0) || !m.IsSlidingLayer(31) || m.SlidingWindow != 4096 {
		t.Error("mistral slides on every layer")
	}
	q := mustParse(t, "testdata/hub/qwen2.5-0.5b.json")
	if q.SlidingWindow != 0 || q.IsSlidingLayer(23) {
		t.Error("qwen2.5 with use_sliding_window false has no sliding window")
	}
	// A derived layer_types follows later edits; one given explicitly is kept.
	c.NumHiddenLayers = 22
	if err := c.Validate(); err != nil {
		t.Fatal(err)
	}
	if len(c.LayerTypes) != 22 || c.LayerTypes[21] != SlidingAttention {
		t.Errorf("derived layer_types not re-derived: %v", c.LayerTypes)
	}
	// A 5.x file's layer_types that is what the rule gives follows edits too.
	d := mustParse(t, "testdata/transformers/saved/qwen3-0.6b-sliding.json")
	d.MaxWindowLayers = 10
	if err := d.Validate(); err != nil || !d.IsSlidingLayer(10) || d.IsSlidingLayer(9) {
		t.Errorf("layer_types written by transformers not re-derived: %v %v", err, d.LayerTypes)
	}
	e, err := Parse([]byte(`{"model_type":"qwen3","num_hidden_layers":3,"use_sliding_window":true,
		"layer_types":["sliding_attention","full_attention","sliding_attention"]}`), "inline")
	if err != nil {
		t.Fatal(err)
	}
	if !e.IsSlidingLayer(0) || e.IsSlidingLayer(1) {
		t.Errorf("explicit layer_types not honoured: %v", e.LayerTypes)
	}
	e.NumHiddenLayers = 2
	if err := e.Validate(); err == nil || !strings.Contains(err.Error(), "layer_types has 3 entries but num_hidden_layers is 2") {
		t.Errorf("explicit layer_types must not be rewritten: %v", err)
	}
}

func TestRopeVariants(t *testing.T) {
	for _, tc := range []struct {
		file string
		want Rope
	}{
		{"llama-2-7b", Rope{Type: "default", Theta: 10000}},
		{"llama-2-7b-linear", Rope{Type: "linear", Theta: 10000, Factor: 2}},
		{"llama-2-7b-dynamic", Rope{Type: "dynamic", Theta: 10000, Factor: 4}},
		{"llama-3.2-1b", Rope{Type: "llama3", Theta: 500000, Factor: 32, LowFreqFactor: 1, HighFreqFactor: 4, OriginalMaxPositionEmbeddings: 8192}},
		{"qwen3-0.6b-yarn", Rope{Type: "yarn", Theta: 1e6, Factor: 4, OriginalMaxPositionEmbeddings: 32768}},
		{"qwen2.5-7b-instruct-yarn", Rope{Type: "yarn", Theta: 1e6, Factor: 4, OriginalMaxPositionEmbeddings: 32768}},
		{"mixtral-8x7b-v0.1", Rope{Type: "default", Theta: 1e6}},
	} {
		t.Run(tc.file, func(t *testing.T) {
			for _, path := range []string{"testdata/hub/" + tc.file + ".json", "testdata/transformers/saved/" + tc.file + ".json"} {
				r := mustParse(t, path).Rope
				r.src, r.legacyType, r.extra = nil, "", nil
				if !reflect.DeepEqual(r, tc.want) {
					t.Errorf("%s: %+v, want %+v", path, r, tc.want)
				}
			}
		})
	}
}

func TestTokenIDs(t *testing.T) {
	c := mustParse(t, "testdata/hub/llama-3.1-8b-instruct.json")
	if !slices.Equal(c.EOSTokenIDs, []int{128001, 128008, 128009}) || c.BOSTokenID == nil || *c.BOSTokenID != 128000 || c.PadTokenID != nil {
		t.Errorf("llama 3.1 ids: bos %v eos %v pad %v", c.BOSTokenID, c.EOSTokenIDs, c.PadTokenID)
	}
	o := mustParse(t, "testdata/hub/olmoe-1b-7b-0924.json")
	if o.BOSTokenID != nil || !slices.Equal(o.EOSTokenIDs, []int{50279}) || o.PadTokenID == nil || *o.PadTokenID != 1 {
		t.Errorf("olmoe ids: bos %v eos %v pad %v", o.BOSTokenID, o.EOSTokenIDs, o.PadTokenID)
	}
}

func TestUnknownKeysKept(t *testing.T) {
	for _, tc := range []struct {
		file string
		want []string
	}{
		{"qwen2.5-0.5b", []string{"use_mrope"}},
		{"qwen3-30b-a3b", []string{"max_window_layers"}},
		{"llama-2-7b", nil}, // _name_or_path is consumed, as transformers does
		{"olmoe-1b-7b-0924", nil},
	} {
		if got := mustParse(t, "testdata/hub/"+tc.file+".json").Unknown(); !slices.Equal(got, tc.want) {
			t.Errorf("%s: Unknown() = %q, want %q", tc.file, got, tc.want)
		}
	}
	src := `{"model_type": "llama", "zeta": {"b": [1, 2.5, "\u00e9"], "a": null}, "alpha": 1e-7,
		"output_hidden_states": false, "return_dict": false,
		"rope_scaling": {"rope_type": "linear", "factor": 2, "mrope_section": [16, 24, 24]}}`
	c, err := Parse([]byte(src), "inline")
	if err != nil {
		t.Fatal(err)
	}
	if got := c.Unknown(); !slices.Equal(got, []string{"zeta", "alpha", "rope_parameters.mrope_section"}) {
		t.Errorf("Unknown() = %q", got)
	}
	out := string(mustMarshal(t, c))
	for _, want := range []string{
		"\"alpha\": 1e-07,",
		"\"zeta\": {\n    \"a\": null,\n    \"b\": [\n      1,\n      2.5,\n      \"\\u00e9\"\n    ]\n  }\n}\n",
		"\"return_dict\": false,",
		"\"factor\": 2,",
		"\"mrope_section\": [",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("written config lacks %q:\n%s", want, out)
		}
	}
	if strings.Contains(out, "output_hidden_states") {
		t.Error("a base attribute at its default must not be written (transformers drops it)")
	}
}

func TestDialects(t *testing.T) {
	// torch_dtype (4.x) and dtype (5.x); dtype wins when both are present.
	for _, tc := range []struct{ src, want string }{
		{`{"model_type":"qwen3","torch_dtype":"bfloat16"}`, "bfloat16"},
		{`{"model_type":"qwen3","dtype":"float16"}`, "float16"},
		{`{"model_type":"qwen3","torch_dtype":"bfloat16","dtype":"float32"}`, "float32"},
		{`{"model_type":"qwen3","dtype":"float32","torch_dtype":"bfloat16"}`, "float32"},
	} {
		c, err := Parse([]byte(tc.src), "inline")
		if err != nil {
			t.Fatal(err)
		}
		if c.DType != tc.want {
			t.Errorf("%s: dtype %q, want %q", tc.src, c.DType, tc.want)
		}
	}
	// qwen3_moe reads num_experts (4.x) and num_local_experts (5.x).
	for _, src := range []string{`{"model_type":"qwen3_moe","num_experts":16,"num_experts_per_tok":2}`,
		`{"model_type":"qwen3_moe","num_local_experts":16,"num_experts_per_tok":2}`} {
		c, err := Parse([]byte(src), "inline")
		if err != nil {
			t.Fatal(err)
		}
		if c.NumExperts != 16 || !strings.Contains(string(mustMarshal(t, c)), `"num_local_experts": 16`) {
			t.Errorf("%s: %d experts", src, c.NumExperts)
		}
	}
	// rope_scaling wins over rope_parameters, as in transformers; rope_theta fills in.
	c, err := Parse([]byte(`{"model_type":"llama","rope_theta":20000,"rope_parameters":{"rope_type":"default"},
		"rope_scaling":{"type":"linear","factor":3.0}}`), "inline")
	if err != nil {
		t.Fatal(err)
	}
	if c.Rope.Type != "linear" || c.Rope.Factor != 3 || c.Rope.Theta != 20000 {
		t.Errorf("rope %+v", c.Rope)
	}
	// Without model_type the architecture names the family.
	c, err = Parse([]byte(`{"architectures":["MistralForCausalLM"]}`), "inline")
	if err != nil || c.ModelType != "mistral" {
		t.Errorf("architectures fallback: %v %v", c, err)
	}
}

func TestParseErrors(t *testing.T) {
	for _, tc := range []struct {
		name, src string
		want      []string
	}{
		{"not json", `{"model_type": "llama",`, []string{"cfg.json", "not valid JSON"}},
		{"top array", `[1]`, []string{"expected a JSON object", "an array"}},
		{"trailing", `{"model_type":"llama"} {}`, []string{"after the top-level object"}},
		{"bad utf8", "{\"model_type\":\"ll\xffama\"}", []string{"invalid UTF-8 at byte 17"}},
		{"duplicate", `{"model_type":"llama","hidden_size":8,"hidden_size":8}`, []string{`key "hidden_size" appears twice`}},
		{"no model_type", `{"hidden_size": 64}`, []string{"model_type is missing", strings.Join(Families(), ", ")}},
		{"unsupported", `{"model_type":"gpt2"}`, []string{`unsupported model_type "gpt2"`, "supported: " + strings.Join(Families(), ", ")}},
		{"model_type type", `{"model_type":3}`, []string{`key "model_type": expected a string, got number 3`}},
		{"string int", `{"model_type":"llama","hidden_size":"4096"}`, []string{`key "hidden_size": expected an integer, got string "4096"`}},
		{"float int", `{"model_type":"llama","num_hidden_layers":2.0}`, []string{`key "num_hidden_layers": expected an integer, got 2.0`}},
		{"null int", `{"model_type":"llama","vocab_size":null}`, []string{`key "vocab_size": expected an integer, got null`}},
		{"bool", `{"model_type":"llama","tie_word_embeddings":1}`, []string{`key "tie_word_embeddings": expected true or false, got number 1`}},
		{"float", `{"model_type":"llama","rms_norm_eps":"1e-6"}`, []string{`key "rms_norm_eps": expected a number, got string`}},
		{"eos", `{"model_type":"llama","eos_token_id":"</s>"}`, []string{`key "eos_token_id": expected an integer or a list of integers`}},
		{"eos list", `{"model_type":"llama","eos_token_id":[1,"x"]}`, []string{`key "eos_token_id[1]": expected an integer`}},
		{"archs", `{"model_type":"llama","architectures":"LlamaForCausalLM"}`, []string{`key "architectures": expected a list of strings`}},
		{"rope obj", `{"model_type":"llama","rope_scaling":"linear"}`, []string{`key "rope_scaling": expected an object (or null)`}},
		{"rope factor type", `{"model_type":"llama","rope_parameters":{"rope_type":"linear","factor":"2"}}`, []string{`key "rope_parameters.factor": expected a number`}},
		{"rope per layer", `{"model_type":"qwen3","rope_parameters":{"full_attention":{"rope_type":"default"}}}`, []string{"per-layer-type rope parameters"}},
		{"huge int", `{"model_type":"llama","hidden_size":123456789012345678901234567890}`, []string{`key "hidden_size": integer 123456789012345678901234567890 is out of range`}},
		{"alias twice", `{"model_type":"qwen3_moe","num_experts":8,"num_local_experts":8}`, []string{`keys "num_local_experts" and "num_experts" both set num_local_experts`}},

		{"heads not dividing", `{"model_type":"llama","hidden_size":1000,"num_attention_heads":16}`, []string{"hidden_size (1000) is not a multiple of num_attention_heads (16) and head_dim is not set"}},
		{"kv not dividing", `{"model_type":"qwen2","hidden_size":896,"num_attention_heads":14,"num_key_value_heads":4}`, []string{"num_attention_heads (14) is not a multiple of num_key_value_heads (4): set num_key_value_heads to one of [1 2 7 14]"}},
		{"negative size", `{"model_type":"llama","intermediate_size":-1}`, []string{"intermediate_size (-1) must be positive"}},
		{"zero layers", `{"model_type":"llama","num_hidden_layers":0}`, []string{"num_hidden_layers (0) must be positive"}},
		{"too many layers", `{"model_type":"qwen3","num_hidden_layers":1000000000}`, []string{"num_hidden_layers (1000000000) must be between 1 and 65536"}},
		{"top-k > experts", `{"model_type":"mixtral","num_local_experts":4,"num_experts_per_tok":8}`, []string{"num_experts_per_tok (8) must be between 1 and the number of experts (4)"}},
		{"no experts", `{"model_type":"olmoe","num_experts":0}`, []string{"number of experts (0) must be positive"}},
		{"sparse step", `{"model_type":"qwen3_moe","decoder_sparse_step":0}`, []string{"decoder_sparse_step (0) must be at least 1"}},
		{"mlp_only range", `{"model_type":"qwen3_moe","num_hidden_layers":4,"mlp_only_layers":[4]}`, []string{"mlp_only_layers[0] = 4 is not a layer index (0..3)"}},
		{"rope type", `{"model_type":"llama","rope_scaling":{"rope_type":"mrope","factor":2.0}}`, []string{`rope_type "mrope" is not supported; use one of default, dynamic, linear, llama3, longrope, proportional, yarn`}},
		{"rope legacy type", `{"model_type":"llama","rope_scaling":{"type":"su","factor":2.0}}`, []string{`rope_type "su" is not supported`}},
		{"linear no factor", `{"model_type":"llama","rope_scaling":{"rope_type":"linear"}}`, []string{`rope_type "linear" needs a positive factor`}},
		{"llama3 bands", `{"model_type":"llama","rope_scaling":{"rope_type":"llama3","factor":8.0,"low_freq_factor":4.0,"high_freq_factor":1.0}}`, []string{"0 < low_freq_factor < high_freq_factor (got 4 and 1)"}},
		{"longrope", `{"model_type":"llama","hidden_size":64,"num_attention_heads":4,"rope_scaling":{"rope_type":"longrope","short_factor":[1.0],"long_factor":[1.0]}}`, []string{"short_factor and long_factor with 8 entries each"}},
		{"theta", `{"model_type":"llama","rope_theta":0}`, []string{"rope_theta (0) must be positive"}},
		{"partial", `{"model_type":"llama","partial_rotary_factor":1.5}`, []string{"partial_rotary_factor (1.5) must be in (0, 1]"}},
		{"hidden_act", `{"model_type":"llama","hidden_act":"tanh"}`, []string{`hidden_act "tanh" is not supported; use one of gelu, gelu_fast, gelu_new, gelu_pytorch_tanh, relu, silu, swish`}},
		{"dtype", `{"model_type":"llama","torch_dtype":"int8"}`, []string{`dtype "int8" is not supported`}},
		{"eps", `{"model_type":"llama","rms_norm_eps":0}`, []string{"rms_norm_eps (0) must be in (0, 1)"}},
		{"layer_types len", `{"model_type":"qwen3","num_hidden_layers":2,"layer_types":["full_attention"]}`, []string{"layer_types has 1 entries but num_hidden_layers is 2"}},
		{"layer_types value", `{"model_type":"qwen3","num_hidden_layers":1,"layer_types":["chunked_attention"]}`, []string{`layer_types[0] is "chunked_attention"`}},
		{"sliding negative", `{"model_type":"mistral","sliding_window":-1}`, []string{"sliding_window (-1) must be positive"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Parse([]byte(tc.src), "cfg.json")
			if err == nil {
				t.Fatal("no error")
			}
			if !strings.HasPrefix(err.Error(), "config: cfg.json: ") {
				t.Errorf("error does not name the source: %v", err)
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q lacks %q", err, w)
				}
			}
		})
	}
}

func TestLoadAndWrite(t *testing.T) {
	dir := t.TempDir()
	c, err := Preset("qwen3", "qwen3-0.6b")
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Write(dir); err != nil {
		t.Fatal(err)
	}
	want := mustMarshal(t, c)
	if got := readFile(t, filepath.Join(dir, FileName)); !bytes.Equal(got, want) {
		t.Error("Write(dir) did not write config.json")
	}
	if entries, _ := os.ReadDir(dir); len(entries) != 1 {
		t.Errorf("Write left %d files", len(entries))
	}
	for _, p := range []string{dir, filepath.Join(dir, FileName)} {
		back, err := Load(p)
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(mustMarshal(t, back), want) {
			t.Errorf("Load(%s) differs", p)
		}
	}
	if _, err := Load(filepath.Join(dir, "missing")); err == nil || !strings.Contains(err.Error(), "missing") {
		t.Errorf("missing file: %v", err)
	}
	big := filepath.Join(dir, "big.json")
	if err := os.WriteFile(big, bytes.Repeat([]byte(" "), MaxFileSize+1), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := Load(big); err == nil || !strings.Contains(err.Error(), "larger than") {
		t.Errorf("oversized file: %v", err)
	}
	bad := c.Clone()
	bad.NumKeyValueHeads = 3
	if err := bad.Write(filepath.Join(dir, "bad.json")); err == nil || !strings.Contains(err.Error(), "num_key_value_heads") {
		t.Errorf("invalid config written: %v", err)
	}
	if c.NumKeyValueHeads != 8 {
		t.Error("Clone shares state")
	}
}

func TestPythonFloatRepr(t *testing.T) {
	for _, tc := range []struct {
		v    float64
		want string
	}{
		{1e-6, "1e-06"}, {1e-5, "1e-05"}, {0.0001, "0.0001"}, {0.02, "0.02"}, {0.001, "0.001"},
		{10000, "10000.0"}, {500000, "500000.0"}, {1e6, "1000000.0"}, {1e15, "1000000000000000.0"},
		{1e16, "1e+16"}, {1.5e16, "1.5e+16"}, {0, "0.0"}, {-2.5, "-2.5"}, {point1 + point2, "0.30000000000000004"},
		{1e-100, "1e-100"}, {123456789.125, "123456789.125"},
	} {
		got, err := pyFloatRepr(tc.v)
		if err != nil || got != tc.want {
			t.Errorf("repr(%v) = %q, %v; want %q", tc.v, got, err, tc.want)
		}
	}
	if _, err := pyFloatRepr(nanValue()); err == nil {
		t.Error("NaN must not be written")
	}
}

var point1, point2 = 0.1, 0.2

func nanValue() float64 { var z float64; return z / z }

func TestPythonStrings(t *testing.T) {
	for _, tc := range []struct{ in, want string }{
		{"abc", `"abc"`}, {"a\"b\\c", `"a\"b\\c"`}, {"\n\r\t\b\f", `"\n\r\t\b\f"`}, {"\x01\x7f", `"\u0001\u007f"`},
		{"é", `"\u00e9"`}, {"日本", `"\u65e5\u672c"`}, {"😀", `"\ud83d\ude00"`}, {"<&>", `"<&>"`},
	} {
		var b bytes.Buffer
		writePyString(&b, tc.in)
		if b.String() != tc.want {
			t.Errorf("%q -> %s, want %s", tc.in, b.String(), tc.want)
		}
	}
}

// testdata/transformers/check.json records transformers 5.17 loading every golden (our written
// presets), building the model on the meta device and saving the config again byte for byte.
// The recorded hashes must be those of the current goldens: rerun make_reference.py check
// after changing them.
func TestTransformersLoadsOurGoldens(t *testing.T) {
	var report struct {
		Version string `json:"transformers_version"`
		Files   map[string]struct {
			SHA256    string `json:"sha256"`
			Identical bool   `json:"resaved_identical"`
			Class     string `json:"class"`
			Params    int64  `json:"parameters"`
			Error     string `json:"error"`
			// Small models are also built for real, saved with save_pretrained and reloaded.
			ModelSaved *bool `json:"model_saved_identical"`
			Reloaded   bool  `json:"model_reloaded"`
		} `json:"files"`
	}
	if err := json.Unmarshal(readFile(t, "testdata/transformers/check.json"), &report); err != nil {
		t.Fatal(err)
	}
	if report.Version != WriterVersion {
		t.Errorf("check made with transformers %s, writer targets %s", report.Version, WriterVersion)
	}
	goldens, _ := filepath.Glob("testdata/golden/*.json")
	checked := map[string]bool{}
	for name := range report.Files {
		checked[strings.SplitN(name, ".", 2)[0]] = true
	}
	for _, g := range goldens {
		name := filepath.Base(g)
		r, ok := report.Files[name]
		sum := sha256.Sum256(readFile(t, g))
		switch {
		case !ok && !checked[strings.SplitN(name, ".", 2)[0]]:
			// A family added since the last check: make_reference.py check covers it next.
			t.Logf("%s: family not yet checked by transformers (run testdata/make_reference.py check)", name)
			continue
		case !ok:
			t.Errorf("%s: not checked by transformers", name)
		case r.SHA256 != hex.EncodeToString(sum[:]):
			t.Errorf("%s: changed since transformers checked it", name)
		case r.Error != "" || !r.Identical || r.Params <= 0:
			t.Errorf("%s: transformers: error %q, re-saved identical %v, %d parameters", name, r.Error, r.Identical, r.Params)
		case r.Params < 5_000_000 && (r.ModelSaved == nil || !*r.ModelSaved || !r.Reloaded):
			t.Errorf("%s: transformers' model.save_pretrained wrote another config.json, or the model did not reload", name)
		}
		c := mustParse(t, g)
		if r.Class != c.Architectures[0] {
			t.Errorf("%s: transformers built %s, config names %s", name, r.Class, c.Architectures[0])
		}
	}
}

// NumParameters equals the count of transformers' model on the meta device (check.json).
func TestNumParametersMatchesTransformers(t *testing.T) {
	var report struct {
		Files map[string]struct {
			Params int64 `json:"parameters"`
		} `json:"files"`
	}
	if err := json.Unmarshal(readFile(t, "testdata/transformers/check.json"), &report); err != nil {
		t.Fatal(err)
	}
	for name, r := range report.Files {
		c := mustParse(t, filepath.Join("testdata", "golden", name))
		if got := c.NumParameters(); got != r.Params {
			t.Errorf("%s: %d parameters, transformers %d", name, got, r.Params)
		}
		if c.IsMoE() == (c.ActiveParameters() == c.NumParameters()) {
			t.Errorf("%s: active %d of %d parameters", name, c.ActiveParameters(), c.NumParameters())
		}
	}
	// Qwen3-30B-A3B: 30.5B parameters, 3.3B active per token.
	c, _ := Preset("qwen3_moe", "qwen3-moe-30b-a3b")
	if a := c.ActiveParameters(); a < 3.2e9 || a > 3.4e9 {
		t.Errorf("qwen3-30b-a3b active parameters %d", a)
	}
}
