package profile

import (
	"testing"
	"time"
)

func TestMeanStepsAveragesTimesAndSumsCounts(t *testing.T) {
	a := Step{Step: 7, Wall: 10 * time.Millisecond, Host: 2 * time.Millisecond, Ops: 3, Bytes: 100, FLOPs: 1000,
		Compute: map[string]time.Duration{ClassMatmul: 6 * time.Millisecond},
		Comm:    map[string]time.Duration{"all_reduce": 2 * time.Millisecond},
		Spans:   []Span{{Name: "GEMM"}}}
	b := Step{Step: 7, Wall: 14 * time.Millisecond, Host: 4 * time.Millisecond, Ops: 5, Bytes: 50, FLOPs: 500,
		Compute: map[string]time.Duration{ClassMatmul: 8 * time.Millisecond, ClassNorm: 2 * time.Millisecond},
		Comm:    map[string]time.Duration{"all_reduce": 4 * time.Millisecond}}
	for _, tc := range []struct {
		name  string
		steps []Step
		want  Step
	}{
		{"one device is kept", []Step{a}, a},
		{"two devices", []Step{a, b}, Step{Step: 7, Wall: 12 * time.Millisecond, Host: 3 * time.Millisecond, Ops: 8, Bytes: 150, FLOPs: 1500,
			Compute: map[string]time.Duration{ClassMatmul: 7 * time.Millisecond, ClassNorm: time.Millisecond},
			Comm:    map[string]time.Duration{"all_reduce": 3 * time.Millisecond}, Spans: a.Spans}},
	} {
		got := MeanSteps(tc.steps)
		if got.Step != tc.want.Step || got.Wall != tc.want.Wall || got.Host != tc.want.Host || got.Ops != tc.want.Ops ||
			got.Bytes != tc.want.Bytes || got.FLOPs != tc.want.FLOPs || len(got.Spans) != len(tc.want.Spans) {
			t.Errorf("%s: got %+v, want %+v", tc.name, got, tc.want)
		}
		for _, m := range []struct{ got, want map[string]time.Duration }{{got.Compute, tc.want.Compute}, {got.Comm, tc.want.Comm}} {
			if len(m.got) != len(m.want) {
				t.Errorf("%s: %v, want %v", tc.name, m.got, m.want)
			}
			for k, v := range m.want {
				if m.got[k] != v {
					t.Errorf("%s: %s = %v, want %v", tc.name, k, m.got[k], v)
				}
			}
		}
	}
}
