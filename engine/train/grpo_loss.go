package train

import (
	"fmt"
	"math"
)

// The GRPO objective, as TRL's GRPOTrainer defines it. For completion i of a step's N
// completions (G per prompt) with reward r_i, the advantage is
//
//	A_i = (r_i - mean of its group) / (std + 1e-4)
//
// where std is the unbiased standard deviation of the group's rewards (scale_rewards group),
// of all the step's rewards (batch), or 1 without the division (none). Each of its tokens t
// with log-prob lp under the current policy, lp_old under the policy that sampled it and
// lp_ref under the reference (all of the logits divided by the sampling temperature, as TRL
// computes them) contributes
//
//	ratio = exp(lp - lp_old),  clipped = clamp(ratio, 1 - epsilon, 1 + epsilon_high)
//	l_t   = -min(ratio A_i, clipped A_i) + beta (exp(lp_ref - lp) - (lp_ref - lp) - 1)
//
// and the step's loss is sum over tokens of w_t l_t, with the loss type's normalisation:
//
//	grpo     w = 1 / (N L_i)             the mean over completions of each one's token mean
//	bnpo     w = 1 / (M T_m)             each micro-batch's token mean (T_m tokens), averaged over M
//	dr_grpo  w = 1 / (N max_completion_length)
//	dapo     w = 1 / T                   the mean over all T completion tokens of the step
//
// The gradient reaches the model as a per-token scale of the cross-entropy gradient,
// scale_t = -dL/dlp_t = -w_t dl_t/dlp_t, with
//
//	dl_t/dlp_t = -A_i ratio   where ratio A_i <= clipped A_i (the unclipped term is the minimum)
//	           = 0            where the clipped term is the smaller (it does not depend on lp)
//	           + beta (1 - exp(lp_ref - lp))

// Loss types.
const (
	LossGRPO   = "grpo"
	LossBNPO   = "bnpo"
	LossDrGRPO = "dr_grpo"
	LossDAPO   = "dapo"
)

// Reward scalings.
const (
	ScaleGroup = "group"
	ScaleBatch = "batch"
	ScaleNone  = "none"
)

var (
	grpoLossTypes = []string{LossGRPO, LossBNPO, LossDrGRPO, LossDAPO}
	grpoScales    = []string{ScaleGroup, ScaleBatch, ScaleNone}
)

// grpoLoss holds the settings of the objective.
type grpoLoss struct {
	Type             string
	EpsLow, EpsHigh  float64
	Beta             float64
	MaxCompletionLen int
}

// tokenTerm is one token's loss term and derivatives.
type tokenTerm struct {
	loss  float64 // l_t
	dlp   float64 // dl_t / dlp_t
	kl    float64 // the k3 estimate exp(lp_ref - lp) - (lp_ref - lp) - 1 (0 with beta 0)
	low   bool    // ratio below 1 - epsilon with A < 0 (the clip binds from below)
	high  bool    // ratio above 1 + epsilon_high with A > 0
	ratio float64
}

// token computes l_t for a token with current, sampling-time and reference log-probs.
func (g grpoLoss) token(lp, old, ref, adv float64) tokenTerm {
	ratio := math.Exp(lp - old)
	clipped := min(max(ratio, 1-g.EpsLow), 1+g.EpsHigh)
	t := tokenTerm{ratio: ratio}
	if a, b := ratio*adv, clipped*adv; a <= b {
		t.loss, t.dlp = -a, -adv*ratio
	} else {
		t.loss = -b
	}
	t.low = ratio < 1-g.EpsLow && adv < 0
	t.high = ratio > 1+g.EpsHigh && adv > 0
	if g.Beta != 0 {
		d := ref - lp
		e := math.Exp(d)
		t.kl = e - d - 1
		t.loss += g.Beta * t.kl
		t.dlp += g.Beta * (1 - e)
	}
	return t
}

// weights returns w_t of each completion's tokens (one value per completion: every token of a
// completion has the same weight). lens[i] is completion i's number of counted tokens and
// micro[i] the micro-batch it is trained in (M micro-batches in all).
func (g grpoLoss) weights(lens, micro []int, M int) ([]float64, error) {
	n := len(lens)
	w := make([]float64, n)
	total := 0
	perMicro := make([]int, M)
	for i, l := range lens {
		total += l
		perMicro[micro[i]] += l
	}
	for i, l := range lens {
		switch g.Type {
		case LossGRPO:
			w[i] = 1 / (float64(n) * float64(max(1, l)))
		case LossBNPO:
			w[i] = 1 / (float64(M) * float64(max(1, perMicro[micro[i]])))
		case LossDrGRPO:
			w[i] = 1 / (float64(n) * float64(g.MaxCompletionLen))
		case LossDAPO:
			w[i] = 1 / float64(max(1, total))
		default:
			return nil, fmt.Errorf("train: unknown loss_type %q", g.Type)
		}
	}
	return w, nil
}

// advantages returns each completion's advantage from rewards grouped by G consecutive
// completions per prompt, and each group's (unbiased) reward standard deviation.
func advantages(rewards []float64, G int, scale string) (adv, groupStd []float64, err error) {
	if G < 2 || len(rewards)%G != 0 {
		return nil, nil, fmt.Errorf("train: %d rewards do not form groups of %d (num_generations must be >= 2)", len(rewards), G)
	}
	n := len(rewards)
	adv = make([]float64, n)
	groupStd = make([]float64, n/G)
	for g := range n / G {
		grp := rewards[g*G : (g+1)*G]
		m, s := meanStd(grp)
		groupStd[g] = s
		for j, r := range grp {
			adv[g*G+j] = r - m
		}
	}
	switch scale {
	case ScaleGroup:
		for i := range adv {
			adv[i] /= groupStd[i/G] + 1e-4
		}
	case ScaleBatch:
		_, s := meanStd(rewards)
		for i := range adv {
			adv[i] /= s + 1e-4
		}
	case ScaleNone:
	default:
		return nil, nil, fmt.Errorf("train: unknown scale_rewards %q (use one of group, batch, none)", scale)
	}
	return adv, groupStd, nil
}

// meanStd is the mean and the unbiased (n-1) standard deviation of xs (0 for one value).
func meanStd(xs []float64) (mean, std float64) {
	for _, x := range xs {
		mean += x
	}
	mean /= float64(len(xs))
	if len(xs) < 2 {
		return mean, 0
	}
	v := 0.0
	for _, x := range xs {
		v += (x - mean) * (x - mean)
	}
	return mean, math.Sqrt(v / float64(len(xs)-1))
}
