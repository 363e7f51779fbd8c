package train

import (
	"math"

	"github.com/halo-shell/halo-shell/engine/data"
	"github.com/halo-shell/halo-shell/engine/models"
)

// MethodReward trains a reward model: a sequence classifier with one label (score.weight on
// the final norm's output at each sequence's last non-pad token, transformers'
// AutoModelForSequenceClassification layout) on {prompt, chosen, rejected} pairs with the
// Bradley-Terry loss.
const MethodReward = "reward"

// rewardObjective is the Bradley-Terry loss of pairs of scores r_c (chosen) and r_r:
//
//	L = -log sigmoid(r_c - r_r) + center_rewards_coefficient * (r_c + r_r)^2
//
// averaged over the step's pairs, as TRL's RewardTrainer computes it.
type rewardObjective struct {
	center float64
}

func (rewardObjective) Units(b data.Batch) int { return (&prefObjective{}).Units(b) }

// pairs pairs up the scores of a batch's sequences: seqOf[d] = (pair, segment).
func scorePairs(b data.Batch, scores []float32) (rc, rr []float64, seqOf [][2]int, err error) {
	if len(b.Sources) != b.Docs() {
		return nil, nil, nil, errNoSegments
	}
	at := map[int32]int{}
	seqOf = make([][2]int, b.Docs())
	for d, src := range b.Sources {
		i, ok := at[src]
		if !ok {
			i = len(rc)
			at[src] = i
			rc, rr = append(rc, 0), append(rr, 0)
		}
		if b.Segs[d] == 0 {
			rc[i] = float64(scores[d])
		} else {
			rr[i] = float64(scores[d])
		}
		seqOf[d] = [2]int{i, int(b.Segs[d])}
	}
	return rc, rr, seqOf, nil
}

// rewardLoss returns the summed loss of the pairs, dL/dr of each pair's two scores, and the
// metrics.
func rewardLoss(rc, rr []float64, center float64) (float64, [][2]float64, Metrics) {
	ms := Metrics{}
	grads := make([][2]float64, len(rc))
	sum := 0.0
	for i := range rc {
		d, s := rc[i]-rr[i], rc[i]+rr[i]
		sum += -logSigmoid(d) + center*s*s
		g := -sigmoid(-d)
		grads[i] = [2]float64{g + 2*center*s, -g + 2*center*s}
		ms.Add("rewards/chosen", rc[i], 1)
		ms.Add("rewards/rejected", rr[i], 1)
		ms.Add("rewards/accuracies", boolF(rc[i] > rr[i]), 1)
		ms.Add("rewards/margins", d, 1)
	}
	return sum, grads, ms
}

func (o rewardObjective) ForwardBackward(m *models.Model, b data.Batch, total int, at StepAt) (float64, Metrics, error) {
	run, err := o.prepareRow(b, total, at)
	if err != nil {
		return 0, nil, err
	}
	return run(m, toModelBatch(b))
}

// prepareRow implements rowObjective: the classifier's forward and backward over b's pairs.
func (o rewardObjective) prepareRow(b data.Batch, total int, _ StepAt) (rowRun, error) {
	return func(m *models.Model, mb models.Batch) (float64, Metrics, error) {
		var lossSum float64
		var ms Metrics
		err := m.ForwardBackwardScores(mb, func(scores []float32) ([]float32, error) {
			rc, rr, seqOf, err := scorePairs(b, scores)
			if err != nil {
				return nil, err
			}
			var grads [][2]float64
			lossSum, grads, ms = rewardLoss(rc, rr, o.center)
			out := make([]float32, len(scores))
			for d, se := range seqOf {
				out[d] = float32(grads[se[0]][se[1]] / float64(total))
			}
			return out, nil
		})
		return lossSum, ms, err
	}, nil
}

func (o rewardObjective) Eval(m *models.Model, b data.Batch, _ StepAt) (float64, int, Metrics, error) {
	scores, err := m.Scores(toModelBatch(b))
	if err != nil {
		return 0, 0, nil, err
	}
	rc, rr, _, err := scorePairs(b, scores)
	if err != nil {
		return 0, 0, nil, err
	}
	l, _, ms := rewardLoss(rc, rr, o.center)
	return l, len(rc), ms, nil
}

func init() {
	RegisterMethod(&MethodSpec{
		Parallel: true, WholeSequences: true,
		Name:    MethodReward,
		Summary: "reward model: a one-label sequence classifier (score.weight) trained on pairs with the Bradley-Terry loss",
		Keys:    []string{"center_rewards_coefficient"},
		Defaults: func(c *Config) {
			defaultFloat(&c.Objective.CenterRewardsCoefficient, 0)
		},
		Validate: func(c *Config, bad func(key, format string, args ...any)) {
			if v := *c.Objective.CenterRewardsCoefficient; !(v >= 0) || math.IsInf(v, 0) {
				bad("center_rewards_coefficient", "%v must be a finite number >= 0", v)
			}
			if c.PEFT.UsePEFT {
				bad("use_peft", "reward models train the whole model here: LoRA would leave the new score head frozen (no modules_to_save); remove use_peft")
			}
			if c.GenerationEval.MaxSamples > 0 {
				bad("generation_eval.max_samples", "a reward model does not generate: remove generation_eval")
			}
		},
		Setup: func(t *Trainer) (Objective, error) {
			if _, _, err := t.setupPref(data.Paired); err != nil {
				return nil, err
			}
			return rewardObjective{center: *t.Cfg.Objective.CenterRewardsCoefficient}, nil
		},
	})
}
