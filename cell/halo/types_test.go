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
