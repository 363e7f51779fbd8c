package parallel

import (
	"reflect"
	"testing"

	"github.com/halo-shell/halo-shell/engine/optim"
)

// TestPlanExpertLoadAndBalancingMatchOneModel checks the plan's expert load (summed over the
// data ranks, once per tensor group) and its balancing update against the single model
// running the same rows: the loads are equal, every rank gets the same bias, and a plan built
// from a balancing model starts from that model's bias; Gather hands the bias back.
func TestPlanExpertLoadAndBalancingMatchOneModel(t *testing.T) {
	rows := tinyRows(4, 16, 41, 4)
	for _, layout := range []string{"ep=2", "dp=4", "ep=2 fsdp"} {
		t.Run(layout, func(t *testing.T) {
			src := tinyModel(t, "qwen3_moe", 3)
			if err := src.SetExpertBalancing(0.05); err != nil {
				t.Fatal(err)
			}
			start := make([][]float32, len(src.MoELayers()))
			for j, l := range src.MoELayers() {
				start[j] = make([]float32, l.Routed())
				start[j][j%l.Routed()] = 0.25 // a bias that changes the routing
			}
			if err := src.SetExpertBias(start); err != nil {
				t.Fatal(err)
			}
			p := newPlan(t, src, 4, layout, optim.Config{})
			if !reflect.DeepEqual(p.ExpertBias(), start) || p.ExpertBalancing() != 0.05 {
				t.Fatalf("plan starts from bias %v (rate %v), the model's is %v", p.ExpertBias(), p.ExpertBalancing(), start)
			}
			if _, _, err := p.ForwardBackward(rows); err != nil {
				t.Fatal(err)
			}
			// The model's own counter sees training forwards only: sum the rows' loads here.
			want := make([][]int, len(start))
			for j := range want {
				want[j] = make([]int, len(start[j]))
			}
			for _, r := range rows {
				if _, _, err := src.Forward(r); err != nil {
					t.Fatal(err)
				}
				for j, l := range src.ExpertLoad() {
					for e, n := range l.Tokens {
						want[j][e] += n
					}
				}
			}
			if got := p.ExpertLoad(); !reflect.DeepEqual(got, want) {
				t.Fatalf("plan load %v, one model over the same rows %v", got, want)
			}
			if err := p.BalanceExperts(); err != nil {
				t.Fatal(err)
			}
			if err := src.BalanceExpertsWith(want); err != nil {
				t.Fatal(err)
			}
			for _, rk := range p.ranks {
				if b := rk.m.ExpertBias(); !reflect.DeepEqual(b, src.ExpertBias()) {
					t.Fatalf("rank %d bias %v, one model's %v", rk.id, b, src.ExpertBias())
				}
			}
			dst := tinyModel(t, "qwen3_moe", 9)
			if err := p.Gather(dst); err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(dst.ExpertBias(), src.ExpertBias()) || dst.ExpertBalancing() != 0.05 {
				t.Fatalf("gathered bias %v (rate %v), want %v", dst.ExpertBias(), dst.ExpertBalancing(), src.ExpertBias())
			}
		})
	}
}
