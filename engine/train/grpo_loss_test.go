package train

import (
	"context"
	"errors"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/halo-shell/halo-shell/engine/data"
)

// TestGRPOTokenTermMatchesFiniteDifferences checks dl/dlp of the clipped surrogate with KL
// against central differences of l, for ratios inside and outside the clip range, both signs
// of the advantage, with and without beta, and the clip flags.
func TestGRPOTokenTermMatchesFiniteDifferences(t *testing.T) {
	g := grpoLoss{EpsLow: 0.2, EpsHigh: 0.28}
	for _, tc := range []struct {
		name          string
		lp, old, adv  float64
		beta          float64
		low, high     bool
		zeroGradient  bool
		ratioInBounds bool
	}{
		{name: "on policy, positive", lp: -1.2, old: -1.2, adv: 0.7, ratioInBounds: true},
		{name: "on policy, negative, kl", lp: -1.2, old: -1.2, adv: -0.7, beta: 0.05, ratioInBounds: true},
		{name: "ratio 1.5, A>0: clipped high", lp: math.Log(1.5) - 2, old: -2, adv: 1, high: true, zeroGradient: true},
		{name: "ratio 1.5, A<0: unclipped is the min", lp: math.Log(1.5) - 2, old: -2, adv: -1},
		{name: "ratio 0.5, A<0: clipped low", lp: math.Log(0.5) - 2, old: -2, adv: -1, low: true, zeroGradient: true},
		{name: "ratio 0.5, A>0: unclipped is the min, kl", lp: math.Log(0.5) - 2, old: -2, adv: 1, beta: 0.1},
		{name: "ratio 1.1 inside", lp: math.Log(1.1) - 0.5, old: -0.5, adv: 2, beta: 0.04, ratioInBounds: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			g := g
			g.Beta = tc.beta
			ref := tc.old - 0.3
			term := g.token(tc.lp, tc.old, ref, tc.adv)
			const h = 1e-6
			fd := (g.token(tc.lp+h, tc.old, ref, tc.adv).loss - g.token(tc.lp-h, tc.old, ref, tc.adv).loss) / (2 * h)
			if math.Abs(fd-term.dlp) > 1e-6*(1+math.Abs(fd)) {
				t.Errorf("dl/dlp = %v, finite differences %v", term.dlp, fd)
			}
			if term.low != tc.low || term.high != tc.high {
				t.Errorf("clip flags low %v high %v, want %v %v", term.low, term.high, tc.low, tc.high)
			}
			if tc.zeroGradient && tc.beta == 0 && term.dlp != 0 {
				t.Errorf("a binding clip must stop the gradient, got %v", term.dlp)
			}
			if tc.lp == tc.old && math.Abs(term.loss-(-tc.adv+tc.beta*term.kl)) > 1e-12 {
				t.Errorf("on policy the loss is -A + beta*kl = %v, got %v", -tc.adv+tc.beta*term.kl, term.loss)
			}
			if tc.beta > 0 {
				d := ref - tc.lp
				if want := math.Exp(d) - d - 1; math.Abs(term.kl-want) > 1e-12 {
					t.Errorf("kl %v, want %v", term.kl, want)
				}
			}
		})
	}
}

// TestGRPOAdvantages checks group-normalised advantages against values worked by hand.
func TestGRPOAdvantages(t *testing.T) {
	r := []float64{1, 0, 0, 0, 2, 2, 2, 2}
	// Group 1: mean 0.25, unbiased std sqrt(0.75/3) = 0.5. Group 2: all equal, std 0.
	adv, std, err := advantages(r, 4, ScaleGroup)
	if err != nil {
		t.Fatal(err)
	}
	want := []float64{0.75 / 0.5001, -0.25 / 0.5001, -0.25 / 0.5001, -0.25 / 0.5001, 0, 0, 0, 0}
	for i := range want {
		if math.Abs(adv[i]-want[i]) > 1e-12 {
			t.Errorf("group: A[%d] = %v, want %v", i, adv[i], want[i])
		}
	}
	if math.Abs(std[0]-0.5) > 1e-12 || std[1] != 0 {
		t.Errorf("group stds %v, want [0.5 0]", std)
	}
	adv, _, _ = advantages(r, 4, ScaleNone)
	if adv[0] != 0.75 || adv[1] != -0.25 {
		t.Errorf("none: %v", adv)
	}
	adv, _, _ = advantages(r, 4, ScaleBatch)
	_, s := meanStd(r)
	if math.Abs(adv[0]-0.75/(s+1e-4)) > 1e-12 {
		t.Errorf("batch: A[0] = %v, want %v", adv[0], 0.75/(s+1e-4))
	}
	if _, _, err := advantages(r, 3, ScaleGroup); err == nil {
		t.Error("8 rewards in groups of 3 accepted")
	}
	if _, _, err := advantages(r, 4, "rank"); err == nil || !strings.Contains(err.Error(), "scale_rewards") {
		t.Errorf("unknown scaling: %v", err)
	}
}

// TestGRPOWeights checks the loss types' normalisations: what one completion's tokens weigh
// in total, and that every type's weights sum (over tokens) to 1 when lengths are equal.
func TestGRPOWeights(t *testing.T) {
	lens := []int{2, 4, 6, 0}
	micro := []int{0, 0, 1, 1}
	for _, tc := range []struct {
		typ  string
		want []float64 // w per token
	}{
		{LossGRPO, []float64{1.0 / 8, 1.0 / 16, 1.0 / 24, 1.0 / 4}},
		{LossBNPO, []float64{1.0 / 12, 1.0 / 12, 1.0 / 12, 1.0 / 12}},
		{LossDrGRPO, []float64{1.0 / 32, 1.0 / 32, 1.0 / 32, 1.0 / 32}},
		{LossDAPO, []float64{1.0 / 12, 1.0 / 12, 1.0 / 12, 1.0 / 12}},
	} {
		w, err := grpoLoss{Type: tc.typ, MaxCompletionLen: 8}.weights(lens, micro, 2)
		if err != nil {
			t.Fatal(err)
		}
		for i := range w {
			if math.Abs(w[i]-tc.want[i]) > 1e-15 {
				t.Errorf("%s: w[%d] = %v, want %v", tc.typ, i, w[i], tc.want[i])
			}
		}
	}
	bnpo, _ := grpoLoss{Type: LossBNPO}.weights([]int{2, 2, 1, 5}, []int{0, 0, 1, 1}, 2)
	if bnpo[0] != 1.0/8 || bnpo[2] != 1.0/12 {
		t.Errorf("bnpo normalises each micro-batch by its own tokens: %v", bnpo)
	}
	if _, err := (grpoLoss{Type: "ppo"}).weights(lens, micro, 2); err == nil {
		t.Error("unknown loss type accepted")
	}
}

// TestBuiltinRewards checks the verifiable reward functions on edge cases.
func TestBuiltinRewards(t *testing.T) {
	for _, tc := range []struct {
		spec       RewardSpec
		completion string
		answer     string
		want       float64
	}{
		{RewardSpec{Name: "arithmetic"}, "85", "85", 1},
		{RewardSpec{Name: "arithmetic"}, " The answer is 85.", "85", 1},
		{RewardSpec{Name: "arithmetic"}, "84", "85", 0},
		{RewardSpec{Name: "arithmetic"}, "85 or 86", "85", 0},
		{RewardSpec{Name: "arithmetic"}, "no number", "85", 0},
		{RewardSpec{Name: "arithmetic"}, "-3.50", "-3.5", 1},
		{RewardSpec{Name: "arithmetic"}, "7", "no reference number", math.NaN()},
		{RewardSpec{Name: "format", Pattern: `\d+`}, " 123 ", "", 1},
		{RewardSpec{Name: "format", Pattern: `\d+`}, "123a", "", 0},
		{RewardSpec{Name: "format", Pattern: `a|b`}, "ab", "", 0}, // the whole completion must match
		{RewardSpec{Name: "json"}, `{"a": [1, 2]}`, "", 1},
		{RewardSpec{Name: "json"}, ` 3 `, "", 1},
		{RewardSpec{Name: "json"}, `{"a": 1} {"b": 2}`, "", 0},
		{RewardSpec{Name: "json"}, `{"a": 1} }`, "", 0},
		{RewardSpec{Name: "json"}, `{"a": }`, "", 0},
		{RewardSpec{Name: "json"}, ``, "", 0},
	} {
		f, err := builtinReward(tc.spec)
		if err != nil {
			t.Fatal(err)
		}
		got, err := f.Rewards(context.Background(), []Rollout{{Completion: tc.completion, Answer: tc.answer}})
		if err != nil {
			t.Fatal(err)
		}
		if !(got[0] == tc.want || math.IsNaN(got[0]) && math.IsNaN(tc.want)) {
			t.Errorf("%s(%q, answer %q) = %v, want %v", tc.spec.Name, tc.completion, tc.answer, got[0], tc.want)
		}
	}
	for _, bad := range []RewardSpec{{Name: "format"}, {Name: "format", Pattern: "("}, {Name: "bleu"}} {
		if _, err := builtinReward(bad); err == nil {
			t.Errorf("%+v accepted", bad)
		}
	}
}

// stubReward is a reward function whose behaviour a test sets: fixed values, an error, a
// wrong count, or blocking until its context ends.
type stubReward struct {
	name  string
	calls int
	fn    func(ctx context.Context, call int, rs []Rollout) ([]float64, error)
}

func (s *stubReward) Name() string { return s.name }
func (s *stubReward) Rewards(ctx context.Context, rs []Rollout) ([]float64, error) {
	s.calls++
	return s.fn(ctx, s.calls, rs)
}

// TestRewardRunner checks the weighted sum with NaN left out, retries after a failure, the
// timeout of a function that never answers, and the refusal of a wrong number of values.
func TestRewardRunner(t *testing.T) {
	rs := make([]Rollout, 3)
	ok := &stubReward{name: "a", fn: func(context.Context, int, []Rollout) ([]float64, error) {
		return []float64{1, math.NaN(), 0}, nil
	}}
	flaky := &stubReward{name: "b", fn: func(_ context.Context, call int, _ []Rollout) ([]float64, error) {
		if call == 1 {
			return nil, errors.New("boom")
		}
		return []float64{2, 2, math.NaN()}, nil
	}}
	rr := rewardRunner{funcs: []RewardFunc{ok, flaky}, weights: []float64{1, 0.5}, retries: 1}
	sum, per, err := rr.score(context.Background(), rs)
	if err != nil {
		t.Fatal(err)
	}
	if want := []float64{2, 1, 0}; sum[0] != want[0] || sum[1] != want[1] || sum[2] != want[2] {
		t.Errorf("sum %v, want %v", sum, want)
	}
	if flaky.calls != 2 || len(per) != 2 {
		t.Errorf("flaky called %d times, want 2 (one retry)", flaky.calls)
	}

	never := &stubReward{name: "never", fn: func(ctx context.Context, _ int, _ []Rollout) ([]float64, error) {
		<-ctx.Done()
		return nil, ctx.Err()
	}}
	rr = rewardRunner{funcs: []RewardFunc{never}, weights: []float64{1}, timeout: 20 * time.Millisecond, retries: 1}
	start := time.Now()
	_, _, err = rr.score(context.Background(), rs)
	if err == nil || !strings.Contains(err.Error(), "timed out") || !strings.Contains(err.Error(), "never") {
		t.Errorf("a function that never answers: %v", err)
	}
	if never.calls != 2 || time.Since(start) > 5*time.Second {
		t.Errorf("calls %d in %v", never.calls, time.Since(start))
	}

	short := &stubReward{name: "short", fn: func(context.Context, int, []Rollout) ([]float64, error) { return []float64{1}, nil }}
	rr = rewardRunner{funcs: []RewardFunc{short}, weights: []float64{1}}
	if _, _, err = rr.score(context.Background(), rs); err == nil || !strings.Contains(err.Error(), "1 rewards for 3 rollouts") {
		t.Errorf("wrong count: %v", err)
	}
	inf := &stubReward{name: "inf", fn: func(context.Context, int, []Rollout) ([]float64, error) {
		return []float64{1, math.Inf(1), 0}, nil
	}}
	rr = rewardRunner{funcs: []RewardFunc{inf}, weights: []float64{1}}
	if _, _, err = rr.score(context.Background(), rs); err == nil || !strings.Contains(err.Error(), "finite") {
		t.Errorf("infinite reward: %v", err)
	}
}

// TestLayoutMicroBatches checks that only completion tokens are targets, each predicted by the
// token before it, and that offsets point at the first completion target.
func TestLayoutMicroBatches(t *testing.T) {
	samples := []grpoSample{
		{prompt: []int32{1, 2, 3}, tokens: []int32{7, 8}},
		{prompt: []int32{4}, tokens: []int32{9}},
		{prompt: []int32{5, 6}, tokens: []int32{10, 11, 12}},
	}
	mbs := layoutMicroBatches(samples, 2)
	if len(mbs) != 2 {
		t.Fatalf("%d micro-batches, want 2", len(mbs))
	}
	I := int32(data.IgnoreIndex)
	want0 := []int32{I, I, 7, 8, I, 9, I}
	for i, tg := range mbs[0].Targets {
		if tg != want0[i] {
			t.Fatalf("targets %v, want %v", mbs[0].Targets, want0)
		}
	}
	if samples[0].offset != 2 || samples[1].offset != 5 || samples[2].offset != 1 || samples[2].micro != 1 {
		t.Errorf("offsets %d %d %d, micro %d", samples[0].offset, samples[1].offset, samples[2].offset, samples[2].micro)
	}
	if got := mbs[1].DocStarts; len(got) != 2 || got[1] != 5 {
		t.Errorf("doc starts %v", got)
	}
}
