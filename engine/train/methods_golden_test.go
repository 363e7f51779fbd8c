package train

import (
	"encoding/json"
	"errors"
	"math"
	"os"
	"path/filepath"
	"testing"

	"github.com/halo-shell/halo-shell/engine/backend/cpu"
	"github.com/halo-shell/halo-shell/engine/data"
	"github.com/halo-shell/halo-shell/engine/hf/safetensors"
	"github.com/halo-shell/halo-shell/engine/models"
)

// methodsGoldens is where scripts/gpu/methods_ref.py writes its torch references.
const methodsGoldens = "testdata/methods"

// goldenFile is golden.json of scripts/gpu/methods_ref.py.
type goldenFile struct {
	Pairs []struct {
		Prompt, Chosen, Rejected []int32
	} `json:"pairs"`
	KTO []struct {
		Prompt, Completion []int32
		Label              bool
	} `json:"kto"`
	Cases map[string]goldenCase `json:"cases"`
}

type goldenCase struct {
	Method                   string    `json:"method"`
	Beta                     float64   `json:"beta"`
	LossType                 string    `json:"loss_type"`
	LabelSmoothing           float64   `json:"label_smoothing"`
	TargetMargin             float64   `json:"target_margin"`
	MarginRampRatio          float64   `json:"margin_ramp_ratio"`
	AnchorWeight             float64   `json:"anchor_weight"`
	Step                     int       `json:"step"`
	Total                    int       `json:"total"`
	DesirableWeight          float64   `json:"desirable_weight"`
	UndesirableWeight        float64   `json:"undesirable_weight"`
	CenterRewardsCoefficient float64   `json:"center_rewards_coefficient"`
	Loss                     float64   `json:"loss"`
	ScoresChosen             []float64 `json:"scores_chosen"`
	ScoresRejected           []float64 `json:"scores_rejected"`
}

// TestMethodsMatchTorchGoldens compares every loss and its gradient with the torch references
// that scripts/gpu/methods_ref.py writes from TRL's formulas on tiny models transformers made
// (policy, reference and reward model): the loss within 1e-5 relative, each parameter's
// gradient within 1e-3 relative L2, the reward model's scores within 1e-4.
func TestMethodsMatchTorchGoldens(t *testing.T) {
	raw, err := os.ReadFile(filepath.Join(methodsGoldens, "golden.json"))
	if errors.Is(err, os.ErrNotExist) {
		t.Skip("no torch goldens: run python3 scripts/gpu/methods_ref.py --out engine/train/testdata/methods where torch and transformers are installed")
	}
	if err != nil {
		t.Fatal(err)
	}
	var g goldenFile
	if err := json.Unmarshal(raw, &g); err != nil {
		t.Fatal(err)
	}
	b := cpu.New(cpu.Options{})
	defer b.Close()
	load := func(name string) *models.Model {
		m, err := models.Load(filepath.Join(methodsGoldens, name), b, models.Options{})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { m.Close() })
		return m
	}
	policy, ref, rm := load("policy"), load("ref"), load("rm")

	var pairDocs, ktoDocs []data.Document
	var ktoSide prefSet
	for _, p := range g.Pairs {
		c, ct, _ := sequence(p.Prompt, p.Chosen, 1<<20)
		r, rt, _ := sequence(p.Prompt, p.Rejected, 1<<20)
		pairDocs = append(pairDocs, segmentsDoc([][]int32{c, r}, [][]bool{ct, rt}))
	}
	for i, e := range g.KTO {
		next := g.KTO[(i+1)%len(g.KTO)].Completion
		c, ct, _ := sequence(e.Prompt, e.Completion, 1<<20)
		k, kt, _ := sequence(e.Prompt, next, 1<<20)
		ktoDocs = append(ktoDocs, segmentsDoc([][]int32{c, k}, [][]bool{ct, kt}))
		ktoSide.docs = append(ktoSide.docs, prefDoc{label: e.Label})
	}
	refRun := func(b data.Batch) ([]float32, error) { return ref.TokenLogprobs(toModelBatch(b)) }
	pairSide := prefSet{docs: make([]prefDoc, len(pairDocs))}
	if err := fillReference(pairDocs, &pairSide, refRun, len(pairDocs)); err != nil {
		t.Fatal(err)
	}
	if err := fillReference(ktoDocs, &ktoSide, refRun, len(ktoDocs)); err != nil {
		t.Fatal(err)
	}
	all := func(n int) []int {
		idx := make([]int, n)
		for i := range idx {
			idx[i] = i
		}
		return idx
	}
	for name, c := range g.Cases {
		t.Run(name, func(t *testing.T) {
			var obj Objective
			docs, m := pairDocs, policy
			switch c.Method {
			case MethodDPO:
				obj = &prefObjective{loss: dpoLoss(c.Beta, c.LabelSmoothing, c.LossType == "ipo"), train: pairSide, ref: &reference{}}
			case MethodSMPO:
				obj = &prefObjective{loss: smpoLoss(c.Beta, c.TargetMargin, c.MarginRampRatio, c.AnchorWeight), train: pairSide}
			case MethodKTO:
				obj, docs = &prefObjective{loss: ktoLoss(c.Beta, c.DesirableWeight, c.UndesirableWeight), train: ktoSide, ref: &reference{}}, ktoDocs
			case MethodReward:
				obj, m = rewardObjective{center: c.CenterRewardsCoefficient}, rm
			default:
				t.Fatalf("unknown method %q in golden.json", c.Method)
			}
			batch := data.Assemble(docs, all(len(docs)))
			if c.Method == MethodReward {
				scores, err := m.Scores(toModelBatch(batch))
				if err != nil {
					t.Fatal(err)
				}
				for i := range c.ScoresChosen {
					if math.Abs(float64(scores[2*i])-c.ScoresChosen[i]) > 1e-4 || math.Abs(float64(scores[2*i+1])-c.ScoresRejected[i]) > 1e-4 {
						t.Errorf("pair %d: scores %v, %v; transformers %v, %v", i, scores[2*i], scores[2*i+1], c.ScoresChosen[i], c.ScoresRejected[i])
					}
				}
			}
			if err := m.ZeroGrads(); err != nil {
				t.Fatal(err)
			}
			units := obj.Units(batch)
			lossSum, _, err := obj.ForwardBackward(m, batch, units, StepAt{Step: c.Step, Total: c.Total})
			if err != nil {
				t.Fatal(err)
			}
			if got := lossSum / float64(units); !near(got, c.Loss, 1e-5) {
				t.Errorf("loss %.8g, torch %.8g", got, c.Loss)
			}
			f, err := safetensors.Open(filepath.Join(methodsGoldens, "grads_"+name+".safetensors"))
			if err != nil {
				t.Fatal(err)
			}
			defer f.Close()
			for _, s := range m.Specs {
				info, ok := f.Tensor(s.Name)
				if !ok {
					t.Errorf("%s: no torch gradient", s.Name)
					continue
				}
				want, err := safetensors.ToFloat32(info)
				if err != nil {
					t.Fatal(err)
				}
				got, err := m.GradFloat32(s.Name)
				if err != nil {
					t.Fatal(err)
				}
				if r := relL2(got, want); r > 1e-3 {
					t.Errorf("%s: gradient differs from torch's by %.2g (relative L2)", s.Name, r)
				}
			}
		})
	}
}

// relL2 is |a - b| / |b| (|a - b| when b is zero).
func relL2(a, b []float32) float64 {
	var num, den float64
	for i := range b {
		d := float64(a[i]) - float64(b[i])
		num += d * d
		den += float64(b[i]) * float64(b[i])
	}
	if den == 0 {
		return math.Sqrt(num)
	}
	return math.Sqrt(num / den)
}
