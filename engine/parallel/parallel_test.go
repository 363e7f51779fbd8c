package parallel

import (
	"errors"
	"fmt"
	"github.com/halo-shell/halo-shell/engine/comm"
	"github.com/halo-shell/halo-shell/engine/profile"
	"github.com/halo-shell/halo-shell/engine/tensor"
	"math"
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/halo-shell/halo-shell/engine/backend"
	"github.com/halo-shell/halo-shell/engine/backend/cpu"
	"github.com/halo-shell/halo-shell/engine/hf/config"
	"github.com/halo-shell/halo-shell/engine/mesh"
	"github.com/halo-shell/halo-shell/engine/models"
	"github.com/halo-shell/halo-shell/engine/optim"
)

// tinyConfigs are small models of the dense families: 8 heads and 4 KV heads of width 4, an
// MLP of 24, biases on q/k/v/o (llama) and per-head q/k norms (qwen3).
var tinyConfigs = map[string]string{
	"llama": `{"model_type": "llama", "vocab_size": 41, "hidden_size": 16, "intermediate_size": 24,
		"num_hidden_layers": 2, "num_attention_heads": 8, "num_key_value_heads": 4, "head_dim": 4,
		"max_position_embeddings": 64, "rms_norm_eps": 1e-6, "attention_bias": true, "initializer_range": 0.2}`,
	"qwen3": `{"model_type": "qwen3", "vocab_size": 41, "hidden_size": 16, "intermediate_size": 24,
		"num_hidden_layers": 2, "num_attention_heads": 8, "num_key_value_heads": 4, "head_dim": 4,
		"max_position_embeddings": 64, "rms_norm_eps": 1e-6, "tie_word_embeddings": true, "initializer_range": 0.2}`,
	// Sliding-window attention (window 5 inside 16-token rows split into chunks of 2 to 8).
	"mistral": `{"model_type": "mistral", "vocab_size": 41, "hidden_size": 16, "intermediate_size": 24,
		"num_hidden_layers": 2, "num_attention_heads": 8, "num_key_value_heads": 4, "head_dim": 4, "sliding_window": 5,
		"max_position_embeddings": 64, "rms_norm_eps": 1e-6, "initializer_range": 0.2}`,
	// Mixture of experts: layer 0 dense, layer 1 four experts (top 2) with the auxiliary
	// load-balancing loss on.
	"qwen3_moe": `{"model_type": "qwen3_moe", "vocab_size": 41, "hidden_size": 16, "intermediate_size": 24,
		"moe_intermediate_size": 8, "num_experts": 4, "num_experts_per_tok": 2, "norm_topk_prob": true,
		"mlp_only_layers": [0], "output_router_logits": true, "router_aux_loss_coef": 0.05,
		"num_hidden_layers": 2, "num_attention_heads": 8, "num_key_value_heads": 4, "head_dim": 4,
		"max_position_embeddings": 64, "rms_norm_eps": 1e-6, "initializer_range": 0.2}`,
	// Eight experts (top 2), for eight-way expert parallelism.
	"qwen3_moe_e8": `{"model_type": "qwen3_moe", "vocab_size": 41, "hidden_size": 16, "intermediate_size": 24,
		"moe_intermediate_size": 8, "num_experts": 8, "num_experts_per_tok": 2, "norm_topk_prob": true,
		"output_router_logits": true, "router_aux_loss_coef": 0.05,
		"num_hidden_layers": 2, "num_attention_heads": 8, "num_key_value_heads": 4, "head_dim": 4,
		"max_position_embeddings": 64, "rms_norm_eps": 1e-6, "initializer_range": 0.2}`,
	"mixtral_e8": `{"model_type": "mixtral", "vocab_size": 41, "hidden_size": 16, "intermediate_size": 8,
		"num_local_experts": 8, "num_experts_per_tok": 2, "output_router_logits": true, "router_aux_loss_coef": 0.05,
		"num_hidden_layers": 2, "num_attention_heads": 8, "num_key_value_heads": 4, "head_dim": 4,
		"max_position_embeddings": 64, "rms_norm_eps": 1e-5, "initializer_range": 0.2}`,
	// q/k norms over the whole projection (no tensor parallelism), 4 experts top 2.
	"olmoe": `{"model_type": "olmoe", "vocab_size": 41, "hidden_size": 16, "intermediate_size": 8,
		"num_experts": 4, "num_experts_per_tok": 2, "output_router_logits": true, "router_aux_loss_coef": 0.05,
		"num_hidden_layers": 2, "num_attention_heads": 8, "num_key_value_heads": 4, "head_dim": 4,
		"max_position_embeddings": 64, "rms_norm_eps": 1e-5, "initializer_range": 0.2}`,
	"mixtral": `{"model_type": "mixtral", "vocab_size": 41, "hidden_size": 16, "intermediate_size": 8,
		"num_local_experts": 4, "num_experts_per_tok": 2, "output_router_logits": true, "router_aux_loss_coef": 0.05,
		"num_hidden_layers": 2, "num_attention_heads": 8, "num_key_value_heads": 4, "head_dim": 4,
		"max_position_embeddings": 64, "rms_norm_eps": 1e-5, "initializer_range": 0.2}`,
}

// arenaPad is the bytes of alignment padding in m's parameter arena (models.ArenaLayout).
func arenaPad(m *models.Model) int64 {
	n := 0
	for _, s := range m.Specs {
		n += s.Numel()
	}
	return m.Params.Flat.Bytes() - int64(n)*int64(m.Params.Flat.DType().Size())
}

func tinyModel(t testing.TB, family string, seed uint64) *models.Model {
	t.Helper()
	cfg, err := config.Parse([]byte(tinyConfigs[family]), family+".json")
	if err != nil {
		t.Fatal(err)
	}
	m, err := models.New(cfg, cpu.New(cpu.Options{Workers: 1}), models.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Close() })
	if err := m.InitRandom(seed); err != nil {
		t.Fatal(err)
	}
	// Make norm gains non-trivial so their gradients are exercised.
	rng := rand.New(rand.NewPCG(seed, 5))
	for _, s := range m.Specs {
		if s.Init != models.InitNormal {
			v := make([]float32, s.Numel())
			for i := range v {
				v[i] = 1 + 0.3*float32(rng.NormFloat64())
			}
			if err := m.SetParam(s.Name, v); err != nil {
				t.Fatal(err)
			}
		}
	}
	return m
}

// tinyRows makes n packed rows of seqLen tokens, each holding documents of uneven lengths,
// with next-token targets inside each document.
func tinyRows(n, seqLen, vocab int, seed uint64) []models.Batch {
	rng := rand.New(rand.NewPCG(seed, 11))
	rows := make([]models.Batch, n)
	for r := range rows {
		b := models.Batch{Tokens: make([]int32, seqLen), Targets: make([]int32, seqLen), DocStarts: []int32{0}}
		for i := range b.Tokens {
			b.Tokens[i] = int32(rng.IntN(vocab))
		}
		for pos := 0; pos < seqLen; {
			l := 1 + rng.IntN(seqLen*3/4)
			pos = min(pos+l, seqLen)
			b.DocStarts = append(b.DocStarts, int32(pos))
		}
		for d := 0; d+1 < len(b.DocStarts); d++ {
			for i := b.DocStarts[d]; i < b.DocStarts[d+1]; i++ {
				if i+1 < b.DocStarts[d+1] {
					b.Targets[i] = b.Tokens[i+1]
				} else {
					b.Targets[i] = backend.IgnoreIndex
				}
			}
		}
		rows[r] = b
	}
	return rows
}

// reference runs rows on the single-device model and returns the mean loss and every gradient.
func reference(t testing.TB, m *models.Model, rows []models.Batch) (float64, map[string][]float32) {
	loss, g, _ := referenceAux(t, m, rows)
	return loss, g
}

// referenceAux is reference that also returns the mean router aux loss over the rows.
func referenceAux(t testing.TB, m *models.Model, rows []models.Batch) (float64, map[string][]float32, float64) {
	t.Helper()
	n := 0
	for _, b := range rows {
		for _, x := range b.Targets {
			if x != backend.IgnoreIndex {
				n++
			}
		}
	}
	if err := m.ZeroGrads(); err != nil {
		t.Fatal(err)
	}
	if m.IsMoE() {
		// The trainer's objective: mean over micro-batches of CE + coef * aux.
		coef := m.AuxLossScale()
		m.SetAuxLossScale(coef / float64(len(rows)))
		defer m.SetAuxLossScale(coef)
	}
	sum, aux := 0.0, 0.0
	for _, b := range rows {
		s, _, err := m.ForwardBackward(b, float32(1/float64(n)))
		if err != nil {
			t.Fatal(err)
		}
		sum += s
		aux += m.AuxLoss()
	}
	g := map[string][]float32{}
	for _, s := range m.Specs {
		v, err := m.GradFloat32(s.Name)
		if err != nil {
			t.Fatal(err)
		}
		g[s.Name] = v
	}
	return sum / float64(n), g, aux / float64(len(rows))
}

// close reports whether got matches want within fp32 tolerance: |got-want| <= atol + rtol*|want|
// with atol relative to the tensor's scale.
func closeTo(got, want []float32, rtol float64) error {
	if len(got) != len(want) {
		return fmt.Errorf("%d values, want %d", len(got), len(want))
	}
	scale := 0.0
	for _, w := range want {
		scale = math.Max(scale, math.Abs(float64(w)))
	}
	for i := range got {
		d := math.Abs(float64(got[i]) - float64(want[i]))
		if d > rtol*scale+rtol*math.Abs(float64(want[i])) || math.IsNaN(float64(got[i])) {
			return fmt.Errorf("element %d = %.8g, want %.8g (scale %.3g)", i, got[i], want[i], scale)
		}
	}
	return nil
}

// supported is every layout of the support matrix exercised on 1, 2, 4 and 8 devices.
var supported = []struct {
	n      int
	layout string
}{
	{1, ""},
	{2, ""}, {2, "fsdp"}, {2, "tp=2"}, {2, "cp=2"},
	{4, ""}, {4, "fsdp"}, {4, "tp=4"}, {4, "cp=4"}, {4, "tp=2 fsdp"}, {4, "tp=2 cp=2"}, {4, "cp=2 fsdp"},
	{8, ""}, {8, "fsdp"}, {8, "cp=8"}, {8, "tp=2 cp=2"}, {8, "tp=2 cp=2 fsdp"}, {8, "tp=4 fsdp"}, {8, "cp=4 tp=2"},
	{8, "tp=4 cp=2 fsdp"},
}

func cpuDevices(n int) mesh.Devices {
	d, _ := mesh.ParseDevices(fmt.Sprintf("cpu:%d", n))
	return d
}

func newPlan(t testing.TB, src *models.Model, n int, layout string, oc optim.Config) *Plan {
	t.Helper()
	l, err := mesh.ParseLayout(layout)
	if err != nil {
		t.Fatal(err)
	}
	p, err := New(src, cpuDevices(n), l, Options{Optimizer: oc})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })
	return p
}

// supportedMoE is every layout the support matrix accepts for mixture-of-experts models.
var supportedMoE = []struct {
	n      int
	layout string
}{
	{1, ""}, {2, ""}, {2, "fsdp"}, {2, "tp=2"}, {4, ""}, {4, "fsdp"}, {4, "tp=2 fsdp"}, {8, "tp=4"}, {8, "fsdp"},
	// Expert parallelism (experts sharded over the expert group), with data parallelism, FSDP,
	// tensor parallelism and expert-tensor parallelism.
	{2, "ep=2"}, {4, "ep=4"}, {4, "ep=2"}, {8, "ep=4"}, {4, "ep=2 fsdp"}, {8, "ep=4 fsdp"},
	{4, "ep=2 tp=2"}, {2, "tp=2 etp=2"}, {4, "ep=2 tp=2 etp=2"}, {8, "ep=2 tp=2 etp=2 fsdp"}, {8, "ep=4 tp=2 etp=2"},
}

func TestLayoutsMatchSingleDeviceLossAndGradients(t *testing.T) {
	checkLayouts(t, []string{"llama", "qwen3", "mistral"}, supported)
}

func TestMoELayoutsMatchSingleDeviceLossAndGradients(t *testing.T) {
	checkLayouts(t, []string{"qwen3_moe", "mixtral"}, supportedMoE)
}

// eightExperts are the layouts that need eight experts: one expert per rank on eight devices.
var eightExperts = []struct {
	n      int
	layout string
}{{8, "ep=8"}, {8, "ep=8 fsdp"}, {8, "ep=4 tp=2 etp=2 fsdp"}}

func TestOLMoEExpertLayoutsMatchSingleDevice(t *testing.T) {
	checkLayouts(t, []string{"olmoe"}, []struct {
		n      int
		layout string
	}{{2, "ep=2"}, {4, "ep=4"}, {4, "ep=2 fsdp"}})
}

func TestEightWayExpertLayoutsMatchSingleDevice(t *testing.T) {
	checkLayouts(t, []string{"qwen3_moe_e8", "mixtral_e8"}, eightExperts)
}

func checkLayouts(t *testing.T, families []string, layouts []struct {
	n      int
	layout string
}) {
	for _, family := range families {
		src := tinyModel(t, family, 3)
		rows := tinyRows(8, 16, 41, 4)
		wantLoss, wantGrads, wantAux := referenceAux(t, src, rows)
		if src.IsMoE() && !(wantAux > 0) {
			t.Fatalf("%s: aux loss %v: the test would not exercise it", family, wantAux)
		}
		for _, tc := range layouts {
			t.Run(fmt.Sprintf("%s/%d/%s", family, tc.n, strings.ReplaceAll(tc.layout, " ", ",")), func(t *testing.T) {
				p := newPlan(t, src, tc.n, tc.layout, optim.Config{})
				loss, _, err := p.ForwardBackward(rows)
				if err != nil {
					t.Fatal(err)
				}
				if math.Abs(loss-wantLoss) > 1e-6*math.Abs(wantLoss) {
					t.Errorf("loss %.9g, single device %.9g", loss, wantLoss)
				}
				if aux := p.AuxLoss(); math.Abs(aux-wantAux) > 1e-6*math.Abs(wantAux) {
					t.Errorf("aux loss %.9g, single device %.9g", aux, wantAux)
				}
				grads, err := p.Grads()
				if err != nil {
					t.Fatal(err)
				}
				for _, s := range src.Specs {
					if err := closeTo(grads[s.Name], wantGrads[s.Name], 1e-5); err != nil {
						t.Errorf("gradient %s (%s): %v", s.Name, p.Placement(s.Name), err)
					}
				}
			})
		}
	}
}

const trainLR, trainMaxNorm = 1e-2, 0.5

var trainOpt = optim.Config{WeightDecay: 0.1}

func trainBatches(steps int) [][]models.Batch {
	batches := make([][]models.Batch, steps)
	for i := range batches {
		batches[i] = tinyRows(8, 16, 41, uint64(100+i))
	}
	return batches
}

// refTraining runs steps of AdamW with global-norm clipping on a single device and returns the
// losses, gradient norms, the trained model and its optimizer.
func refTraining(t *testing.T, family string, steps int) (want, wantNorm []float64, ref *models.Model, opt *optim.AdamW) {
	t.Helper()
	ref = tinyModel(t, family, 8)
	var params []optim.Param
	var grads []backend.T
	if err := ref.EnableGrads(); err != nil {
		t.Fatal(err)
	}
	for i, s := range ref.Specs {
		params = append(params, optim.Param{Name: s.Name, Value: ref.Params.Views[i], Grad: ref.Grads.Views[i], NoDecay: !s.Decay})
		grads = append(grads, ref.Grads.Views[i])
	}
	opt, err := optim.NewAdamW(ref.Backend(), params, trainOpt)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(opt.Free)
	for _, rows := range trainBatches(steps) {
		loss, _ := reference(t, ref, rows)
		norm, err := optim.GradNorm(ref.Backend(), grads)
		if err != nil {
			t.Fatal(err)
		}
		if err := opt.Step(trainLR, optim.ClipCoef(norm, trainMaxNorm)); err != nil {
			t.Fatal(err)
		}
		want, wantNorm = append(want, loss), append(wantNorm, norm)
	}
	return want, wantNorm, ref, opt
}

// trainSteps runs batches on p and checks losses and gradient norms against the reference from
// step index first on.
func trainSteps(t *testing.T, p *Plan, batches [][]models.Batch, first int, want, wantNorm []float64) {
	t.Helper()
	for i := first; i < len(batches); i++ {
		loss, _, err := p.ForwardBackward(batches[i])
		if err != nil {
			t.Fatal(err)
		}
		norm, err := p.Step(trainLR, trainMaxNorm)
		if err != nil {
			t.Fatal(err)
		}
		if math.Abs(loss-want[i]) > 1e-4*math.Abs(want[i]) {
			t.Errorf("step %d: loss %.9g, single device %.9g", i+1, loss, want[i])
		}
		if math.Abs(norm-wantNorm[i]) > 1e-5*wantNorm[i] {
			t.Errorf("step %d: gradient norm %.9g, single device %.9g", i+1, norm, wantNorm[i])
		}
	}
}

// expertLayouts are the layouts of supportedMoE with expert or expert-tensor parallelism.
func expertLayouts() (out []struct {
	n      int
	layout string
}) {
	for _, l := range supportedMoE {
		if strings.Contains(l.layout, "ep=") {
			out = append(out, l)
		}
	}
	return out
}

func TestLayoutsTrackSingleDeviceTraining(t *testing.T) {
	const steps = 5
	for _, fam := range []struct {
		name    string
		layouts []struct {
			n      int
			layout string
		}
	}{{"qwen3", supported}, {"qwen3_moe", supportedMoE}, {"mixtral", expertLayouts()}, {"qwen3_moe_e8", eightExperts}} {
		src := tinyModel(t, fam.name, 8)
		batches := trainBatches(steps)
		want, wantNorm, ref, _ := refTraining(t, fam.name, steps)
		// The steps must move the weights, or matching them would show nothing.
		w0, _ := src.ParamFloat32("model.layers.1.self_attn.q_proj.weight")
		w5, _ := ref.ParamFloat32("model.layers.1.self_attn.q_proj.weight")
		if closeTo(w5, w0, 1e-2) == nil {
			t.Fatalf("%s: %d reference steps leave the weights within 1%% of their start", fam.name, steps)
		}
		for _, tc := range fam.layouts {
			t.Run(fmt.Sprintf("%s/%d/%s", fam.name, tc.n, strings.ReplaceAll(tc.layout, " ", ",")), func(t *testing.T) {
				p := newPlan(t, src, tc.n, tc.layout, trainOpt)
				trainSteps(t, p, batches, 0, want, wantNorm)
				// The trained weights gather into an ordinary single-device model.
				final := tinyModel(t, fam.name, 99)
				if err := p.Gather(final); err != nil {
					t.Fatal(err)
				}
				for _, s := range ref.Specs {
					got, _ := final.ParamFloat32(s.Name)
					w, _ := ref.ParamFloat32(s.Name)
					if err := closeTo(got, w, 1e-4); err != nil {
						t.Errorf("parameter %s after %d steps: %v", s.Name, steps, err)
					}
				}
			})
		}
	}
}

func TestUnsupportedLayoutsAreRefusedBeforeLoading(t *testing.T) {
	dense, moe := tinyModel(t, "llama", 1), tinyModel(t, "qwen3_moe", 1)
	for _, tc := range []struct {
		src    *models.Model
		n      int
		layout string
		rule   string
	}{
		{dense, 8, "tp=8", mesh.RuleTPHeads},
		{dense, 6, "tp=4", mesh.RuleDegrees},
		{dense, 2, "ep=2", mesh.RuleEPExperts},
		{moe, 3, "ep=3", mesh.RuleEPExperts},
		{moe, 4, "ep=4 tp=2", mesh.RuleEPExperts},
		{moe, 2, "etp=2", mesh.RuleETP},
		{moe, 4, "ep=2 cp=2", mesh.RuleSupport},
		{moe, 2, "cp=2", mesh.RuleSupport},
		{moe, 4, "cp=2 tp=2", mesh.RuleSupport},
	} {
		l, err := mesh.ParseLayout(tc.layout)
		if err != nil {
			t.Fatal(err)
		}
		opened := 0
		_, err = New(tc.src, cpuDevices(tc.n), l, Options{NewBackend: func(int) (backend.Backend, error) {
			opened++
			return cpu.New(cpu.Options{Workers: 1}), nil
		}})
		var le *mesh.LayoutError
		if !errors.As(err, &le) || le.Rule != tc.rule {
			t.Errorf("%s on %d (%s): got %v, want refusal by rule %s", tc.layout, tc.n, tc.src.Arch.ModelType, err, tc.rule)
			continue
		}
		if opened != 0 {
			t.Errorf("%s: %d devices were opened before the refusal", tc.layout, opened)
		}
	}
}

func TestForwardBackwardRejectsRowsThatDoNotSplit(t *testing.T) {
	src := tinyModel(t, "llama", 1)
	p := newPlan(t, src, 4, "cp=2", optim.Config{})
	for _, tc := range []struct {
		rows []models.Batch
		want string
	}{
		{tinyRows(3, 16, 41, 1), "3 rows do not split over data_parallel_size 2"},
		{tinyRows(2, 10, 41, 1), "multiple of 4"},
		{[]models.Batch{{Tokens: make([]int32, 8)}, {Tokens: make([]int32, 8)}}, "no targets"},
	} {
		if _, _, err := p.ForwardBackward(tc.rows); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("got %v, want an error containing %q", err, tc.want)
		}
	}
}

// savedFromLayout runs one training step of a tiny family model under layout on n devices,
// gathers the plan into a fresh single-device model, saves that as a Hugging Face checkpoint
// and loads it back; every loaded parameter must equal the plan's. It returns the source model
// (the weights before the step) and the loaded one.
func savedFromLayout(t *testing.T, family string, n int, layout string, rows []models.Batch) (src, back *models.Model) {
	t.Helper()
	src = tinyModel(t, family, 2)
	p := newPlan(t, src, n, layout, optim.Config{})
	if _, _, err := p.ForwardBackward(rows); err != nil {
		t.Fatal(err)
	}
	if _, err := p.Step(1e-2, 1); err != nil {
		t.Fatal(err)
	}
	full := tinyModel(t, family, 77)
	if err := p.Gather(full); err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	if err := full.Save(dir, models.SaveOptions{}); err != nil {
		t.Fatal(err)
	}
	back, err := models.Load(dir, cpu.New(cpu.Options{Workers: 1}), models.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { back.Close() })
	ps, err := p.Params()
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range src.Specs {
		got, _ := back.ParamFloat32(s.Name)
		if err := closeTo(got, ps[s.Name], 0); err != nil {
			t.Errorf("%s: %v", s.Name, err)
		}
	}
	return src, back
}

func TestCheckpointFromAnyLayoutIsAnOrdinaryCheckpoint(t *testing.T) {
	src, back := savedFromLayout(t, "llama", 8, "tp=2 cp=2 fsdp", tinyRows(2, 16, 41, 3))
	changed := false
	for _, s := range src.Specs {
		got, _ := back.ParamFloat32(s.Name)
		before, _ := src.ParamFloat32(s.Name)
		changed = changed || closeTo(got, before, 0) != nil
	}
	if !changed {
		t.Error("the saved weights equal the initial ones: the step did not reach the checkpoint")
	}
}

func TestCollectivesAreCountedAndRecorded(t *testing.T) {
	src := tinyModel(t, "llama", 1)
	p := newPlan(t, src, 4, "tp=2 fsdp", optim.Config{})
	rec := profile.NewRecorder()
	rec.Enable(true, true)
	p.SetRecorder(rec)
	rec.BeginStep(1)
	if _, _, err := p.ForwardBackward(tinyRows(2, 16, 41, 3)); err != nil {
		t.Fatal(err)
	}
	if _, err := p.Step(1e-2, 0); err != nil {
		t.Fatal(err)
	}
	step, ok := rec.EndStep()
	if !ok {
		t.Fatal("no step recorded")
	}
	kinds := map[string]int{}
	for _, sp := range step.Spans {
		if sp.Comm {
			kinds[sp.Class]++
			if sp.Group == "" || sp.Bytes < 0 {
				t.Errorf("span %+v has no group", sp)
			}
		}
	}
	// TP all-reduces activations; FSDP reduce-scatters gradients and all-gathers parameters.
	for _, k := range []string{profile.CommAllReduce, profile.CommReduceScatter, profile.CommAllGather} {
		if kinds[k] == 0 {
			t.Errorf("no %s span recorded (got %v)", k, kinds)
		}
	}
	st := p.CommStats()
	// Per rank: one reduce-scatter of the gradient arena and one all-gather of parameters.
	for r, s := range st {
		if s[comm.KindReduceScatter].Calls != 1 || s[comm.KindAllGather].Calls != 1 {
			t.Errorf("rank %d: %d reduce-scatters and %d all-gathers, want 1 and 1", r, s[comm.KindReduceScatter].Calls, s[comm.KindAllGather].Calls)
		}
		// 2 layers x (o_proj + down_proj forward, q/k/v + gate/up input gradients) = 8 tensor
		// all-reduces per row, 1 row per data rank, plus 1 for the gradient norm.
		if got := s[comm.KindAllReduce].Calls; got != 9 {
			t.Errorf("rank %d: %d all-reduces, want 9", r, got)
		}
	}
}

func TestMemoryEstimateMatchesAllocatedState(t *testing.T) {
	type layout = struct {
		n      int
		layout string
	}
	common := []layout{{1, ""}, {2, "fsdp"}, {4, "tp=2"}, {4, "tp=2 fsdp"}, {8, "fsdp"}, {8, "tp=4 fsdp"}}
	for _, family := range []string{"llama", "qwen3", "qwen3_moe", "mixtral"} {
		src := tinyModel(t, family, 1)
		layouts := common
		if src.IsMoE() {
			// mixtral's experts sit in two layers, so a rank's experts are two blocks of its
			// arena that FSDP stages together; qwen3_moe's are one block.
			layouts = append(layouts, layout{2, "ep=2"}, layout{4, "ep=4"}, layout{4, "ep=2 fsdp"},
				layout{2, "ep=2 fsdp"}, layout{8, "ep=4 fsdp"}, layout{8, "ep=2 fsdp"},
				layout{2, "tp=2 etp=2"}, layout{8, "ep=2 tp=2 etp=2"}, layout{8, "ep=2 tp=2 etp=2 fsdp"})
		}
		for _, tc := range layouts {
			p := newPlan(t, src, tc.n, tc.layout, optim.Config{})
			est := mesh.Estimate(p.Mesh.Layout, ShapeOf(src), mesh.Workload{SeqLen: 16})
			want := est.Params + est.Grads + est.Optimizer
			for _, rk := range p.ranks {
				pads := rk.shard.pack.Bytes()
				got := rk.dev.MemStats().Allocated - pads
				// The rank also holds its RoPE table (a few bytes), and its arenas (and under
				// FSDP its shards) the alignment padding between parameters.
				pad := 3 * arenaPad(rk.m)
				if d := got - want; d < 0 || d > 256+pad {
					t.Errorf("%s %d %q rank %d: allocated %d bytes, estimate of params+grads+optimizer %d (%s)", family, tc.n, tc.layout, rk.id, got, want, est)
				}
				if pads > est.Comm+pad {
					t.Errorf("%s %d %q rank %d: FSDP buffers of %d bytes exceed the comm estimate %d", family, tc.n, tc.layout, rk.id, pads, est.Comm)
				}
			}
		}
	}
}

// Expert parallelism divides expert memory: a rank's parameter and gradient arenas hold the
// dense parameters and E/EP experts per MoE layer, and with FSDP its shards hold a 1/(DP·CP/EP)
// part of those experts.
func TestExpertParallelShardsExpertMemory(t *testing.T) {
	src := tinyModel(t, "qwen3_moe_e8", 1)
	var dense, experts int64 // bytes in the full model
	for _, s := range src.Specs {
		if _, ok := src.ExpertOf(s.Name); ok {
			experts += int64(s.Numel()) * 4
		} else {
			dense += int64(s.Numel()) * 4
		}
	}
	for _, tc := range []struct {
		n      int
		layout string
		ep     int64 // experts held: 1/ep of them
		eshard int64 // FSDP: the shard of the held experts is 1/eshard of them (0: no FSDP)
	}{
		{4, "", 1, 0}, {2, "ep=2", 2, 0}, {4, "ep=4", 4, 0}, {8, "ep=8", 8, 0}, {8, "ep=4", 4, 0},
		{8, "ep=4 fsdp", 4, 2}, {8, "ep=2 fsdp", 2, 4}, {4, "ep=4 fsdp", 4, 1},
	} {
		p := newPlan(t, src, tc.n, tc.layout, optim.Config{})
		for _, rk := range p.ranks {
			want := dense + experts/tc.ep + arenaPad(rk.m)
			if got := rk.m.Params.Flat.Bytes(); got != want {
				t.Errorf("%d %q rank %d: parameter arena of %d bytes, want %d (dense %d + experts %d/%d)", tc.n, tc.layout, rk.id, got, want, dense, experts, tc.ep)
			}
			if got := rk.m.Grads.Flat.Bytes(); got != want {
				t.Errorf("%d %q rank %d: gradient arena of %d bytes, want %d", tc.n, tc.layout, rk.id, got, want)
			}
			if tc.eshard == 0 {
				continue
			}
			if len(rk.shard.parts) != 2 {
				t.Fatalf("%d %q rank %d: %d FSDP parts, want dense and experts", tc.n, tc.layout, rk.id, len(rk.shard.parts))
			}
			ex := rk.shard.parts[1]
			if tc.eshard == 1 {
				// No replicas: the experts are updated in place, without a shard copy.
				if !ex.local || !ex.param.IsNil() || !ex.grad.IsNil() {
					t.Errorf("%d %q rank %d: experts without replicas have a shard (local %v)", tc.n, tc.layout, rk.id, ex.local)
				}
				continue
			}
			if got, want := ex.param.Bytes(), experts/tc.ep/tc.eshard; got != want || ex.c.Size() != int(tc.eshard) {
				t.Errorf("%d %q rank %d: expert shard of %d bytes over %d ranks, want %d over %d", tc.n, tc.layout, rk.id, got, ex.c.Size(), want, tc.eshard)
			}
		}
	}
}

func TestDryRunPrintsMeshAndMemoryOrRefuses(t *testing.T) {
	cfg, err := config.Parse([]byte(tinyConfigs["qwen3"]), "qwen3.json")
	if err != nil {
		t.Fatal(err)
	}
	var out strings.Builder
	l, _ := mesh.ParseLayout("tp=2 fsdp")
	if err := DryRun(&out, cfg, cpuDevices(8), l, mesh.Workload{SeqLen: 64}); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"layout:  dp=4 fsdp tp=2", "groups tp:   [[0 1] [2 3] [4 5] [6 7]]", "groups data: [[0 2 4 6] [1 3 5 7]]", "optimizer", "comm buffers", "total"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("output lacks %q:\n%s", want, out.String())
		}
	}
	if !strings.HasSuffix(out.String(), "\n") {
		t.Errorf("output does not end with a newline: %q", out.String())
	}
	out.Reset()
	l, _ = mesh.ParseLayout("tp=8")
	err = DryRun(&out, cfg, cpuDevices(8), l, mesh.Workload{SeqLen: 64})
	var le *mesh.LayoutError
	if !errors.As(err, &le) || le.Suggest.TP != 4 || out.Len() != 0 {
		t.Errorf("tp=8 on 4 kv heads: got %v (suggest %+v), output %q", err, le, out.String())
	}
}

func TestOptimizerStateIsLayoutFree(t *testing.T) {
	const steps = 2
	src := tinyModel(t, "qwen3", 8)
	_, _, _, refOpt := refTraining(t, "qwen3", steps)
	refStep, refState, err := refOpt.Export()
	if err != nil {
		t.Fatal(err)
	}
	batches := trainBatches(steps)
	for _, tc := range []struct {
		n      int
		layout string
	}{{1, ""}, {2, "fsdp"}, {4, "tp=2 fsdp"}, {8, "tp=2 cp=2 fsdp"}, {4, "tp=4"}} {
		p := newPlan(t, src, tc.n, tc.layout, trainOpt)
		for _, rows := range batches {
			if _, _, err := p.ForwardBackward(rows); err != nil {
				t.Fatal(err)
			}
			if _, err := p.Step(trainLR, trainMaxNorm); err != nil {
				t.Fatal(err)
			}
		}
		step, st, err := p.OptimizerState()
		if err != nil {
			t.Fatal(err)
		}
		if p.Steps() != steps {
			t.Errorf("%q: Steps() = %d after %d steps", tc.layout, p.Steps(), steps)
		}
		if step != refStep || len(st) != len(refState) {
			t.Fatalf("%q: step %d with %d tensors, single device step %d with %d", tc.layout, step, len(st), refStep, len(refState))
		}
		for i, ref := range refState {
			if st[i].Name != ref.Name || fmt.Sprint(st[i].Shape) != fmt.Sprint(ref.Shape) {
				t.Fatalf("%q: tensor %d is %s %v, single device %s %v", tc.layout, i, st[i].Name, st[i].Shape, ref.Name, ref.Shape)
			}
			got, _ := tensor.DecodeFloat32(st[i].DType, st[i].Data)
			want, _ := tensor.DecodeFloat32(ref.DType, ref.Data)
			if err := closeTo(got, want, 1e-4); err != nil {
				t.Errorf("%d %q: %s: %v", tc.n, tc.layout, ref.Name, err)
			}
		}
	}
}

func TestRelayoutKeepsTrainingOnTrack(t *testing.T) {
	const steps = 5
	src := tinyModel(t, "qwen3", 8)
	batches := trainBatches(steps)
	want, wantNorm, _, _ := refTraining(t, "qwen3", steps)
	for _, tc := range []struct {
		n1      int
		layout1 string
		n2      int
		layout2 string
	}{
		{4, "tp=2 fsdp", 8, "cp=2 tp=2 fsdp"},
		{8, "fsdp", 2, "tp=2"},
		{2, "cp=2", 1, ""},
	} {
		t.Run(tc.layout1+" to "+tc.layout2, func(t *testing.T) {
			l1, _ := mesh.ParseLayout(tc.layout1)
			p, err := New(src, cpuDevices(tc.n1), l1, Options{Optimizer: trainOpt})
			if err != nil {
				t.Fatal(err)
			}
			trainSteps(t, p, batches[:2], 0, want, wantNorm)
			// An invalid target is refused and the run continues in the old layout.
			bad, _ := mesh.ParseLayout("tp=8")
			if _, err := p.Relayout(cpuDevices(8), bad, Options{Optimizer: trainOpt}); err == nil {
				t.Fatal("tp=8 accepted for 4 key/value heads")
			}
			trainSteps(t, p, batches[:3], 2, want, wantNorm)
			l2, _ := mesh.ParseLayout(tc.layout2)
			np, err := p.Relayout(cpuDevices(tc.n2), l2, Options{Optimizer: trainOpt})
			if err != nil {
				t.Fatal(err)
			}
			defer np.Close()
			trainSteps(t, np, batches, 3, want, wantNorm)
		})
	}
}

func TestFailingRankDoesNotHangTheOthers(t *testing.T) {
	src := tinyModel(t, "llama", 1)
	probe := newPlan(t, src, 4, "tp=2", optim.Config{})
	state := probe.ranks[3].dev.MemStats().Allocated
	// Rank 3 can hold its weights and optimizer but not the activations of a step.
	l, _ := mesh.ParseLayout("tp=2")
	p, err := New(src, cpuDevices(4), l, Options{NewBackend: func(r int) (backend.Backend, error) {
		o := cpu.Options{Workers: 1}
		if r == 3 {
			o.MemoryLimit = state + 512
		}
		return cpu.New(o), nil
	}})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	rows := tinyRows(2, 16, 41, 1)
	if _, _, err := p.ForwardBackward(rows); err == nil || !strings.Contains(err.Error(), "rank 3") {
		t.Fatalf("got %v, want rank 3's allocation failure", err)
	}
	if _, _, err := p.ForwardBackward(rows); err == nil || !strings.Contains(err.Error(), "earlier step failed") {
		t.Fatalf("second step: got %v", err)
	}
	// The weights are still readable and the run continues in a new plan.
	np, err := p.Relayout(cpuDevices(2), mesh.Layout{}, Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer np.Close()
	if _, _, err := np.ForwardBackward(rows); err != nil {
		t.Fatal(err)
	}
}

func TestForwardBackwardRejectsBadRows(t *testing.T) {
	src := tinyModel(t, "llama", 1)
	p := newPlan(t, src, 2, "", optim.Config{})
	good := tinyRows(2, 8, 41, 1)
	for _, tc := range []struct {
		edit func(b *models.Batch)
		want string
	}{
		{func(b *models.Batch) { b.Tokens[3] = 41 }, "token 41 at position 3 is outside the vocabulary [0,41)"},
		{func(b *models.Batch) { b.Targets[2] = -5 }, "target -5 at position 2"},
		{func(b *models.Batch) { b.Targets = b.Targets[:4] }, "8 tokens and 4 targets"},
		{func(b *models.Batch) { b.DocStarts = []int32{0, 5, 5, 8} }, "strictly increasing"},
		{func(b *models.Batch) { b.DocStarts = []int32{0, 7} }, "end at 8"},
	} {
		rows := tinyRows(2, 8, 41, 1)
		tc.edit(&rows[1])
		if _, _, err := p.ForwardBackward(rows); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("got %v, want an error containing %q", err, tc.want)
		}
	}
	// Refused input leaves the plan usable.
	if _, _, err := p.ForwardBackward(good); err != nil {
		t.Fatal(err)
	}
}

func TestPerRankProfilesSplitComputeAndCollectives(t *testing.T) {
	src := tinyModel(t, "llama", 1)
	recs := []*profile.Recorder{profile.NewRecorder(), profile.NewRecorder()}
	l, _ := mesh.ParseLayout("cp=2")
	p, err := New(src, cpuDevices(2), l, Options{NewBackend: func(r int) (backend.Backend, error) {
		return profile.Wrap(cpu.New(cpu.Options{Workers: 1}), recs[r]), nil
	}})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	for r, rec := range recs {
		p.SetRankRecorder(r, rec)
		rec.Enable(true, false)
		rec.BeginStep(1)
	}
	if _, _, err := p.ForwardBackward(tinyRows(1, 16, 41, 2)); err != nil {
		t.Fatal(err)
	}
	for r, rec := range recs {
		st, ok := rec.EndStep()
		if !ok {
			t.Fatalf("rank %d: no step", r)
		}
		if st.Compute[profile.ClassAttention] <= 0 || st.Comm[profile.CommAllGather] <= 0 || st.Comm[profile.CommReduceScatter] <= 0 || st.Comm[profile.CommAllReduce] <= 0 {
			t.Errorf("rank %d: compute %v, comm %v: want attention compute, all-gather (keys, values), reduce-scatter (their gradients) and all-reduce (weight gradients)", r, st.Compute, st.Comm)
		}
	}
}

func TestBF16LayoutsStayCloseToSingleDevice(t *testing.T) {
	type layout = struct {
		n      int
		layout string
	}
	for _, fam := range []struct {
		name    string
		layouts []layout
	}{
		{"qwen3", []layout{{2, "fsdp"}, {2, "tp=2"}, {2, "cp=2"}, {8, "tp=2 cp=2 fsdp"}}},
		{"qwen3_moe", []layout{{4, "ep=2"}, {4, "ep=4 fsdp"}, {4, "ep=2 tp=2 etp=2"}}},
	} {
		cfg, err := config.Parse([]byte(tinyConfigs[fam.name]), fam.name+".json")
		if err != nil {
			t.Fatal(err)
		}
		src, err := models.New(cfg, cpu.New(cpu.Options{Workers: 1}), models.Options{DType: tensor.BF16})
		if err != nil {
			t.Fatal(err)
		}
		defer src.Close()
		if err := src.InitRandom(3); err != nil {
			t.Fatal(err)
		}
		rows := tinyRows(4, 16, 41, 4)
		wantLoss, wantGrads := reference(t, src, rows)
		for _, tc := range fam.layouts {
			p := newPlan(t, src, tc.n, tc.layout, optim.Config{})
			loss, _, err := p.ForwardBackward(rows)
			if err != nil {
				t.Fatal(err)
			}
			// bf16 activations round at different points when reductions are split: a few ulps.
			if math.Abs(loss-wantLoss) > 1e-2*wantLoss {
				t.Errorf("%s %q: loss %.6g, single device %.6g", fam.name, tc.layout, loss, wantLoss)
			}
			grads, err := p.Grads()
			if err != nil {
				t.Fatal(err)
			}
			// bf16 gradients accumulate over rows and ranks in a different order; measured
			// differences reach about 2% of a tensor's largest element (a few bf16 ulps).
			for _, s := range src.Specs {
				if err := closeTo(grads[s.Name], wantGrads[s.Name], 5e-2); err != nil {
					t.Errorf("%s %q: gradient %s: %v", fam.name, tc.layout, s.Name, err)
				}
			}
			if _, err := p.Step(1e-3, 1); err != nil {
				t.Errorf("%s %q: step: %v", fam.name, tc.layout, err)
			}
		}
	}
}

func TestSetWeightDecayReachesEveryShard(t *testing.T) {
	src := tinyModel(t, "llama", 1)
	rows := tinyRows(2, 16, 41, 1)
	run := func(wd float64) map[string][]float32 {
		p := newPlan(t, src, 4, "tp=2 fsdp", optim.Config{})
		p.SetWeightDecay(wd)
		if _, _, err := p.ForwardBackward(rows); err != nil {
			t.Fatal(err)
		}
		if _, err := p.Step(1e-2, 0); err != nil {
			t.Fatal(err)
		}
		ps, err := p.Params()
		if err != nil {
			t.Fatal(err)
		}
		return ps
	}
	plain, decayed := run(0), run(0.5)
	for _, s := range src.Specs {
		before, _ := src.ParamFloat32(s.Name)
		for i := range before {
			// AdamW decays w by lr·wd·w before the update: the difference is exactly that.
			want := float64(before[i]) * 1e-2 * 0.5
			got := float64(plain[s.Name][i] - decayed[s.Name][i])
			if s.Decay && math.Abs(got-want) > 1e-6+1e-3*math.Abs(want) {
				t.Fatalf("%s[%d]: decay moved it by %.6g, want %.6g", s.Name, i, got, want)
			}
			if !s.Decay && got != 0 {
				t.Fatalf("%s[%d]: a no-decay parameter moved by %.6g", s.Name, i, got)
			}
		}
	}
}
