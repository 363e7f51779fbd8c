package cuda

import (
	"errors"
	"fmt"
	"math"
	"strings"
	"testing"
)

// Host tests of GEMM algorithm tuning: the policy (when to time, which output the timed runs
// write, which candidate wins) runs against a fake device whose "GPU" is a clock advanced by
// each candidate's stated duration.

const (
	fakeC       uintptr = 0xc0000000
	fakeScratch uintptr = 0x5c000000
)

// fakeGemmTimer simulates a stream: run advances the clock by the candidate's duration for that
// run (or fails), mark records the clock, elapsed may be read only after wait.
type fakeGemmTimer struct {
	// dur[i] is candidate i's time per run in ms; durByRun[i], when set, gives each of its runs
	// in turn (warm-up first).
	dur      []float32
	durByRun map[int][]float32
	// failAt[i] = k makes candidate i's k-th run (0 = warm-up) and every later one fail.
	failAt     map[int]int
	scratchErr error
	waitErr    error
	markErrAt  int // 1-based mark number that fails; 0 never

	clock     float32
	runsOf    map[int]int
	outs      []uintptr
	marks     []float32
	waits     int
	released  int
	events    []string // the order of waits, releases and elapsed reads
	runsAfter int      // runs enqueued after the wait (must stay 0)
}

func (f *fakeGemmTimer) run(i int, out uintptr) error {
	if f.runsOf == nil {
		f.runsOf = map[int]int{}
	}
	k := f.runsOf[i]
	f.runsOf[i]++
	if f.waits > 0 {
		f.runsAfter++
	}
	if at, ok := f.failAt[i]; ok && k >= at {
		return fmt.Errorf("CUBLAS_STATUS_NOT_SUPPORTED (candidate %d run %d)", i, k)
	}
	f.outs = append(f.outs, out)
	d := f.dur[i]
	if s := f.durByRun[i]; k < len(s) {
		d = s[k]
	}
	f.clock += d
	return nil
}

func (f *fakeGemmTimer) mark() (int, error) {
	if f.markErrAt > 0 && len(f.marks)+1 == f.markErrAt {
		return 0, errors.New("CUDA_ERROR_INVALID_HANDLE")
	}
	f.marks = append(f.marks, f.clock)
	return len(f.marks) - 1, nil
}

func (f *fakeGemmTimer) wait() error {
	f.waits++
	f.events = append(f.events, "wait")
	return f.waitErr
}

func (f *fakeGemmTimer) elapsed(a, b int) (float32, error) {
	f.events = append(f.events, "elapsed")
	if f.waits == 0 {
		return 0, errors.New("elapsed read before the wait")
	}
	return f.marks[b] - f.marks[a], nil
}

func (f *fakeGemmTimer) scratch(n uint64) (uintptr, func() error, error) {
	if f.scratchErr != nil {
		return 0, nil, f.scratchErr
	}
	return fakeScratch, func() error {
		f.released++
		f.events = append(f.events, "release")
		return nil
	}, nil
}

func fakeCandidates(n int) []gemmCandidate {
	c := make([]gemmCandidate, n)
	for i := range c {
		c[i].Result.Algo[0] = uint64(100 + i)
	}
	return c
}

var bigJob = gemmTuneJob{FLOPs: 2 * 1024 * 1024 * 16384, C: fakeC, OutBytes: 1024 * 1024 * 4}

func TestTuneGemmPicksTheFastestCandidate(t *testing.T) {
	cfg := tunedGemmConfig()
	for _, tc := range []struct {
		name string
		dur  []float32
		want int
	}{
		{"heuristic_first_is_fastest", []float32{1, 2, 3}, 0},
		{"later_candidate_faster", []float32{3, 1.5, 1, 2}, 2},
		{"tie_keeps_heuristic_order", []float32{2, 1, 1}, 1},
		{"last_candidate", []float32{0.9, 0.8, 0.7, 0.6, 0.5, 0.4, 0.3, 0.2}, 7},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := &fakeGemmTimer{dur: tc.dur}
			r := tuneGemm(cfg, bigJob, fakeCandidates(len(tc.dur)), f)
			if r.Chosen != tc.want || !r.Timed {
				t.Fatalf("chose %d (timed %v, reason %q), want %d", r.Chosen, r.Timed, r.Reason, tc.want)
			}
			if f.waits != 1 {
				t.Errorf("the host waited %d times, want once", f.waits)
			}
			if f.runsAfter != 0 {
				t.Errorf("%d runs were enqueued after the wait", f.runsAfter)
			}
			for i, c := range r.Candidates {
				if f.runsOf[i] != 1+cfg.Rounds || len(c.Ms) != cfg.Rounds {
					t.Errorf("candidate %d: %d runs and %d timings, want 1 warm-up + %d timed", i, f.runsOf[i], len(c.Ms), cfg.Rounds)
				}
				for _, ms := range c.Ms {
					if math.Abs(float64(ms-tc.dur[i])) > 1e-5 {
						t.Errorf("candidate %d timed at %g ms, it runs in %g", i, ms, tc.dur[i])
					}
				}
			}
			for _, out := range f.outs {
				if out != fakeC {
					t.Fatalf("with Beta = 0 a timed run wrote %#x, want C (%#x)", out, fakeC)
				}
			}
			if f.released != 0 {
				t.Errorf("released %d scratch outputs without asking for one", f.released)
			}
		})
	}
}

// The warm-up run is not timed: a candidate whose first launch is slow (module load) but whose
// later runs are fast still wins, and one fast only in its warm-up does not.
func TestTuneGemmIgnoresTheWarmUpRun(t *testing.T) {
	f := &fakeGemmTimer{dur: []float32{1, 0.5, 0.8}, durByRun: map[int][]float32{
		1: {50, 0.5, 0.5, 0.5},
		2: {0.01, 0.8, 0.8, 0.8},
	}}
	r := tuneGemm(tunedGemmConfig(), bigJob, fakeCandidates(3), f)
	if r.Chosen != 1 {
		t.Fatalf("chose %d with medians %v, want 1", r.Chosen, r.Candidates)
	}
}

// Medians, not means: one slow outlier round does not make a candidate lose.
func TestChooseGemmCandidateUsesMedians(t *testing.T) {
	for _, tc := range []struct {
		name  string
		cands []gemmCandidate
		want  int
	}{
		{"outlier_round", []gemmCandidate{{Ms: []float32{1, 100, 1}}, {Ms: []float32{2, 2, 2}}}, 0},
		{"even_sample", []gemmCandidate{{Ms: []float32{1, 3}}, {Ms: []float32{2.1, 2.1}}}, 0},
		{"skipped_fastest", []gemmCandidate{{Ms: []float32{2}}, {Ms: []float32{1}, Skip: "failed"}}, 0},
		{"untimed_loses_to_timed", []gemmCandidate{{}, {Ms: []float32{5}}}, 1},
		{"none_timed_is_heuristic_first", []gemmCandidate{{Skip: "failed"}, {}, {}}, 1},
		{"none_usable", []gemmCandidate{{Skip: "x"}, {Skip: "y"}}, -1},
		{"empty", nil, -1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := chooseGemmCandidate(tc.cands); got != tc.want {
				t.Fatalf("chose %d, want %d", got, tc.want)
			}
		})
	}
}

func TestTuneGemmSkipsFailingCandidates(t *testing.T) {
	for _, tc := range []struct {
		name   string
		dur    []float32
		failAt map[int]int
		want   int
	}{
		// Candidate 1 would win but fails its warm-up.
		{"fails_warm_up", []float32{2, 1, 3}, map[int]int{1: 0}, 0},
		// Candidate 2 fails in the second timed round: a failed launch adds no time, so its
		// interval would read as the fastest if it were kept.
		{"fails_timed_round", []float32{2, 3, 1.5}, map[int]int{2: 2}, 0},
		{"heuristic_first_fails", []float32{1, 2, 3}, map[int]int{0: 0}, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := &fakeGemmTimer{dur: tc.dur, failAt: tc.failAt}
			r := tuneGemm(tunedGemmConfig(), bigJob, fakeCandidates(len(tc.dur)), f)
			if r.Chosen != tc.want {
				t.Fatalf("chose %d, want %d (candidates %+v)", r.Chosen, tc.want, r.Candidates)
			}
			for i := range tc.failAt {
				if s := r.Candidates[i].Skip; !strings.Contains(s, "failed: CUBLAS_STATUS_NOT_SUPPORTED") {
					t.Errorf("candidate %d failed but its skip reason is %q", i, s)
				}
			}
			if f.waits != 1 {
				t.Errorf("waited %d times, want once", f.waits)
			}
		})
	}
	t.Run("all_fail", func(t *testing.T) {
		f := &fakeGemmTimer{dur: []float32{1, 1}, failAt: map[int]int{0: 0, 1: 0}}
		r := tuneGemm(tunedGemmConfig(), bigJob, fakeCandidates(2), f)
		if r.Chosen != -1 || r.Timed {
			t.Fatalf("chose %d (timed %v) when every candidate fails; want -1", r.Chosen, r.Timed)
		}
	})
}

func TestScreenGemmCandidates(t *testing.T) {
	res := []ltHeuristicResult{
		{WorkspaceSize: 1 << 20},
		{WorkspaceSize: 64 << 20},
		{State: 15},
		{},
	}
	cands := screenGemmCandidates(res, gemmWorkspaceBytes)
	wantSkip := []string{"", "needs 67108864 bytes of workspace, the device has 33554432", "heuristic state 15", ""}
	for i, w := range wantSkip {
		if (w == "") != (cands[i].Skip == "") || !strings.Contains(cands[i].Skip, w) {
			t.Errorf("candidate %d: skip %q, want %q", i, cands[i].Skip, w)
		}
	}
	// A screened-out candidate is never run, even when it would be the fastest.
	f := &fakeGemmTimer{dur: []float32{3, 0.1, 0.1, 2}}
	r := tuneGemm(tunedGemmConfig(), bigJob, cands, f)
	if r.Chosen != 3 {
		t.Fatalf("chose %d, want 3", r.Chosen)
	}
	if f.runsOf[1] != 0 || f.runsOf[2] != 0 {
		t.Fatalf("screened candidates ran: %v", f.runsOf)
	}
}

// With Beta != 0 the timed runs read C and write a scratch output, released only after the
// wait, so the call itself accumulates into C exactly once.
func TestTuneGemmAccumulatingCallTimesIntoScratch(t *testing.T) {
	job := bigJob
	job.Accumulates = true
	f := &fakeGemmTimer{dur: []float32{2, 1}}
	r := tuneGemm(tunedGemmConfig(), job, fakeCandidates(2), f)
	if r.Chosen != 1 || !r.Timed || !r.Scratch {
		t.Fatalf("chose %d timed %v scratch %v (%q), want 1 timed into scratch", r.Chosen, r.Timed, r.Scratch, r.Reason)
	}
	if len(f.outs) == 0 {
		t.Fatal("nothing ran")
	}
	for _, out := range f.outs {
		if out != fakeScratch {
			t.Fatalf("a timed run wrote %#x; with Beta != 0 every run must write the scratch output %#x, never C", out, fakeScratch)
		}
	}
	if f.released != 1 {
		t.Fatalf("scratch released %d times, want once", f.released)
	}
	if got := strings.Join(f.events, ","); !strings.HasPrefix(got, "wait,release") {
		t.Fatalf("order of host events %q: the scratch must be released after the wait", got)
	}
}

func TestTuneGemmAccumulatingCallWithoutScratchTakesHeuristic(t *testing.T) {
	job := bigJob
	job.Accumulates = true
	f := &fakeGemmTimer{dur: []float32{2, 1}, scratchErr: errors.New("out of device memory")}
	r := tuneGemm(tunedGemmConfig(), job, fakeCandidates(2), f)
	if r.Chosen != 0 || r.Timed || !strings.Contains(r.Reason, "out of device memory") {
		t.Fatalf("chose %d timed %v reason %q; want the heuristic's first, untimed, naming the allocation failure", r.Chosen, r.Timed, r.Reason)
	}
	if len(f.runsOf) != 0 || f.waits != 0 {
		t.Fatalf("ran %v and waited %d times; want nothing", f.runsOf, f.waits)
	}
}

// Calls that are not timed enqueue nothing and never wait.
func TestTuneGemmUntimedCases(t *testing.T) {
	def := tunedGemmConfig()
	off := def
	off.Candidates = 1
	for _, tc := range []struct {
		name   string
		cfg    gemmTuneConfig
		job    gemmTuneJob
		cands  []gemmCandidate
		want   int
		reason string
	}{
		{"tiny_gemm", def, gemmTuneJob{FLOPs: 2 * 64 * 64 * 64, C: fakeC}, fakeCandidates(4), 0, "below the tuning threshold"},
		{"threshold_is_inclusive_below", def, gemmTuneJob{FLOPs: def.MinFLOPs - 1, C: fakeC}, fakeCandidates(4), 0, "below"},
		{"tuning_disabled", off, bigJob, fakeCandidates(4), 0, "tuning disabled"},
		{"one_candidate", def, bigJob, fakeCandidates(1), 0, "one usable candidate"},
		{"one_usable", def, bigJob, []gemmCandidate{{Skip: "state"}, {}}, 1, "one usable candidate"},
		{"none_usable", def, bigJob, []gemmCandidate{{Skip: "state"}}, -1, "no usable candidate"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := &fakeGemmTimer{dur: []float32{5, 1, 1, 1}}
			r := tuneGemm(tc.cfg, tc.job, tc.cands, f)
			if r.Chosen != tc.want || r.Timed || !strings.Contains(r.Reason, tc.reason) {
				t.Fatalf("chose %d timed %v reason %q; want %d untimed, reason containing %q", r.Chosen, r.Timed, r.Reason, tc.want, tc.reason)
			}
			if len(f.runsOf) != 0 || len(f.marks) != 0 || f.waits != 0 {
				t.Fatalf("untimed call ran %v, marked %d, waited %d", f.runsOf, len(f.marks), f.waits)
			}
		})
	}
	t.Run("at_threshold_is_timed", func(t *testing.T) {
		f := &fakeGemmTimer{dur: []float32{5, 1}}
		r := tuneGemm(def, gemmTuneJob{FLOPs: def.MinFLOPs, C: fakeC}, fakeCandidates(2), f)
		if !r.Timed || r.Chosen != 1 {
			t.Fatalf("a GEMM of exactly MinFLOPs: chose %d timed %v (%q)", r.Chosen, r.Timed, r.Reason)
		}
	})
}

// Driver errors while timing fall back to the heuristic's first choice, after the one wait (so
// a scratch output is never freed under queued work); a failed wait is also returned as an error,
// since the stream has faulted.
func TestTuneGemmDriverErrorsFallBack(t *testing.T) {
	job := bigJob
	job.Accumulates = true
	for _, tc := range []struct {
		name   string
		f      *fakeGemmTimer
		reason string
	}{
		{"wait_fails", &fakeGemmTimer{dur: []float32{2, 1}, waitErr: errors.New("CUDA_ERROR_LAUNCH_FAILED")}, "waiting for the timed runs: CUDA_ERROR_LAUNCH_FAILED"},
		{"first_mark_fails", &fakeGemmTimer{dur: []float32{2, 1}, markErrAt: 1}, "recording an event"},
		{"later_mark_fails", &fakeGemmTimer{dur: []float32{2, 1}, markErrAt: 3}, "recording an event"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := tuneGemm(tunedGemmConfig(), job, fakeCandidates(2), tc.f)
			if r.Chosen != 0 || r.Timed || !strings.Contains(r.Reason, tc.reason) {
				t.Fatalf("chose %d timed %v reason %q; want 0 untimed with %q", r.Chosen, r.Timed, r.Reason, tc.reason)
			}
			if (tc.f.waitErr != nil) != (r.Err != nil) {
				t.Fatalf("result error %v; want one exactly when the wait fails", r.Err)
			}
			if tc.f.waits != 1 || tc.f.released != 1 || !strings.HasPrefix(strings.Join(tc.f.events, ","), "wait,release") {
				t.Fatalf("waits %d, releases %d, events %v; want one wait then the release", tc.f.waits, tc.f.released, tc.f.events)
			}
		})
	}
}

func TestGemmTuneConfigFromEnv(t *testing.T) {
	def := defaultGemmTuneConfig()
	for _, tc := range []struct {
		name       string
		env        map[string]string
		candidates int
		minFLOPs   float64
		err        string
	}{
		{"defaults", nil, def.Candidates, def.MinFLOPs, ""},
		{"disable", map[string]string{envGemmCandidates: "1"}, 1, def.MinFLOPs, ""},
		{"more_candidates", map[string]string{envGemmCandidates: " 16 "}, 16, def.MinFLOPs, ""},
		{"max_candidates", map[string]string{envGemmCandidates: "64"}, 64, def.MinFLOPs, ""},
		{"threshold", map[string]string{envGemmTuneMinFLOPs: "1e9"}, def.Candidates, 1e9, ""},
		{"threshold_zero", map[string]string{envGemmTuneMinFLOPs: "0"}, def.Candidates, 0, ""},
		{"zero_candidates", map[string]string{envGemmCandidates: "0"}, 0, 0, envGemmCandidates + `="0"`},
		{"too_many", map[string]string{envGemmCandidates: "65"}, 0, 0, "from 1"},
		{"not_a_number", map[string]string{envGemmCandidates: "eight"}, 0, 0, envGemmCandidates + `="eight"`},
		{"negative_threshold", map[string]string{envGemmTuneMinFLOPs: "-1"}, 0, 0, envGemmTuneMinFLOPs + `="-1"`},
		{"nan_threshold", map[string]string{envGemmTuneMinFLOPs: "NaN"}, 0, 0, envGemmTuneMinFLOPs},
		{"inf_threshold", map[string]string{envGemmTuneMinFLOPs: "+Inf"}, 0, 0, envGemmTuneMinFLOPs},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, err := gemmTuneConfigFromEnv(func(k string) string { return tc.env[k] })
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("error %v, want one containing %q", err, tc.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if c.Candidates != tc.candidates || c.MinFLOPs != tc.minFLOPs || c.Rounds != def.Rounds {
				t.Fatalf("config %+v, want candidates %d, min FLOPs %g, rounds %d", c, tc.candidates, tc.minFLOPs, def.Rounds)
			}
		})
	}
}

// The default threshold times every GEMM of a Qwen3-0.6B or Llama-3.2-1B layer at 16384 tokens
// and leaves a tiny model's GEMMs, and the smallest of a 4096-token Qwen3 layer, untimed.
func TestGemmTuneThresholdSeparatesModelShapes(t *testing.T) {
	def := tunedGemmConfig()
	for _, tc := range []struct {
		name  string
		g     Gemm
		timed bool
	}{
		{"qwen3_k_proj_dw_16384", Gemm{M: 1024, N: 1024, K: 16384}, true},
		{"llama_k_proj_fwd_16384", Gemm{M: 16384, N: 512, K: 2048}, true},
		{"batched_small", Gemm{M: 128, N: 128, K: 128, Batch: 4096}, true},
		{"qwen3_k_proj_fwd_4096", Gemm{M: 4096, N: 1024, K: 1024}, false},
		{"tiny_model_fwd", Gemm{M: 256, N: 128, K: 128}, false},
		{"tiny_model_lm_head", Gemm{M: 256, N: 1000, K: 128}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := gemmFLOPs(&tc.g)
			if got := f >= def.MinFLOPs; got != tc.timed {
				t.Fatalf("%.3g FLOPs against threshold %.3g: timed %v, want %v", f, def.MinFLOPs, got, tc.timed)
			}
		})
	}
	if got, want := gemmFLOPs(&Gemm{M: 3, N: 5, K: 7, Batch: 2}), 2.0*3*5*7*2; math.Abs(got-want) > 0 {
		t.Fatalf("gemmFLOPs = %g, want %g", got, want)
	}
}

// The tuning's wait is counted under its own tag, whatever op is on the stack.
func TestSyncCounterNoteOpTagsGEMMTune(t *testing.T) {
	var c syncCounter
	c.note()
	c.noteOp(gemmTuneSyncOp)
	c.noteOp(gemmTuneSyncOp)
	s := c.stats()
	if s.Total != 3 || s.ByOp["GEMMTune"] != 2 || s.Last != "GEMMTune" {
		t.Fatalf("stats %+v, want 3 waits of which 2 GEMMTune, the last GEMMTune", s)
	}
}

func TestGemmSplitK(t *testing.T) {
	for _, c := range []struct {
		name           string
		m, n, k        int
		transA, transB bool
		sms, want      int
	}{
		{"llama k_proj dW", 512, 2048, 16384, true, false, 132, 4},
		{"qwen3 k_proj dW", 1024, 1024, 16384, true, false, 132, 4},
		{"qwen3 q_proj dW", 2048, 1024, 16384, true, false, 132, 2},
		{"llama q_proj dW fills the GPU", 2048, 2048, 16384, true, false, 132, 1},
		{"tiny output, capped at 8", 64, 64, 65536, true, false, 132, 8},
		{"slices keep 1024 rows", 64, 64, 4096, true, false, 132, 4},
		{"K too short", 64, 64, 1536, true, false, 132, 1},
		{"slice not a multiple of 8", 64, 64, 4100, true, false, 132, 1},
		{"forward (A not transposed)", 512, 2048, 16384, false, true, 132, 1},
		{"dX (B not transposed, A not)", 512, 2048, 16384, false, false, 132, 1},
		{"TransB cannot slice B", 512, 2048, 16384, true, true, 132, 1},
		{"unknown SM count", 512, 2048, 16384, true, false, 0, 1},
	} {
		if got := gemmSplitK(c.m, c.n, c.k, c.transA, c.transB, c.sms); got != c.want {
			t.Errorf("%s: gemmSplitK(%d, %d, %d, %v, %v, %d) = %d, want %d", c.name, c.m, c.n, c.k, c.transA, c.transB, c.sms, got, c.want)
		}
	}
}
