package models

import (
	"encoding/json"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/halo-shell/halo-shell/engine/backend"
	"github.com/halo-shell/halo-shell/engine/hf/safetensors"
	"github.com/halo-shell/halo-shell/engine/internal/gradcheck"
	"github.com/halo-shell/halo-shell/engine/tensor"
)

// parityReference is reference.json of a fixture made by transformers
// (scripts/gpu/make_fixtures.py).
type parityReference struct {
	Family   string      `json:"family"`
	InputIDs [][]int32   `json:"input_ids"`
	Logprobs [][]float64 `json:"logprobs"`
	Loss     float64     `json:"loss"`
	// MoE cases: the load-balancing loss, its weight and loss + coef*aux.
	AuxLoss           *float64 `json:"aux_loss"`
	RouterAuxLossCoef float64  `json:"router_aux_loss_coef"`
	LossTotal         float64  `json:"loss_total"`
	Packed            *struct {
		DocLengths []int       `json:"doc_lengths"`
		InputIDs   []int32     `json:"input_ids"`
		Logprobs   [][]float64 `json:"logprobs"`
	} `json:"packed"`
	AdamW struct {
		LR          float64   `json:"lr"`
		Betas       []float64 `json:"betas"`
		Eps         float64   `json:"eps"`
		WeightDecay float64   `json:"weight_decay"`
		Objective   string    `json:"objective"`
		Losses      []float64 `json:"losses"`
	} `json:"adamw"`
}

// parityCases are the fixture directories under testdata/parity that make_fixtures.py makes;
// a case whose fixture has not been made yet is skipped, and any other directory holding a
// reference.json is checked too (parityDirs).
var parityCases = []string{"llama", "llama_tied_llama3", "mistral_swa", "qwen2_yarn", "qwen3", "qwen3_dynamic",
	"qwen3_moe", "qwen3_moe_sparse", "mixtral", "olmoe",
	"olmo2", "olmo3", "phi3_longrope", "granite", "smollm3", "glm4", "qwen2_moe", "glm4_moe",
	"gemma3_text", "deepseek_v3", "deepseek_v3_qproj", "glm4_moe_lite", "gpt_oss",
	"flex_olmo", "phimoe",
	"gemma4_text", "lfm2_moe", "lfm2_moe_raw", "cohere2_moe", "cohere2_moe_sigmoid"}

// parityDirs returns parityCases followed by every other fixture directory found under
// testdata/parity, sorted.
func parityDirs(t *testing.T) []string {
	t.Helper()
	out := slices.Clone(parityCases)
	found, err := filepath.Glob(filepath.Join("testdata", "parity", "*", "reference.json"))
	if err != nil {
		t.Fatal(err)
	}
	slices.Sort(found)
	for _, f := range found {
		if name := filepath.Base(filepath.Dir(f)); !slices.Contains(out, name) {
			out = append(out, name)
		}
	}
	return out
}

// rowsBatch packs B rows of input_ids as B documents with next-token targets.
func rowsBatch(rows [][]int32) Batch {
	var b Batch
	b.DocStarts = []int32{0}
	for _, r := range rows {
		b.Tokens = append(b.Tokens, r...)
		b.Targets = append(b.Targets, r[1:]...)
		b.Targets = append(b.Targets, backend.IgnoreIndex)
		b.DocStarts = append(b.DocStarts, int32(len(b.Tokens)))
	}
	return b
}

// TestParityWithTransformers compares each family against the state transformers computed for
// the same weights: per-token logprobs (1e-4 absolute), packed documents, the mean loss, every
// parameter gradient (1e-3 relative) and the losses of 3 AdamW steps (1e-4 relative).
func TestParityWithTransformers(t *testing.T) {
	for _, name := range parityDirs(t) {
		t.Run(name, func(t *testing.T) {
			dir := filepath.Join("testdata", "parity", name)
			raw, err := os.ReadFile(filepath.Join(dir, "reference.json"))
			if os.IsNotExist(err) {
				t.Skipf("no fixture %s (made by scripts/gpu/make_fixtures.py)", dir)
			}
			if err != nil {
				t.Fatal(err)
			}
			var ref parityReference
			if err := json.Unmarshal(raw, &ref); err != nil {
				t.Fatalf("%s: %v", dir, err)
			}
			if _, err := Lookup(ref.Family); err != nil {
				t.Skipf("family %s is not implemented yet: %v", ref.Family, err)
			}
			b := newCPU()
			m, err := Load(dir, b, Options{})
			if err != nil {
				t.Fatal(err)
			}
			defer m.Close()

			// Logprobs, one row at a time.
			for r, ids := range ref.InputIDs {
				lp, err := m.Logprobs(ids)
				if err != nil {
					t.Fatal(err)
				}
				worst := 0.0
				for i := range lp {
					worst = math.Max(worst, math.Abs(float64(lp[i])-ref.Logprobs[r][i]))
				}
				t.Logf("row %d: worst logprob difference %.2g", r, worst)
				if worst > 1e-4 {
					t.Errorf("row %d: logprobs differ from transformers by up to %.3g (tolerance 1e-4)", r, worst)
				}
			}

			// Loss and gradients of the mean loss over the whole batch.
			batch := rowsBatch(ref.InputIDs)
			n := 0
			for _, tg := range batch.Targets {
				if tg != backend.IgnoreIndex {
					n++
				}
			}
			// MoE cases with transformers' load-balancing loss. The sigmoid-router families
			// (deepseek_v3, glm4_moe, glm4_moe_lite) have none in transformers (no
			// output_router_logits), and neither does the model built from their configs.
			moe := ref.AuxLoss != nil
			if moe && !m.IsMoE() || !moe && m.AuxLossScale() != 0 {
				t.Fatalf("fixture has aux loss %v, model IsMoE %v with aux loss scale %v", moe, m.IsMoE(), m.AuxLossScale())
			}
			if moe {
				if got := m.AuxLossScale(); got != ref.RouterAuxLossCoef {
					t.Errorf("aux loss scale from config.json %v, transformers coef %v", got, ref.RouterAuxLossCoef)
				}
				// transformers 5.17's causal-LM output loss already includes coef*aux, so the
				// fixture's "loss" and grads.safetensors are of CE + coef*aux, and its
				// "loss_total", grads_total.safetensors and AdamW objective of CE + 2*coef*aux.
				m.SetAuxLossScale(ref.RouterAuxLossCoef)
			}
			if err := m.ZeroGrads(); err != nil {
				t.Fatal(err)
			}
			sum, got, err := m.ForwardBackward(batch, 1/float32(n))
			if err != nil {
				t.Fatal(err)
			}
			if got != n {
				t.Fatalf("%d targets counted, want %d", got, n)
			}
			loss := sum / float64(n)
			if moe {
				loss += ref.RouterAuxLossCoef * m.AuxLoss()
			}
			if math.Abs(loss-ref.Loss) > 1e-5*math.Abs(ref.Loss) {
				t.Errorf("loss %.7f, transformers %.7f", loss, ref.Loss)
			}
			if moe {
				if math.Abs(m.AuxLoss()-*ref.AuxLoss) > 1e-5*math.Abs(*ref.AuxLoss) {
					t.Errorf("aux loss %.7f, transformers %.7f", m.AuxLoss(), *ref.AuxLoss)
				}
			}
			compareGrads(t, m, filepath.Join(dir, "grads.safetensors"))
			if moe {
				m.SetAuxLossScale(2 * ref.RouterAuxLossCoef)
				if err := m.ZeroGrads(); err != nil {
					t.Fatal(err)
				}
				sum, _, err := m.ForwardBackward(batch, 1/float32(n))
				if err != nil {
					t.Fatal(err)
				}
				total := sum/float64(n) + 2*ref.RouterAuxLossCoef*m.AuxLoss()
				if math.Abs(total-ref.LossTotal) > 1e-5*math.Abs(ref.LossTotal) {
					t.Errorf("loss + coef*aux %.7f, transformers %.7f", total, ref.LossTotal)
				}
				compareGrads(t, m, filepath.Join(dir, "grads_total.safetensors"))
			}

			// Packed documents equal each document run alone in transformers.
			if p := ref.Packed; p != nil {
				pb := Batch{Tokens: p.InputIDs, DocStarts: []int32{0}}
				for d, l := range p.DocLengths {
					lo := pb.DocStarts[d]
					pb.Targets = append(pb.Targets, p.InputIDs[lo+1:lo+int32(l)]...)
					pb.Targets = append(pb.Targets, backend.IgnoreIndex)
					pb.DocStarts = append(pb.DocStarts, lo+int32(l))
				}
				lp, err := m.TokenLogprobs(pb)
				if err != nil {
					t.Fatal(err)
				}
				worst := 0.0
				for d, want := range p.Logprobs {
					lo := int(pb.DocStarts[d])
					for i, w := range want {
						worst = math.Max(worst, math.Abs(float64(lp[lo+i])-w))
					}
				}
				if worst > 1e-4 {
					t.Errorf("packed documents: logprobs differ from transformers by up to %.3g", worst)
				}
			}

			// Three AdamW steps (torch.optim.AdamW, decay on ndim >= 2 only, no clipping).
			a := ref.AdamW
			switch a.Objective {
			case "", "ce":
			case "ce+aux":
				if !moe {
					t.Fatalf("AdamW objective %q, but the fixture has no aux loss (transformers computed none, so its objective is plain cross-entropy): regenerate it with scripts/gpu/make_fixtures.py", a.Objective)
				}
			default:
				t.Fatalf("AdamW objective %q is not known", a.Objective)
			}
			adam := newHostAdamW(m, a.LR, a.Betas[0], a.Betas[1], a.Eps, a.WeightDecay)
			for step := 0; step < len(a.Losses); step++ {
				if err := m.ZeroGrads(); err != nil {
					t.Fatal(err)
				}
				var sum float64
				if step < len(a.Losses)-1 {
					sum, _, err = m.ForwardBackward(batch, 1/float32(n))
				} else {
					sum, _, err = m.Forward(batch)
				}
				if err != nil {
					t.Fatal(err)
				}
				loss := sum / float64(n)
				if a.Objective == "ce+aux" {
					loss += 2 * ref.RouterAuxLossCoef * m.AuxLoss()
				}
				if want := a.Losses[step]; math.Abs(loss-want) > 1e-4*math.Abs(want) {
					t.Errorf("AdamW: loss before step %d is %.7f, transformers %.7f", step+1, loss, want)
				}
				if step < len(a.Losses)-1 {
					if err := adam.step(t); err != nil {
						t.Fatal(err)
					}
				}
			}
		})
	}
}

// compareGrads compares every gradient of m with a gradient file of transformers by the rule
// of gradcheck (1e-3 relative; a noise-level reference within its layer's float32 floor).
func compareGrads(t *testing.T, m *Model, path string) {
	t.Helper()
	gf, err := safetensors.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer gf.Close()
	got, want := map[string][]float32{}, map[string][]float32{}
	for _, s := range m.Specs {
		if isBuffer(s.Name) {
			// A buffer to transformers (a router's selection bias, Gemma 4's layer_scalar), which
			// gives it no gradient and writes none to the file; nor does the model.
			if g, err := m.GradFloat32(s.Name); err != nil || slices.ContainsFunc(g, func(v float32) bool { return v != 0 }) {
				t.Errorf("%s: the buffer has a gradient (%v)", s.Name, err)
			}
			continue
		}
		w, err := transformersGrad(gf, s, expertHooks(m.Family))
		g, gerr := m.GradFloat32(s.Name)
		if gerr != nil {
			t.Fatal(gerr)
		}
		if _, saved := gf.Tensor(s.Name); err != nil && !saved && !slices.ContainsFunc(g, func(v float32) bool { return v != 0 }) {
			// transformers gives no gradient to a parameter that only chooses (DeepSeek-V4's
			// indexer, whose top-k indices are all that leave it); ours is exactly zero too.
			continue
		}
		if err != nil {
			t.Errorf("%s: %v", filepath.Base(path), err)
			continue
		}
		got[s.Name], want[s.Name] = g, w
	}
	noise, err := gradcheck.Noise(tensor.F32)
	if err != nil {
		t.Fatal(err)
	}
	diffs, err := gradcheck.Compare(got, want, noise)
	if err != nil {
		t.Fatalf("%s: %v", filepath.Base(path), err)
	}
	worst := 0.0
	for _, d := range diffs {
		if !d.Noise {
			worst = math.Max(worst, d.Rel)
		}
		if !d.Pass(1e-3) {
			t.Errorf("%s: gradient differs from transformers: %v (tolerance 1e-3 relative)", filepath.Base(path), d)
		}
	}
	t.Logf("%s: worst gradient relative difference %.2g", filepath.Base(path), worst)
}

// expertName matches a per-expert weight in the Hub layout.
var expertName = regexp.MustCompile(`^model\.layers\.(\d+)\.(?:mlp|block_sparse_moe|feed_forward)\.experts\.(\d+)\.(gate_proj|up_proj|down_proj|w1|w3|w2)\.weight$`)

// transformersGrad returns the gradient of parameter s from a file written with transformers 5's
// in-memory names: experts fused as mlp.experts.gate_up_proj [E, 2I, C] (gate rows, then up
// rows) and mlp.experts.down_proj [E, C, I]; Mixtral's router as mlp.gate.weight; the family's
// other in-memory names (moe, nil for dense families) for their checkpoint names.
func transformersGrad(gf *safetensors.File, s ParamSpec, moe *moeFFN) ([]float32, error) {
	get := func(name string) ([]float32, error) {
		info, ok := gf.Tensor(name)
		if !ok {
			return nil, fmt.Errorf("no tensor %s", name)
		}
		return safetensors.ToFloat32(info)
	}
	sm := expertName.FindStringSubmatch(s.Name)
	if sm == nil {
		if strings.HasSuffix(s.Name, "."+scoreBiasName) {
			// A buffer in transformers: no gradient, which is zero here.
			if _, ok := gf.Tensor(s.Name); !ok {
				return make([]float32, s.Numel()), nil
			}
		}
		name := strings.Replace(s.Name, ".block_sparse_moe.gate.", ".mlp.gate.", 1)
		if _, ok := gf.Tensor(name); !ok && moe != nil {
			// A tensor transformers holds under another name in memory (moeFFN.inMemory:
			// Laguna's mlp.shared_experts for the checkpoint's mlp.shared_expert).
			for _, r := range moe.inMemory {
				if n := strings.Replace(name, "."+moe.block+"."+r.to, "."+moe.block+"."+r.from, 1); n != name {
					name = n
					break
				}
				// Under the block's own in-memory module (PhiMoE's mlp.router for
				// block_sparse_moe.gate).
				if moe.memBlock == "" {
					continue
				}
				if n := strings.Replace(s.Name, "."+moe.block+"."+r.to, "."+moe.memBlock+"."+r.from, 1); n != s.Name {
					if _, ok := gf.Tensor(n); ok {
						name = n
						break
					}
				}
			}
		}
		return get(name)
	}
	if _, ok := gf.Tensor(s.Name); ok {
		// Saved per expert (transformers 5 writes Cohere2-MoE's stacked experts so).
		return get(s.Name)
	}
	x, _ := strconv.Atoi(sm[2])
	n := s.Numel()
	fused, off := "gate_up_proj", 2*x*n
	switch sm[3] {
	case "up_proj", "w3":
		off += n
	case "down_proj", "w2":
		fused, off = "down_proj", x*n
	}
	// transformers keeps LFM2-MoE's experts under feed_forward, every other family's under mlp
	// (Mixtral's block_sparse_moe included).
	block := "mlp"
	if strings.Contains(s.Name, ".feed_forward.experts.") {
		block = "feed_forward"
	}
	all, err := get("model.layers." + sm[1] + "." + block + ".experts." + fused)
	if err != nil && moe != nil && moe.fused.GateUp != "" {
		// The family's own fused tensors (granitemoe's and jetmoe's input_linear and
		// output_linear).
		own := map[string]string{"gate_up_proj": moe.fused.GateUp, "down_proj": moe.fused.Down}[fused]
		all, err = get("model.layers." + sm[1] + "." + moe.block + "." + own)
	}
	if err != nil {
		return nil, err
	}
	if off+n > len(all) {
		return nil, fmt.Errorf("%s: fused tensor too small for expert %d", s.Name, x)
	}
	return all[off : off+n], nil
}

// hostAdamW is torch.optim.AdamW computed on host copies, the reference the fixtures used.
type hostAdamW struct {
	m                   *Model
	lr, b1, b2, eps, wd float64
	t                   int
	mom, vel            map[string][]float64
}

func newHostAdamW(m *Model, lr, b1, b2, eps, wd float64) *hostAdamW {
	return &hostAdamW{m: m, lr: lr, b1: b1, b2: b2, eps: eps, wd: wd, mom: map[string][]float64{}, vel: map[string][]float64{}}
}

func (o *hostAdamW) step(t *testing.T) error {
	o.t++
	bc1 := 1 - math.Pow(o.b1, float64(o.t))
	bc2 := 1 - math.Pow(o.b2, float64(o.t))
	for _, s := range o.m.Specs {
		p, err := o.m.ParamFloat32(s.Name)
		if err != nil {
			return err
		}
		g, err := o.m.GradFloat32(s.Name)
		if err != nil {
			return err
		}
		if o.mom[s.Name] == nil {
			o.mom[s.Name] = make([]float64, len(p))
			o.vel[s.Name] = make([]float64, len(p))
		}
		mo, ve := o.mom[s.Name], o.vel[s.Name]
		wd := 0.0
		if s.Decay {
			wd = o.wd
		}
		for i := range p {
			pf := float64(p[i]) * (1 - o.lr*wd)
			gi := float64(g[i])
			mo[i] = o.b1*mo[i] + (1-o.b1)*gi
			ve[i] = o.b2*ve[i] + (1-o.b2)*gi*gi
			denom := math.Sqrt(ve[i])/math.Sqrt(bc2) + o.eps
			p[i] = float32(pf - o.lr/bc1*mo[i]/denom)
		}
		if err := o.m.SetParam(s.Name, p); err != nil {
			return err
		}
	}
	return nil
}
