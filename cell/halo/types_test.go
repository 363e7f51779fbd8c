package halo

import (
	"math"
	"strings"
	"testing"

	"github.com/halo-shell/halo-shell/session"
)

// TestMetricsCarryExpertLoad checks the conversion of a step's MoE metrics and their one-line
// summary: the worst layer by coefficient of variation and the dead experts over all layers.
func TestMetricsCarryExpertLoad(t *testing.T) {
	aux := 1.25
	for _, tc := range []struct {
		name     string
		in       *session.StepMetrics
		worst    int
		dead     int
		contains []string
		absent   []string
	}{
		{
			name: "moe",
			in: &session.StepMetrics{Step: 3, Loss: 2, AuxLoss: &aux, ExpertLoad: []*session.ExpertLoad{
				{Layer: 0, Tokens: []int64{5, 3, 0, 0}, Max: 5, Min: 0, Cv: 1.1, Dead: 2},
				{Layer: 1, Tokens: []int64{2, 2, 2, 2}, Max: 2, Min: 2, Cv: 0, Dead: 0},
				{Layer: 3, Tokens: []int64{8, 0, 0, 0}, Max: 8, Min: 0, Cv: 1.7, Dead: 3},
			}},
			worst: 3, dead: 5,
			contains: []string{"aux 1.2500", "worst cv 1.70 (layer 3)", "dead 5"},
		},
		{
			name: "dense", in: &session.StepMetrics{Step: 1, Loss: 2},
			worst: -1, absent: []string{"aux", "experts"},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m := metricsOf(tc.in)
			if len(m.ExpertLoad) != len(tc.in.ExpertLoad) {
				t.Fatalf("%d layers, want %d", len(m.ExpertLoad), len(tc.in.ExpertLoad))
			}
			for i, l := range m.ExpertLoad {
				p := tc.in.ExpertLoad[i]
				if l.Layer != int(p.Layer) || l.Max != p.Max || l.Min != p.Min || l.CV != p.Cv || l.Dead != int(p.Dead) || len(l.Tokens) != len(p.Tokens) {
					t.Errorf("layer %d: %+v from %v", i, l, p)
				}
			}
			if (tc.in.AuxLoss == nil) != math.IsNaN(m.AuxLoss) {
				t.Errorf("aux loss %v from %v", m.AuxLoss, tc.in.AuxLoss)
			}
			w, ok := WorstLayer(m.ExpertLoad)
			if ok != (tc.worst >= 0) || (ok && w.Layer != tc.worst) {
				t.Errorf("worst layer %v (%v), want %d", w.Layer, ok, tc.worst)
			}
			if d := DeadExperts(m.ExpertLoad); d != tc.dead {
				t.Errorf("dead experts %d, want %d", d, tc.dead)
			}
			s := m.String()
			for _, c := range tc.contains {
				if !strings.Contains(s, c) {
					t.Errorf("%q lacks %q", s, c)
				}
			}
			for _, c := range tc.absent {
				if strings.Contains(s, c) {
					t.Errorf("%q has %q", s, c)
				}
			}
		})
	}
}

// TestProfileTableShowsMoEClassesAndHostWork: the breakdown table lists every class a MoE step
// splits into (router, permute, expert GEMM, combine, the expert all-to-alls) and ends with
// the step's ops and host syncs, so the host's share can be read beside the times.
func TestProfileTableShowsMoEClassesAndHostWork(t *testing.T) {
	r := ProfileReport{Steps: []StepProfile{
		{Step: 1, StepTime: 0.1, Host: 0.02, Ops: 400, Syncs: 6,
			Compute: map[string]float64{"router": 0.01, "permute": 0.01, "expert_gemm": 0.03, "combine": 0.01, "matmul": 0.01},
			Comm:    map[string]float64{"all_to_all_dispatch": 0.005, "all_to_all_combine": 0.005}},
		{Step: 2, StepTime: 0.1, Host: 0.02, Ops: 402, Syncs: 8,
			Compute: map[string]float64{"router": 0.01, "permute": 0.01, "expert_gemm": 0.03, "combine": 0.01, "matmul": 0.01},
			Comm:    map[string]float64{"all_to_all_dispatch": 0.005, "all_to_all_combine": 0.005}},
	}}
	rows := map[string]string{}
	for _, row := range r.Table().Rows {
		rows[row[0]] = row[1]
	}
	for _, k := range []string{"compute/router", "compute/permute", "compute/expert_gemm", "compute/combine",
		"comm/all_to_all_dispatch", "comm/all_to_all_combine"} {
		if _, ok := rows[k]; !ok {
			t.Errorf("the table has no row %s: %v", k, rows)
		}
	}
	if rows["ops per step"] != "401" || rows["host syncs per step"] != "7" {
		t.Fatalf("ops %q and host syncs %q per step, want 401 and 7", rows["ops per step"], rows["host syncs per step"])
	}
}
