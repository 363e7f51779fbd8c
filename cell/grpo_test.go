package cell

import (
	"context"
	"strings"
	"testing"
	"time"
)

// TestRewardFunctionInACell defines GRPO's reward function in a cell and steps: the session's
// rollouts are scored by it (the step metrics carry its mean reward), and a reward function
// that panics fails the step with that reason, is listed by halo.RewardErrors, and leaves the
// interpreter and the session usable.
func TestRewardFunctionInACell(t *testing.T) {
	sock := startSession(t)
	it, err := New(Options{Session: sock, ClientName: "cell-test"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { it.Close() })
	evalT(t, it, `halo.LoadMethod("testdata/grpo.yaml", "grpo")`)
	r := evalT(t, it, `calls := 0
halo.SetReward(func(r halo.Rollout) float64 {
	calls++
	if len(r.Completion) > 0 && r.Completion[0] >= '0' && r.Completion[0] <= '9' {
		return 1
	}
	return 0
})`)
	if !strings.Contains(plain(r.Value), "reward function set") {
		t.Fatalf("SetReward = %q", plain(r.Value))
	}
	r = evalT(t, it, `ms := halo.Step(2)
keys := 0
for k := range ms[1].Method {
	if k == "rewards/client/mean" {
		keys++
	}
}
len(ms) == 2 && keys == 1 && calls > 0`)
	if plain(r.Value) != "true" {
		t.Fatalf("steps scored in the cell: %q", plain(r.Value))
	}

	evalT(t, it, `halo.SetReward(func(r halo.Rollout) float64 {
	var m map[string]float64
	m[r.Completion] = 1 // assignment to a nil map: panics
	return 0
})`)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	_, err = it.Eval(ctx, `halo.Step(1)`)
	if err == nil || !strings.Contains(err.Error(), "panicked") {
		t.Fatalf("a step with a panicking reward function: %v", err)
	}
	r = evalT(t, it, `errs := halo.RewardErrors()
errs[len(errs)-1]`)
	if !strings.Contains(plain(r.Value), "panicked") {
		t.Errorf("RewardErrors after a panic: %q", plain(r.Value))
	}
	evalT(t, it, `halo.ClearReward()`)
	_, err = it.Eval(ctx, `halo.Step(1)`)
	if err == nil || !strings.Contains(err.Error(), "no client scores rollouts") {
		t.Errorf("a step after ClearReward: %v", err)
	}
	if r := evalT(t, it, `halo.Status().Step`); plain(r.Value) != "2" {
		t.Errorf("status after the failed steps: step %q, want 2", plain(r.Value))
	}
}
