package models

import (
	"encoding/json"
	"math"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"testing"

	"github.com/halo-shell/halo-shell/engine/hf/safetensors"
	"github.com/halo-shell/halo-shell/engine/nn"
)

// dsv4FixtureConfig is what the host DeepSeek-V4 test reads of the fixture's config.json
// (written by transformers 5.17, so every key is present).
type dsv4FixtureConfig struct {
	VocabSize  int            `json:"vocab_size"`
	HiddenSize int            `json:"hidden_size"`
	Heads      int            `json:"num_attention_heads"`
	HeadDim    int            `json:"head_dim"`
	QRank      int            `json:"q_lora_rank"`
	OGroups    int            `json:"o_groups"`
	ORank      int            `json:"o_lora_rank"`
	Window     int            `json:"sliding_window"`
	LayerTypes []string       `json:"layer_types"`
	MLPTypes   []string       `json:"mlp_layer_types"`
	Rates      map[string]int `json:"compress_rates"`
	Experts    int            `json:"n_routed_experts"`
	TopK       int            `json:"num_experts_per_tok"`
	ExpertDim  int            `json:"moe_intermediate_size"`
	RSF        float64        `json:"routed_scaling_factor"`
	Limit      float64        `json:"swiglu_limit"`
	HC         int            `json:"hc_mult"`
	HCIters    int            `json:"hc_sinkhorn_iters"`
	HCEps      float64        `json:"hc_eps"`
	Eps        float64        `json:"rms_norm_eps"`
	IndexHeads int            `json:"index_n_heads"`
	IndexDim   int            `json:"index_head_dim"`
	IndexTopK  int            `json:"index_topk"`
	RopeParams map[string]struct {
		Theta   float64 `json:"rope_theta"`
		Partial float64 `json:"partial_rotary_factor"`
	} `json:"rope_parameters"`
}

var dsv4TidName = regexp.MustCompile(`^model\.layers\.(\d+)\.mlp\.gate\.tid2eid$`)

// dsv4Param is one fixture parameter on the host: its values and dimensionality.
type dsv4Param struct {
	v    []float64
	r, c int
	ndim int
}

// loadDSV4Fixture reads the fixture's config and weights (DeepSeek's own names, mapped by
// dsv4Name) into a host model; params holds the parameters by transformers' name.
func loadDSV4Fixture(t *testing.T, dir string) (nn.DSV4Config, [][]int, map[string]*dsv4Param) {
	t.Helper()
	raw, err := os.ReadFile(filepath.Join(dir, "config.json"))
	if err != nil {
		t.Fatal(err)
	}
	var rc dsv4FixtureConfig
	if err := json.Unmarshal(raw, &rc); err != nil {
		t.Fatal(err)
	}
	cfg := nn.DSV4Config{Vocab: rc.VocabSize, Hidden: rc.HiddenSize, Heads: rc.Heads, HeadDim: rc.HeadDim,
		QRank: rc.QRank, OGroups: rc.OGroups, ORank: rc.ORank, Window: rc.Window, LayerTypes: rc.LayerTypes,
		MLPTypes: rc.MLPTypes, Experts: rc.Experts, TopK: rc.TopK, ExpertDim: rc.ExpertDim, RoutedScale: rc.RSF,
		SwigluLimit: rc.Limit, HC: rc.HC, HCIters: rc.HCIters, HCEps: rc.HCEps, Eps: rc.Eps,
		IndexHeads: rc.IndexHeads, IndexDim: rc.IndexDim, IndexTopK: rc.IndexTopK}
	for _, lt := range rc.LayerTypes {
		cfg.Rates = append(cfg.Rates, rc.Rates[lt])
	}
	rd := int(float64(rc.HeadDim) * rc.RopeParams["main"].Partial)
	cfg.MainInvFreq = nn.RopeInvFreq(rc.RopeParams["main"].Theta, rd)
	cfg.CompressInvFreq = nn.RopeInvFreq(rc.RopeParams["compress"].Theta, rd)

	f, err := safetensors.Open(filepath.Join(dir, "model.safetensors"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	tid := make([][]int, len(rc.LayerTypes))
	params := map[string]*dsv4Param{}
	for _, name := range f.Names() {
		info, _ := f.Tensor(name)
		v, err := safetensors.ToFloat32(info)
		if err != nil {
			t.Fatal(err)
		}
		hf := dsv4Name(name)
		if sm := dsv4TidName.FindStringSubmatch(hf); sm != nil {
			l, _ := strconv.Atoi(sm[1])
			tid[l] = make([]int, len(v))
			for i, x := range v {
				tid[l][i] = int(x)
			}
			continue
		}
		p := &dsv4Param{v: make([]float64, len(v)), r: 1, c: len(v), ndim: len(info.Shape)}
		for i, x := range v {
			p.v[i] = float64(x)
		}
		if len(info.Shape) == 2 {
			p.r, p.c = int(info.Shape[0]), int(info.Shape[1])
		}
		params[hf] = p
	}
	return cfg, tid, params
}

// dsv4Run runs the documents of ids (split at docLens, or one document) on a fresh tape and
// returns each document's next-token logprobs; with seed, it also back-propagates seed times
// the summed logprobs and returns the parameters' gradients.
func dsv4Run(t *testing.T, cfg nn.DSV4Config, tid [][]int, params map[string]*dsv4Param, docs [][]int32, seed float64) ([][]float64, map[string][]float64) {
	t.Helper()
	var tape nn.HostTape
	leaves := map[string]*nn.HVar{}
	for n, p := range params {
		leaves[n] = tape.Leaf(append([]float64(nil), p.v...), p.r, p.c)
	}
	m := &nn.DSV4{Cfg: cfg, Tid2Eid: tid, Param: func(n string) *nn.HVar { return leaves[n] }}
	var out [][]float64
	for _, d := range docs {
		ids := make([]int, len(d))
		for i, x := range d {
			ids[i] = int(x)
		}
		lg, err := m.Logits(&tape, ids)
		if err != nil {
			t.Fatal(err)
		}
		tg := append(append([]int{}, ids[1:]...), -1)
		lp := tape.TokenLogprobs(lg, tg)
		for i := range lp.G {
			lp.G[i] = seed
		}
		out = append(out, lp.V[:len(ids)-1])
	}
	if seed == 0 {
		return out, nil
	}
	tape.Backward()
	grads := map[string][]float64{}
	for n, l := range leaves {
		grads[n] = l.G
	}
	return out, grads
}

// TestDeepseekV4HostMatchesTransformers runs the host DeepSeek-V4 decoder (nn.DSV4) on
// transformers 5.17's fixture: logprobs within 1e-4, packed documents, the mean loss, every
// gradient within 1e-3 relative (the indexer's, which transformers leaves without one, zero)
// and the losses of three torch AdamW steps.
func TestDeepseekV4HostMatchesTransformers(t *testing.T) {
	dir := filepath.Join("testdata", "parity", "deepseek_v4")
	raw, err := os.ReadFile(filepath.Join(dir, "reference.json"))
	if err != nil {
		t.Fatal(err)
	}
	var ref parityReference
	if err := json.Unmarshal(raw, &ref); err != nil {
		t.Fatal(err)
	}
	cfg, tid, params := loadDSV4Fixture(t, dir)
	n := 0
	for _, r := range ref.InputIDs {
		n += len(r) - 1
	}
	lps, grads := dsv4Run(t, cfg, tid, params, ref.InputIDs, -1/float64(n))
	loss, worst := 0.0, 0.0
	for r, lp := range lps {
		for i, v := range lp {
			worst = math.Max(worst, math.Abs(v-ref.Logprobs[r][i]))
			loss -= v / float64(n)
		}
	}
	t.Logf("worst logprob difference %.2g", worst)
	if worst > 1e-4 {
		t.Errorf("logprobs differ from transformers by up to %.3g (tolerance 1e-4)", worst)
	}
	if math.Abs(loss-ref.Loss) > 1e-5*math.Abs(ref.Loss) {
		t.Errorf("loss %.7f, transformers %.7f", loss, ref.Loss)
	}

	gf, err := safetensors.Open(filepath.Join(dir, "grads.safetensors"))
	if err != nil {
		t.Fatal(err)
	}
	defer gf.Close()
	worstGrad := 0.0
	for name, p := range params {
		g := make([]float32, len(grads[name]))
		for i, v := range grads[name] {
			g[i] = float32(v)
		}
		want, err := transformersGrad(gf, ParamSpec{Name: name, Shape: []int{p.r, p.c}}, nil)
		if err != nil {
			// No gradient in transformers: the indexer's weights only pick entries.
			if d := norm(g); d != 0 {
				t.Errorf("%s: transformers has no gradient (%v) but ours has norm %.3g", name, err, d)
			}
			continue
		}
		r := relDiff(g, want)
		if norm(want) == 0 {
			r = norm(g)
		}
		worstGrad = math.Max(worstGrad, r)
		if r > 1e-3 {
			t.Errorf("%s: gradient differs from transformers: relative %.3g (tolerance 1e-3)", name, r)
		}
	}
	t.Logf("worst gradient relative difference %.2g", worstGrad)

	// Packed documents: each runs alone, positions from 0.
	if p := ref.Packed; p != nil {
		var docs [][]int32
		lo := 0
		for _, l := range p.DocLengths {
			docs = append(docs, p.InputIDs[lo:lo+l])
			lo += l
		}
		lp, _ := dsv4Run(t, cfg, tid, params, docs, 0)
		worst := 0.0
		for d, want := range p.Logprobs {
			for i, w := range want {
				worst = math.Max(worst, math.Abs(lp[d][i]-w))
			}
		}
		if worst > 1e-4 {
			t.Errorf("packed documents: logprobs differ from transformers by up to %.3g", worst)
		}
	}

	// torch.optim.AdamW, decay on ndim >= 2 only.
	a := ref.AdamW
	mom, vel := map[string][]float64{}, map[string][]float64{}
	for step, want := range a.Losses {
		lp, g := dsv4Run(t, cfg, tid, params, ref.InputIDs, -1/float64(n))
		loss := 0.0
		for _, row := range lp {
			for _, v := range row {
				loss -= v / float64(n)
			}
		}
		if math.Abs(loss-want) > 1e-4*math.Abs(want) {
			t.Errorf("AdamW: loss before step %d is %.7f, transformers %.7f", step+1, loss, want)
		}
		k := float64(step + 1)
		bc1, bc2 := 1-math.Pow(a.Betas[0], k), 1-math.Pow(a.Betas[1], k)
		for name, p := range params {
			if mom[name] == nil {
				mom[name], vel[name] = make([]float64, len(p.v)), make([]float64, len(p.v))
			}
			wd := 0.0
			if p.ndim >= 2 {
				wd = a.WeightDecay
			}
			for i := range p.v {
				gi := g[name][i]
				p.v[i] *= 1 - a.LR*wd
				mom[name][i] = a.Betas[0]*mom[name][i] + (1-a.Betas[0])*gi
				vel[name][i] = a.Betas[1]*vel[name][i] + (1-a.Betas[1])*gi*gi
				p.v[i] -= a.LR / bc1 * mom[name][i] / (math.Sqrt(vel[name][i])/math.Sqrt(bc2) + a.Eps)
			}
		}
	}
}

// TestDeepseekV4Names maps the names of DeepSeek's own checkpoints onto transformers' modules.
func TestDeepseekV4Names(t *testing.T) {
	for _, tc := range []struct{ disk, want string }{
		{"embed.weight", "model.embed_tokens.weight"},
		{"model.embed_tokens.weight", "model.embed_tokens.weight"},
		{"head.weight", "lm_head.weight"},
		{"lm_head.weight", "lm_head.weight"},
		{"norm.weight", "model.norm.weight"},
		{"hc_head_fn", "model.hc_head.hc_fn"},
		{"model.hc_head.hc_scale", "model.hc_head.hc_scale"},
		{"layers.3.attn_norm.weight", "model.layers.3.input_layernorm.weight"},
		{"model.layers.0.ffn_norm.weight", "model.layers.0.post_attention_layernorm.weight"},
		{"layers.0.hc_attn_fn", "model.layers.0.attn_hc.fn"},
		{"layers.0.hc_ffn_scale", "model.layers.0.ffn_hc.scale"},
		{"layers.1.attn.attn_sink", "model.layers.1.self_attn.sinks"},
		{"layers.1.attn.norm.weight", "model.layers.1.self_attn.kv_norm.weight"},
		{"layers.1.attn.q_norm.weight", "model.layers.1.self_attn.q_a_norm.weight"},
		{"layers.1.attn.wq_a.weight", "model.layers.1.self_attn.q_a_proj.weight"},
		{"layers.1.attn.wq_b.weight", "model.layers.1.self_attn.q_b_proj.weight"},
		{"layers.1.attn.wkv.weight", "model.layers.1.self_attn.kv_proj.weight"},
		{"layers.1.attn.wo_a.weight", "model.layers.1.self_attn.o_a_proj.weight"},
		{"layers.1.attn.wo_b.weight", "model.layers.1.self_attn.o_b_proj.weight"},
		{"layers.1.attn.compressor.ape", "model.layers.1.self_attn.compressor.position_bias"},
		{"layers.1.attn.compressor.norm.weight", "model.layers.1.self_attn.compressor.kv_norm.weight"},
		{"layers.1.attn.compressor.wkv.weight", "model.layers.1.self_attn.compressor.kv_proj.weight"},
		{"layers.1.attn.compressor.wgate.weight", "model.layers.1.self_attn.compressor.gate_proj.weight"},
		{"layers.1.attn.indexer.compressor.ape", "model.layers.1.self_attn.compressor.indexer.position_bias"},
		{"layers.1.attn.indexer.compressor.norm.weight", "model.layers.1.self_attn.compressor.indexer.kv_norm.weight"},
		{"layers.1.attn.indexer.compressor.wkv.weight", "model.layers.1.self_attn.compressor.indexer.kv_proj.weight"},
		{"layers.1.attn.indexer.wq_b.weight", "model.layers.1.self_attn.compressor.indexer.q_b_proj.weight"},
		{"layers.1.attn.indexer.weights_proj.weight", "model.layers.1.self_attn.compressor.indexer.scorer.weights_proj.weight"},
		{"layers.2.ffn.gate.bias", "model.layers.2.mlp.gate.e_score_correction_bias"},
		{"layers.2.ffn.gate.tid2eid", "model.layers.2.mlp.gate.tid2eid"},
		{"layers.2.ffn.experts.5.w1.weight", "model.layers.2.mlp.experts.5.gate_proj.weight"},
		{"layers.2.ffn.experts.5.w2.weight", "model.layers.2.mlp.experts.5.down_proj.weight"},
		{"layers.2.ffn.experts.5.w3.weight", "model.layers.2.mlp.experts.5.up_proj.weight"},
		{"layers.2.ffn.shared_experts.w3.weight", "model.layers.2.mlp.shared_experts.up_proj.weight"},
		{"model.layers.2.self_attn.compressor.indexer.scorer.weights_proj.weight", "model.layers.2.self_attn.compressor.indexer.scorer.weights_proj.weight"},
	} {
		if got := dsv4Name(tc.disk); got != tc.want {
			t.Errorf("%s: got %s, want %s", tc.disk, got, tc.want)
		}
	}
}
