package cuda

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"slices"
	"strconv"
	"strings"
	"unsafe"

	"github.com/halo-shell/halo-shell/internal/switches"
)

// GEMM algorithm tuning.
//
// cuBLASLt's heuristic ranks algorithms from a model of the GPU; on some shapes (a weight
// gradient with a long K and a small M×N, the LM head's weight gradient) its first choice is well
// behind the fastest one it also lists. So the first GEMM of a new plan key (shape, transposes,
// dtypes, bias, alignments) asks the heuristic for up to gemmTuneConfig.Candidates algorithms,
// runs each on the call's own operands (one warm-up run, then Rounds timed runs, the candidates
// interleaved round by round and timed with CUDA events on the device stream), and caches the
// one with the lowest median time under the key. Later GEMMs of the key run the cached
// algorithm with no timing and no wait.
//
// Costs, all paid once per key on its first call: the host waits once for the timed runs (the
// device's sync counter tags it "GEMMTune"); the GPU runs the GEMM (1+Rounds)·candidates times
// more; with Beta != 0 the timed runs read C and write a scratch output of C's size, allocated
// from the driver for the duration of the tuning (outside the caching allocator's statistics)
// and freed after the wait, so C is accumulated into exactly once, by the call itself. When that
// memory is not available the key takes the heuristic's first choice. With Beta = 0 the timed
// runs write C itself, which the call then overwrites with the winner's result.
//
// GEMMs below MinFLOPs take the heuristic's first choice untimed. The default, 1e12 FLOPs,
// times only the largest GEMMs, the LM head's chunks, where the tuned choice beat the
// heuristic's in every run of TestGPULayerGEMMThroughput; for the head's dX and dW GEMMs and the
// transformer layers' GEMMs three timed rounds on the first call did not always rank the
// candidates right, and tuning them did not move the training benchmark beyond its noise
// (testdata/README.md, gpu-run14, 16 and 17). The smallest sensible threshold is about 1e10:
// below it a launch through cuBLASLt and an event record take the host nearly as long as the
// GPU takes to run the GEMM, so the queue of timed runs could drain and the events would time
// the host. Nothing is persisted.
//
// HALO_CUDA_GEMM_CANDIDATES (default 8; 1 takes the heuristic's first choice everywhere) and
// HALO_CUDA_GEMM_TUNE_MIN_FLOPS (default 1e12) override both; they are read when a device makes
// its first GEMM.

const (
	maxGemmCandidates    = 64
	defaultGemmRounds    = 3
	defaultGemmMinFLOPs  = 1e12
	defaultGemmCandidate = 8
	tunedGemmCandidates  = 8    // what the tests tune with
	tunedGemmMinFLOPs    = 1e10 // and the smallest GEMM they time
)

// gemmTuneConfig says when and how a new GEMM plan key is tuned.
type gemmTuneConfig struct {
	// Candidates is how many algorithms are asked of the heuristic; 1 takes its first choice
	// without timing.
	Candidates int
	// MinFLOPs is the smallest GEMM (2·M·N·K·batch) that is timed.
	MinFLOPs float64
	// Rounds is the number of timed runs of each candidate, after one warm-up run.
	Rounds int
}

func defaultGemmTuneConfig() gemmTuneConfig {
	return gemmTuneConfig{Candidates: defaultGemmCandidate, MinFLOPs: defaultGemmMinFLOPs, Rounds: defaultGemmRounds}
}

// tunedGemmConfig tunes every GEMM of 1e10 FLOPs or more (HALO_CUDA_GEMM_TUNE_MIN_FLOPS=1e10),
// as the tests and the layer GEMM benchmark do.
func tunedGemmConfig() gemmTuneConfig {
	return gemmTuneConfig{Candidates: tunedGemmCandidates, MinFLOPs: tunedGemmMinFLOPs, Rounds: defaultGemmRounds}
}

// gemmTuneConfigFromEnv is the default configuration with the environment's overrides; a value
// that is not a number in range is an error naming the variable.
func gemmTuneConfigFromEnv(getenv func(string) string) (gemmTuneConfig, error) {
	c := defaultGemmTuneConfig()
	if v := strings.TrimSpace(getenv(envGemmCandidates)); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 || n > maxGemmCandidates {
			return c, fmt.Errorf("cuda: %s=%q: want an integer from 1 (no tuning: the heuristic's first choice) to %d", envGemmCandidates, v, maxGemmCandidates)
		}
		c.Candidates = n
	}
	if v := strings.TrimSpace(getenv(envGemmTuneMinFLOPs)); v != "" {
		f, err := strconv.ParseFloat(v, 64)
		if err != nil || f < 0 || math.IsNaN(f) || math.IsInf(f, 0) {
			return c, fmt.Errorf("cuda: %s=%q: want a non-negative number of floating-point operations, e.g. 1e10", envGemmTuneMinFLOPs, v)
		}
		c.MinFLOPs = f
	}
	return c, nil
}

// gemmFLOPs is 2·M·N·K per product, times the batch.
func gemmFLOPs(g *Gemm) float64 {
	return 2 * float64(g.M) * float64(g.N) * float64(g.K) * float64(max(g.Batch, 1))
}

// gemmCandidate is one algorithm the heuristic returned, and what tuning learnt of it.
type gemmCandidate struct {
	Result ltHeuristicResult
	// Skip, when set, says why the candidate was not (or no longer) considered.
	Skip string
	// Ms are its timed runs, in milliseconds.
	Ms []float32
}

// gemmTuneJob is what the tuner needs to know of the call being tuned.
type gemmTuneJob struct {
	FLOPs float64
	// Accumulates is Beta != 0: C is an input, so timed runs must write elsewhere.
	Accumulates bool
	// C is the output's device address and OutBytes its extent (every batch).
	C        uintptr
	OutBytes uint64
}

// gemmTuneResult is the outcome of tuning one key.
type gemmTuneResult struct {
	// Chosen indexes Candidates; -1 when none is usable.
	Chosen     int
	Candidates []gemmCandidate
	// Timed says the choice was measured; otherwise Reason says why not.
	Timed  bool
	Reason string
	// Scratch says timed runs wrote a scratch output rather than C.
	Scratch bool
	// Err is a failed wait for the timed runs: the stream has faulted (by this GEMM or by work
	// queued before it), and the call must fail rather than carry on.
	Err error
}

// gemmTimer is what the tuner needs from a device. Every method runs on the device goroutine and
// enqueues on the device stream unless it says otherwise.
type gemmTimer interface {
	// run enqueues one GEMM with candidate i, writing its output to out (C's layout).
	run(i int, out uintptr) error
	// mark records a point on the stream and returns its number (from 0 on each tuning).
	mark() (int, error)
	// wait blocks the host until everything enqueued so far has run: the tuning's one wait.
	wait() error
	// elapsed is the time in milliseconds between two marks that wait has seen pass.
	elapsed(a, b int) (float32, error)
	// scratch returns n bytes of device memory for timed outputs and a release to call once the
	// runs that use it are finished (after wait).
	scratch(n uint64) (uintptr, func() error, error)
}

// screenGemmCandidates wraps the heuristic's results, marking those that cannot run here.
func screenGemmCandidates(results []ltHeuristicResult, workspace uint64) []gemmCandidate {
	out := make([]gemmCandidate, len(results))
	for i, r := range results {
		out[i].Result = r
		switch {
		case r.State != 0:
			out[i].Skip = fmt.Sprintf("heuristic state %d (not supported)", r.State)
		case r.WorkspaceSize > workspace:
			out[i].Skip = fmt.Sprintf("needs %d bytes of workspace, the device has %d", r.WorkspaceSize, workspace)
		}
	}
	return out
}

// firstUsableGemmCandidate is the heuristic's own choice among the usable candidates, or -1.
func firstUsableGemmCandidate(cands []gemmCandidate) int {
	return slices.IndexFunc(cands, func(c gemmCandidate) bool { return c.Skip == "" })
}

// median of a non-empty sample.
func medianMs(ms []float32) float64 {
	s := slices.Clone(ms)
	slices.Sort(s)
	n := len(s)
	if n%2 == 1 {
		return float64(s[n/2])
	}
	return (float64(s[n/2-1]) + float64(s[n/2])) / 2
}

// chooseGemmCandidate picks the usable candidate with the lowest median time; ties go to the
// heuristic's order. Usable candidates that were not timed lose to timed ones; with none timed,
// it is the heuristic's first usable choice. -1 means none is usable.
func chooseGemmCandidate(cands []gemmCandidate) int {
	best, bestMs := -1, math.Inf(1)
	for i, c := range cands {
		if c.Skip != "" || len(c.Ms) == 0 {
			continue
		}
		if m := medianMs(c.Ms); m < bestMs {
			best, bestMs = i, m
		}
	}
	if best < 0 {
		return firstUsableGemmCandidate(cands)
	}
	return best
}

// tuneGemm decides whether to time the candidates and, if so, times them with t and picks the
// fastest. It never makes the host wait except through t.wait, at most once, and only after
// enqueueing timed work.
func tuneGemm(cfg gemmTuneConfig, job gemmTuneJob, cands []gemmCandidate, t gemmTimer) gemmTuneResult {
	res := gemmTuneResult{Candidates: cands, Chosen: firstUsableGemmCandidate(cands)}
	usable := 0
	for _, c := range cands {
		if c.Skip == "" {
			usable++
		}
	}
	switch {
	case usable == 0:
		res.Reason = "no usable candidate"
		return res
	case cfg.Candidates <= 1:
		res.Reason = "tuning disabled (" + envGemmCandidates + "=1)"
		return res
	case job.FLOPs < cfg.MinFLOPs:
		res.Reason = fmt.Sprintf("%.3g FLOPs is below the tuning threshold of %.3g", job.FLOPs, cfg.MinFLOPs)
		return res
	case usable == 1:
		res.Reason = "one usable candidate"
		return res
	}
	out := job.C
	var release func() error
	if job.Accumulates {
		p, rel, err := t.scratch(job.OutBytes)
		if err != nil {
			res.Reason = fmt.Sprintf("Beta != 0 and no scratch output of %d bytes for the timed runs: %v", job.OutBytes, err)
			return res
		}
		out, release, res.Scratch = p, rel, true
	}
	rounds := max(cfg.Rounds, 1)
	type interval struct{ cand, from, to int }
	var timed []interval
	abort := ""
	// Warm-up: the first launch of a kernel may load its module, which would be timed.
	for i := range cands {
		if cands[i].Skip != "" {
			continue
		}
		if err := t.run(i, out); err != nil {
			cands[i].Skip = "failed: " + err.Error()
		}
	}
	prev, err := t.mark()
	if err != nil {
		abort = "recording an event: " + err.Error()
	}
	for r := 0; r < rounds && abort == ""; r++ {
		for i := range cands {
			if cands[i].Skip != "" {
				continue
			}
			runErr := t.run(i, out)
			m, err := t.mark()
			if err != nil {
				abort = "recording an event: " + err.Error()
				break
			}
			if runErr != nil {
				cands[i].Skip = "failed: " + runErr.Error()
			} else {
				timed = append(timed, interval{i, prev, m})
			}
			prev = m
		}
	}
	waitErr := t.wait()
	if release != nil {
		if err := release(); err != nil && abort == "" {
			abort = "freeing the scratch output: " + err.Error()
		}
	}
	switch {
	case waitErr != nil:
		res.Reason = "waiting for the timed runs: " + waitErr.Error()
		res.Err = fmt.Errorf("waiting for the timed runs of %d algorithm candidates: %w", len(cands), waitErr)
	case abort != "":
		res.Reason = abort
	}
	if res.Reason != "" {
		for i := range cands {
			cands[i].Ms = nil
		}
		res.Chosen = firstUsableGemmCandidate(cands)
		return res
	}
	for _, iv := range timed {
		if cands[iv.cand].Skip != "" {
			continue
		}
		ms, err := t.elapsed(iv.from, iv.to)
		if err != nil {
			cands[iv.cand].Skip = "reading its time: " + err.Error()
			cands[iv.cand].Ms = nil
			continue
		}
		cands[iv.cand].Ms = append(cands[iv.cand].Ms, ms)
	}
	res.Chosen = chooseGemmCandidate(cands)
	res.Timed = res.Chosen >= 0 && len(cands[res.Chosen].Ms) > 0
	if !res.Timed && res.Reason == "" {
		res.Reason = "no candidate ran"
	}
	return res
}

// log writes the outcome at debug level: each skipped candidate with its reason, then the choice.
func (r gemmTuneResult) log(g *Gemm) {
	if !slog.Default().Enabled(context.Background(), slog.LevelDebug) {
		return
	}
	shape := fmt.Sprintf("M=%d N=%d K=%d batch=%d transA=%v transB=%v outF32=%v", g.M, g.N, g.K, max(g.Batch, 1), g.TransA, g.TransB, g.OutF32)
	for i, c := range r.Candidates {
		if c.Skip != "" {
			slog.Debug("cuda: gemm tuning: candidate skipped", "shape", shape, "candidate", i, "reason", c.Skip)
		}
	}
	var times []string
	for _, c := range r.Candidates {
		if len(c.Ms) > 0 {
			times = append(times, fmt.Sprintf("%.4g", medianMs(c.Ms)))
		} else {
			times = append(times, "-")
		}
	}
	slog.Debug("cuda: gemm algorithm chosen", "shape", shape, "candidate", r.Chosen, "of", len(r.Candidates),
		"timed", r.Timed, "reason", r.Reason, "scratch_output", r.Scratch, "median_ms", strings.Join(times, " "))
}

// gemmTuneSyncOp tags the tuning's wait in the device's sync counter.
const gemmTuneSyncOp = "GEMMTune"

// deviceGemmTimer times candidates of one plan on the device stream with the state's events.
type deviceGemmTimer struct {
	d     *Device
	gs    *gemmState
	p     *gemmPlan
	g     *Gemm
	cands []gemmCandidate
	marks int
}

func (t *deviceGemmTimer) run(i int, out uintptr) error {
	lt, g, p := t.d.libs.lt, t.g, t.p
	alpha, beta := g.Alpha, g.Beta
	algo := t.cands[i].Result.Algo
	st := lt.cublasLtMatmul(t.gs.handle, p.desc, unsafe.Pointer(&alpha), g.B.ptr, p.a, g.A.ptr, p.b, unsafe.Pointer(&beta),
		g.C.ptr, p.c, out, p.c, unsafe.Pointer(&algo), t.gs.workspace.ptr, gemmWorkspaceBytes, t.d.stream)
	return lt.check("cublasLtMatmul", st)
}

func (t *deviceGemmTimer) mark() (int, error) {
	drv := t.d.drv
	for len(t.gs.events) <= t.marks {
		var e uintptr
		if err := drv.check("cuEventCreate", drv.cuEventCreate(&e, 0)); err != nil {
			return 0, err
		}
		t.gs.events = append(t.gs.events, e)
	}
	if err := drv.check("cuEventRecord", drv.cuEventRecord(t.gs.events[t.marks], t.d.stream)); err != nil {
		return 0, err
	}
	t.marks++
	return t.marks - 1, nil
}

func (t *deviceGemmTimer) wait() error {
	t.d.syncs.noteOp(gemmTuneSyncOp)
	return t.d.drv.check("cuStreamSynchronize", t.d.drv.cuStreamSynchronize(t.d.stream))
}

func (t *deviceGemmTimer) elapsed(a, b int) (float32, error) {
	if a < 0 || b < 0 || a >= t.marks || b >= t.marks {
		return 0, fmt.Errorf("cuda: gemm tuning: marks %d and %d of %d", a, b, t.marks)
	}
	var ms float32
	err := t.d.drv.check("cuEventElapsedTime", t.d.drv.cuEventElapsedTime(&ms, t.gs.events[a], t.gs.events[b]))
	return ms, err
}

// scratch takes memory from the driver rather than the caching allocator, so that a one-off
// block of an odd size is not kept in its free lists; it is freed right after the wait.
func (t *deviceGemmTimer) scratch(n uint64) (uintptr, func() error, error) {
	mem := driverMemory{t.d.drv}
	p, err := mem.alloc(n)
	if err != nil {
		return 0, nil, err
	}
	return p, func() error { return mem.free(p) }, nil
}

// gemmCandidatesOnThread asks the heuristic for up to n algorithms for p's descriptors.
func (d *Device) gemmCandidatesOnThread(gs *gemmState, p *gemmPlan, pref uintptr, n int) ([]ltHeuristicResult, error) {
	lt := d.libs.lt
	res := make([]ltHeuristicResult, max(n, 1))
	var returned int32
	if err := lt.check("cublasLtMatmulAlgoGetHeuristic", lt.cublasLtMatmulAlgoGetHeuristic(gs.handle, p.desc, p.a, p.b, p.c, p.c, pref, int32(len(res)), unsafe.Pointer(&res[0]), &returned)); err != nil {
		return nil, err
	}
	if returned < 0 || int(returned) > len(res) {
		return nil, fmt.Errorf("cuda: cublasLtMatmulAlgoGetHeuristic returned %d results for %d requested", returned, len(res))
	}
	return res[:returned], nil
}

// tuneOnThread chooses p's algorithm among the heuristic's results for the first call g of its
// key (see the notes at the top of this file).
func (d *Device) tuneOnThread(gs *gemmState, p *gemmPlan, g *Gemm, results []ltHeuristicResult) error {
	cands := screenGemmCandidates(results, gemmWorkspaceBytes)
	outSize := uint64(2)
	if g.OutF32 {
		outSize = 4
	}
	job := gemmTuneJob{
		FLOPs:       gemmFLOPs(g),
		Accumulates: g.Beta != 0,
		C:           g.C.ptr,
		OutBytes:    uint64(int64(max(g.Batch, 1)-1)*g.StrideC+int64(g.M)*int64(g.N)) * outSize,
	}
	t := &deviceGemmTimer{d: d, gs: gs, p: p, g: g, cands: cands}
	r := tuneGemm(gs.tune, job, cands, t)
	r.log(g)
	if r.Err != nil {
		return r.Err
	}
	if r.Chosen < 0 {
		var why []string
		for i, c := range cands {
			why = append(why, fmt.Sprintf("candidate %d: %s", i, c.Skip))
		}
		return errors.New("cuBLASLt offers no usable algorithm for this shape and alignment (" + strings.Join(why, "; ") + ")")
	}
	p.algo = cands[r.Chosen].Result
	p.tune = r
	return nil
}

// loadGemmTuneConfig reads the tuning switches (HALO_CUDA_GEMM_CANDIDATES,
// HALO_CUDA_GEMM_TUNE_MIN_FLOPS) of this process.
func loadGemmTuneConfig() (gemmTuneConfig, error) {
	return gemmTuneConfigFromEnv(func(name string) string {
		for _, s := range []*switches.Switch{swGemmCandidates, swGemmTuneMinFLOPs} {
			if s.Name == name {
				v, _ := s.Lookup()
				return v
			}
		}
		return ""
	})
}
