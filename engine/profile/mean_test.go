package profile

import (
	"testing"
	"time"
)

func TestMeanStepsAveragesTimesAndSumsCounts(t *testing.T) {
	a := Step{Step: 7, Wall: 10 * time.Millisecond, Host: 2 * time.Millisecond, Ops: 3, Bytes: 100, FLOPs: 1000,
		Compute:   map[string]time.Duration{ClassMatmul: 6 * time.Millisecond},
		Comm:      map[string]time.Duration{"all_reduce": 2 * time.Millisecond},
		CommBytes: map[string]int64{"all_reduce": 4096},
		Spans:     []Span{{Name: "GEMM"}}}
	b := Step{Step: 7, Wall: 14 * time.Millisecond, Host: 4 * time.Millisecond, Ops: 5, Bytes: 50, FLOPs: 500,
		Compute:   map[string]time.Duration{ClassMatmul: 8 * time.Millisecond, ClassNorm: 2 * time.Millisecond},
		Comm:      map[string]time.Duration{"all_reduce": 4 * time.Millisecond},
		CommBytes: map[string]int64{"all_reduce": 2048}}
	for _, tc := range []struct {
		name  string
		steps []Step
		want  Step
	}{
		{"one device is kept", []Step{a}, a},
		{"two devices", []Step{a, b}, Step{Step: 7, Wall: 12 * time.Millisecond, Host: 3 * time.Millisecond, Ops: 8, Bytes: 150, FLOPs: 1500,
			Compute:   map[string]time.Duration{ClassMatmul: 7 * time.Millisecond, ClassNorm: time.Millisecond},
			Comm:      map[string]time.Duration{"all_reduce": 3 * time.Millisecond},
			CommBytes: map[string]int64{"all_reduce": 3072}, Spans: a.Spans}},
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
		if len(got.CommBytes) != len(tc.want.CommBytes) {
			t.Errorf("%s: comm bytes %v, want %v", tc.name, got.CommBytes, tc.want.CommBytes)
		}
		for k, v := range tc.want.CommBytes {
			if got.CommBytes[k] != v {
				t.Errorf("%s: comm bytes %s = %d, want %d (the mean over devices)", tc.name, k, got.CommBytes[k], v)
			}
		}
	}
}

func TestCollectiveBytesByKind(t *testing.T) {
	r := NewRecorder()
	r.Enable(true, false)
	r.BeginStep(1)
	for _, c := range []struct {
		kind  string
		bytes int64
	}{{"all_reduce", 100}, {"all_reduce", 28}, {"all_gather", 64}} {
		if err := r.Collective(c.kind, "world", c.bytes, func() error { return nil }); err != nil {
			t.Fatal(err)
		}
	}
	s, ok := r.EndStep()
	if !ok {
		t.Fatal("no step")
	}
	if s.CommBytes["all_reduce"] != 128 || s.CommBytes["all_gather"] != 64 || len(s.CommBytes) != 2 {
		t.Errorf("comm bytes %v, want all_reduce 128 and all_gather 64", s.CommBytes)
	}
}
