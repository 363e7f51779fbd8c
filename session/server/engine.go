package server

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"runtime"
	"runtime/debug"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"connectrpc.com/connect/v2"

	"github.com/halo-shell/halo-shell/engine/backend"
	"github.com/halo-shell/halo-shell/engine/hf/chat"
	"github.com/halo-shell/halo-shell/engine/hf/tokenizer"
	"github.com/halo-shell/halo-shell/engine/models"
	"github.com/halo-shell/halo-shell/engine/profile"
	"github.com/halo-shell/halo-shell/engine/train"
	halov1 "github.com/halo-shell/halo-shell/session/proto/halo/v1"
)

// errStopped is returned to commands submitted after the engine stopped.
var errStopped = connect.NewError(connect.CodeUnavailable, "session: the session is stopping")

// command is a future: fn runs on the engine goroutine at a step boundary and its result is
// delivered on done (buffered, so the engine never blocks on a caller that went away).
type command struct {
	ctx  context.Context
	fn   func(c *command) (any, error)
	done chan cmdResult
}

type cmdResult struct {
	v   any
	err error
}

// deferred is returned by a command whose reply comes later (when its steps are done).
type deferred struct{}

func (c *command) reply(v any, err error) {
	select {
	case c.done <- cmdResult{v, err}:
	default:
	}
}

// job is a run of steps: a background Run, or a foreground Step/Profile whose caller waits.
type job struct {
	target  int      // stop when the trainer's step count reaches it
	waiter  *command // foreground caller; nil for a background run
	metrics []*halov1.StepMetrics
	// forProfile marks the steps a Profile call runs itself.
	forProfile bool
}

// profPlan profiles the next remaining steps, whoever runs them.
type profPlan struct {
	remaining int
	trace     bool
	waiter    *command
	steps     []profile.Step
	metrics   []*halov1.StepMetrics
}

// engine owns the trainer. Every field below mu is touched only by the engine goroutine; the
// snapshot under mu is what read-only RPCs see.
type engine struct {
	name       string
	log        *slog.Logger
	hub        *hub
	cmds       chan *command
	quit       chan struct{}
	quitOnce   sync.Once
	done       chan struct{}
	saveOnStop string
	// controller returns the controlling client's id, for state events (nil: none known).
	controller func() string

	t      *train.Trainer
	rec    *recs
	tok    *tokenizer.Tokenizer
	tokDir string
	bg     *job // background run (Run); paused keeps it
	paused bool
	fg     *job // foreground steps (Step, Profile)
	prof   *profPlan
	launch bool // driven by ServeRun: the batch loop owns stepping
	// captureNext arms activation capture for the next step; acts holds the last capture.
	captureNext bool
	acts        []*halov1.TensorStats
	actsStep    int
	stopping    bool
	// measureDev is the device Measure opened when no model's device was used (measure.go).
	measureDev  backend.Backend
	measureName string
	// repauseAfterProfile pauses a batch run again once the profile asked for while it was
	// paused is taken.
	repauseAfterProfile bool

	// rewards asks the scoring client for the rewards of GRPO's reward function "client".
	rewards *rewardHub

	mu   sync.Mutex
	snap snapshot
}

type snapshot struct {
	layout  train.LayoutInfo
	state   halov1.State
	step    int64
	total   int64
	summary string
	device  string
	hyper   *halov1.Hyper
	lastErr string
	last    *halov1.StepMetrics
	saved   int64 // the step the model was last saved or loaded at
}

func newEngine(name string, log *slog.Logger, h *hub, saveOnStop string) *engine {
	e := &engine{name: name, log: log, hub: h, cmds: make(chan *command), quit: make(chan struct{}),
		done: make(chan struct{}), saveOnStop: saveOnStop, rewards: newRewardHub()}
	e.snap.state = halov1.State_STATE_EMPTY
	return e
}

// queueTimeout bounds how long a command waits for the engine to take it (a step boundary).
var queueTimeout = 10 * time.Minute

// submit queues fn for the engine goroutine and waits for its result, the caller's context or
// the engine's end.
func (e *engine) submit(ctx context.Context, fn func(c *command) (any, error)) (any, error) {
	c, err := e.enqueue(ctx, fn)
	if err != nil {
		return nil, err
	}
	return e.await(ctx, c)
}

// enqueue hands fn to the engine loop and returns once the loop has taken it: a command
// enqueued before another runs before it.
func (e *engine) enqueue(ctx context.Context, fn func(c *command) (any, error)) (*command, error) {
	c := &command{ctx: ctx, fn: fn, done: make(chan cmdResult, 1)}
	timer := time.NewTimer(queueTimeout)
	defer timer.Stop()
	select {
	case e.cmds <- c:
		return c, nil
	case <-ctx.Done():
		return nil, ctxErr(ctx)
	case <-e.done:
		return nil, errStopped
	case <-timer.C:
		return nil, connect.Errorf(connect.CodeDeadlineExceeded, "session: the engine did not reach a step boundary within %s (a step or a command is taking that long); try again", queueTimeout)
	}
}

// await waits for the result of an enqueued command.
func (e *engine) await(ctx context.Context, c *command) (any, error) {
	select {
	case r := <-c.done:
		return r.v, r.err
	case <-ctx.Done():
		return nil, ctxErr(ctx)
	case <-e.done:
		return nil, errStopped
	}
}

func ctxErr(ctx context.Context) error {
	if errors.Is(ctx.Err(), context.DeadlineExceeded) {
		return connect.NewError(connect.CodeDeadlineExceeded, "session: the command did not reach a step boundary before its deadline")
	}
	return connect.NewError(connect.CodeCanceled, "session: the command was cancelled")
}

// stop asks the engine to stop at the next step boundary.
func (e *engine) stop() { e.quitOnce.Do(func() { close(e.quit) }) }

// stepping reports whether the engine has steps to run.
func (e *engine) stepping() bool {
	return !e.launch && (e.fg != nil || (e.bg != nil && !e.paused))
}

// loop is the engine goroutine (interactive sessions).
func (e *engine) loop() {
	runtime.LockOSThread() // a device context is current per OS thread
	defer close(e.done)
	for {
		if e.stepping() {
			select {
			case c := <-e.cmds:
				e.exec(c)
				continue
			case <-e.quit:
				e.shutdown()
				return
			default:
			}
			e.stepOnce()
			continue
		}
		select {
		case c := <-e.cmds:
			e.exec(c)
		case <-e.quit:
			e.shutdown()
			return
		}
	}
}

// exec runs one command unless its caller has gone.
func (e *engine) exec(c *command) {
	if c.ctx.Err() != nil {
		return
	}
	v, err := func() (v any, err error) {
		defer func() {
			if r := recover(); r != nil {
				e.log.Error("command panicked", "panic", r)
				err = connect.Errorf(connect.CodeInternal, "session: internal error: %v", r)
			}
		}()
		return c.fn(c)
	}()
	if _, later := v.(deferred); later && err == nil {
		e.publishState("")
		return
	}
	e.updateSnap()
	c.reply(v, err)
}

// stepOnce runs one step of the foreground job, else of the background run.
func (e *engine) stepOnce() {
	j := e.fg
	if j == nil {
		j = e.bg
	}
	if e.prof != nil && e.prof.waiter.ctx.Err() != nil {
		e.prof = nil // the profile's caller went away
		if j.forProfile {
			e.endJob(j, nil, "the caller went away")
			return
		}
	}
	if j.waiter != nil && j.waiter.ctx.Err() != nil {
		e.endJob(j, nil, "the caller went away")
		return
	}
	m, err := e.step(context.Background())
	if err != nil {
		e.endJob(j, err, "")
		return
	}
	j.metrics = append(j.metrics, m)
	if e.t.Steps() >= j.target {
		e.endJob(j, nil, "")
	}
}

// step runs one trainer step with profiling when planned, publishes its metrics and returns
// them. It is the only place a step is taken in interactive mode.
func (e *engine) step(ctx context.Context) (*halov1.StepMetrics, error) {
	p := e.prof
	if p != nil && e.rec != nil {
		e.rec.Enable(true, p.trace)
		e.rec.BeginStep(e.t.Steps() + 1)
	}
	e.beginCapture()
	m, err := e.safeStep(ctx)
	e.endCapture(err == nil)
	var ps *profile.Step
	if p != nil && e.rec != nil {
		if err != nil {
			e.rec.AbortStep()
		} else if s, ok := e.rec.EndStep(); ok {
			ps = &s
		}
		e.rec.Enable(false, false)
		e.rec.Steps()
	}
	if err != nil {
		e.setErr(err)
		e.logEvent(slog.LevelError, fmt.Sprintf("step %d failed: %v", e.t.Steps()+1, err))
		if p != nil {
			e.prof = nil
			p.waiter.reply(nil, connect.NewError(connect.CodeAborted, "session: profile: "+err.Error()))
		}
		return nil, err
	}
	pm := metricsPB(m)
	e.addDeviceMetrics(pm)
	if cfg := e.t.Cfg; e.t.HasEval() && cfg.Run.EvalSteps > 0 && m.Step%cfg.Run.EvalSteps == 0 {
		if el, err := e.t.Eval(ctx); err == nil {
			pm.EvalLoss = &el
		} else {
			e.logEvent(slog.LevelWarn, fmt.Sprintf("eval after step %d: %v", m.Step, err))
		}
	}
	e.afterStep(pm, ps)
	return pm, nil
}

// addDeviceMetrics adds model FLOPs, throughput and memory to a step's metrics, and resets
// the memory peak for the next step.
func (e *engine) addDeviceMetrics(pm *halov1.StepMetrics) {
	a := e.t.Arch()
	tokens := float64(pm.Tokens)
	// A token passes through the top-k experts of each MoE layer only: the experts it skips
	// do no work for it and are not model FLOPs (for dense models the two counts agree).
	params := int64(e.t.NumParams()) - (a.Shape.NumParameters() - a.Shape.ActiveParameters())
	// Scores take the query/key width, outputs the value width (they differ under latent
	// attention); the pair cost counts their mean twice.
	qk, v := a.Shape.AttentionDims()
	pm.ModelFlops = backend.TrainingFLOPsPerToken(params, a.Layers, e.t.Cfg.Batch.MaxLength, a.Heads, (qk+v)/2) * tokens
	if pm.StepTimeS > 0 {
		pm.Tflops = pm.ModelFlops / pm.StepTimeS / 1e12
	}
	devs := e.t.RankDevices()
	names := make([]string, len(devs))
	if len(devs) == 0 {
		devs, names = []backend.Backend{e.t.Backend()}, []string{e.t.Backend().Name()}
	} else {
		// The devices of a parallel plan, each named with its rank.
		for r, b := range devs {
			names[r] = fmt.Sprintf("%s rank %d", b.Name(), r)
		}
	}
	for r, b := range devs {
		ms := b.MemStats()
		pm.Memory = append(pm.Memory, &halov1.DeviceMemory{Device: names[r], AllocatedBytes: ms.Allocated, ReservedBytes: ms.Reserved, PeakBytes: ms.Peak, TotalBytes: ms.Total})
		b.ResetPeak()
	}
}

// beginCapture starts capturing activations when a capture is armed.
func (e *engine) beginCapture() {
	if e.captureNext && e.rec != nil {
		e.rec.StartCapture()
	}
}

// endCapture keeps the activations captured during a successful step.
func (e *engine) endCapture(ok bool) {
	if !e.captureNext || e.rec == nil {
		return
	}
	acts := e.rec.StopCapture()
	if !ok || len(acts) == 0 {
		return
	}
	e.captureNext = false
	e.acts = activationStats(acts, e.t.Arch().Layers)
	e.actsStep = e.t.Steps()
	e.logEvent(slog.LevelInfo, fmt.Sprintf("captured %d activation statistics in step %d", len(e.acts), e.actsStep))
}

// activationStats names captured forward outputs by layer: an op that ran a multiple of
// layers times is spread evenly over the layers (one more run at the end, like the final
// norm, belongs to no layer); names read "layers.L.OP.J" (J-th OP of layer L) or "OP.J".
func activationStats(acts []profile.Activation, layers int) []*halov1.TensorStats {
	count := map[string]int{}
	for _, a := range acts {
		count[a.Op]++
	}
	seen := map[string]int{}
	out := make([]*halov1.TensorStats, 0, len(acts))
	for _, a := range acts {
		k := seen[a.Op]
		seen[a.Op]++
		c := count[a.Op]
		layer, j := -1, k
		switch {
		case layers > 0 && c%layers == 0:
			per := c / layers
			layer, j = k/per, k%per
		case layers > 0 && c > layers && (c-1)%layers == 0 && k < c-1:
			per := (c - 1) / layers
			layer, j = k/per, k%per
		}
		name := fmt.Sprintf("%s.%d", a.Op, j)
		if layer >= 0 {
			name = fmt.Sprintf("layers.%d.%s", layer, name)
		}
		st := &halov1.TensorStats{Name: name, Kind: "activation", Layer: int64(layer), Mean: a.Mean, Std: a.Std, Rms: a.RMS,
			MaxAbs: a.MaxAbs, Nan: a.NaN, Inf: a.Inf}
		for _, d := range a.Shape {
			st.Shape = append(st.Shape, int64(d))
		}
		out = append(out, st)
	}
	return out
}

// safeStep is Trainer.Step with a panic turned into an error, so a bug in a step never takes
// the session down.
func (e *engine) safeStep(ctx context.Context) (m train.StepMetrics, err error) {
	defer func() {
		if r := recover(); r != nil {
			e.log.Error("step panicked", "panic", r, "stack", string(debug.Stack()))
			err = fmt.Errorf("step %d: internal error: %v", e.t.Steps()+1, r)
		}
	}()
	return e.t.Step(ctx)
}

// afterStep publishes a finished step and advances the profile plan.
func (e *engine) afterStep(pm *halov1.StepMetrics, ps *profile.Step) {
	e.mu.Lock()
	e.snap.last = pm
	e.snap.lastErr = ""
	e.mu.Unlock()
	e.updateSnap()
	e.hub.publish(&halov1.Event{Kind: &halov1.Event_Metrics{Metrics: pm}})
	p := e.prof
	if p == nil {
		return
	}
	if ps != nil {
		pp := stepProfilePB(*ps, pm)
		e.hub.publish(&halov1.Event{Kind: &halov1.Event_Profile{Profile: pp}})
		p.steps = append(p.steps, *ps)
		p.metrics = append(p.metrics, pm)
	}
	p.remaining--
	if p.remaining <= 0 {
		e.prof = nil
		if e.repauseAfterProfile {
			// The batch run was paused when the profile was asked for: pause it again
			// (before replying, so that the caller's next Status sees it paused).
			e.repauseAfterProfile, e.paused = false, true
			e.publishState(fmt.Sprintf("paused after profiling %d step(s)", len(p.steps)))
		}
		p.waiter.reply(e.profileResponse(p), nil)
	}
}

// endJob finishes a job: replies to its waiter and updates the state.
func (e *engine) endJob(j *job, err error, reason string) {
	if j == e.fg {
		e.fg = nil
	} else if j == e.bg {
		e.bg = nil
		e.paused = false
	}
	if reason == "" && err != nil {
		reason = err.Error()
	}
	e.publishState(reason) // before replying, so the caller's next Status sees the new state
	if e.prof != nil && e.fg == nil && e.bg == nil {
		// Nothing will run the profiled steps: answer with what was measured.
		p := e.prof
		e.prof = nil
		p.waiter.reply(e.profileResponse(p), nil)
	}
	if j.waiter != nil {
		if err != nil {
			j.waiter.reply(nil, connect.NewError(connect.CodeAborted, "session: "+err.Error()))
		} else {
			j.waiter.reply(&halov1.StepResponse{Metrics: j.metrics}, nil)
		}
	}
}

// shutdown ends the engine: stop stepping, save when configured, free the trainer.
func (e *engine) shutdown() {
	e.stopping = true
	e.closeMeasure()
	e.updateSnap()
	e.publishState("stopping")
	for _, j := range []*job{e.fg, e.bg} {
		if j != nil && j.waiter != nil {
			j.waiter.reply(nil, errStopped)
		}
	}
	if e.prof != nil {
		e.prof.waiter.reply(nil, errStopped)
	}
	if e.t != nil && e.saveOnStop != "" && e.t.Steps() == 0 {
		e.logEvent(slog.LevelInfo, "no step taken: nothing saved on stop")
	} else if e.t != nil && e.saveOnStop != "" {
		if err := e.t.Save(e.saveOnStop); err != nil {
			e.logEvent(slog.LevelError, fmt.Sprintf("saving on stop to %s failed: %v", e.saveOnStop, err))
		} else {
			e.logEvent(slog.LevelInfo, fmt.Sprintf("saved step %d to %s", e.t.Steps(), e.saveOnStop))
		}
	}
	if e.t != nil && !e.launch {
		if err := e.t.Close(); err != nil {
			e.log.Warn("closing the trainer", "err", err)
		}
		e.t = nil
	}
}

// state derives the session state.
func (e *engine) state() halov1.State {
	switch {
	case e.stopping:
		return halov1.State_STATE_STOPPING
	case e.t == nil:
		return halov1.State_STATE_EMPTY
	case e.launch && e.paused:
		return halov1.State_STATE_PAUSED
	case e.launch:
		return halov1.State_STATE_RUNNING
	case e.fg != nil || (e.bg != nil && !e.paused):
		return halov1.State_STATE_RUNNING
	case e.bg != nil:
		return halov1.State_STATE_PAUSED
	}
	return halov1.State_STATE_IDLE
}

func (e *engine) updateSnap() {
	st := e.state()
	e.mu.Lock()
	defer e.mu.Unlock()
	e.snap.state = st
	if e.t == nil {
		e.snap.step, e.snap.total, e.snap.summary, e.snap.device, e.snap.hyper = 0, 0, "", "", nil
		return
	}
	e.snap.step = int64(e.t.Steps())
	e.snap.total = int64(e.t.TotalSteps())
	e.snap.hyper = hyperPB(e.t.Hyper())
	if e.snap.summary == "" {
		e.snap.summary = e.t.Summary()
	}
	e.snap.device = e.t.Backend().Name()
	e.snap.layout = e.t.Layout()
}

func (e *engine) snapshot() snapshot {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.snap
}

func (e *engine) setErr(err error) {
	e.mu.Lock()
	e.snap.lastErr = err.Error()
	e.mu.Unlock()
}

func (e *engine) publishState(reason string) {
	e.updateSnap()
	s := e.snapshot()
	ctl := ""
	if e.controller != nil {
		ctl = e.controller()
	}
	e.hub.publish(&halov1.Event{Kind: &halov1.Event_State{State: &halov1.StateEvent{State: s.state, Step: s.step, Controller: ctl, Reason: reason}}})
}

func (e *engine) logEvent(level slog.Level, msg string) {
	e.log.Log(context.Background(), level, msg)
	e.hub.publish(&halov1.Event{Kind: &halov1.Event_Log{Log: &halov1.LogEvent{Level: strings.ToLower(level.String()), Message: msg}}})
}

// serveBoundary serves queued commands at a step boundary of a batch run (ServeRun), and
// blocks while the run is paused.
func (e *engine) serveBoundary(ctx context.Context) {
	for {
		if !e.paused {
			select {
			case c := <-e.cmds:
				e.exec(c)
				continue
			default:
				return
			}
		}
		select {
		case c := <-e.cmds:
			e.exec(c)
		case <-ctx.Done():
			e.paused = false
			return
		}
	}
}

// ---- commands (each runs on the engine goroutine) ----

func precondition(format string, args ...any) error {
	return connect.Errorf(connect.CodeFailedPrecondition, "session: "+format, args...)
}

func (e *engine) needTrainer() error {
	if e.t == nil {
		return precondition("no model is loaded: load a config first (Load, or `session start --config C.yaml`)")
	}
	return nil
}

func (e *engine) needInteractive(what string) error {
	if e.launch {
		return precondition("%s: this session serves a batch run (launch), which steps by itself; pause, resume, profile, inspect and save work", what)
	}
	return nil
}

// configPath is one file or directory a config names, for confinement.
type configPath struct{ what, path string }

// configPaths lists every file and directory cfg reads or writes: the model, the tokenizer,
// the datasets, the checkpoint to resume from and the output directory.
func configPaths(cfg *train.Config) []configPath {
	ps := []configPath{
		{"model_name_or_path", cfg.Model.ModelNameOrPath},
		{"tokenizer_name_or_path", cfg.Model.TokenizerNameOrPath},
		{"resume_from_checkpoint", cfg.Run.ResumeFromCheckpoint},
		{"output_dir", cfg.Run.OutputDir},
	}
	for _, p := range cfg.Dataset.Path {
		ps = append(ps, configPath{"dataset.path", p})
	}
	for _, p := range cfg.Dataset.EvalPath {
		ps = append(ps, configPath{"dataset.eval_path", p})
	}
	return ps
}

// cmdLoad builds a trainer from req and installs it. confine, for a remote client, checks
// every path the config names (configPaths) as it checks the config's own path.
func (e *engine) cmdLoad(req *halov1.LoadRequest, confine func(what, path string) (string, error)) (any, error) {
	if err := e.needInteractive("load"); err != nil {
		return nil, err
	}
	if e.stepping() {
		return nil, precondition("load: steps are running; pause first")
	}
	if e.t != nil && !req.Force {
		if saved := e.snapshot().saved; int64(e.t.Steps()) > saved {
			return nil, precondition("load: the loaded model has %d trained step(s) not saved (step %d, last saved or loaded at step %d) that loading would discard; save them first (:save DIR), or load anyway with :load --force CONFIG (%%load --force in a notebook, halo.LoadForce in a cell)",
				int64(e.t.Steps())-saved, e.t.Steps(), saved)
		}
	}
	method := req.Method
	if method == "" {
		method = train.MethodSFT
	}
	var (
		cfg *train.Config
		err error
	)
	switch {
	case req.ConfigPath != "" && req.ConfigYaml != "":
		return nil, connect.NewError(connect.CodeInvalidArgument, "session: load: give config_path or config_yaml, not both")
	case req.ConfigPath != "":
		cfg, err = train.LoadConfig(req.ConfigPath, method, req.Overrides)
	case req.ConfigYaml != "":
		cfg, err = train.ParseConfig([]byte(req.ConfigYaml), "inline config", method, req.Overrides)
	default:
		return nil, connect.NewError(connect.CodeInvalidArgument, "session: load: config_path or config_yaml is required")
	}
	if err != nil {
		return nil, connect.NewError(connect.CodeInvalidArgument, err.Error())
	}
	if confine != nil {
		for _, p := range configPaths(cfg) {
			if _, err := confine(p.what, p.path); err != nil {
				return nil, err
			}
		}
	}
	e.logEvent(slog.LevelInfo, "loading "+firstNonEmpty(req.ConfigPath, "inline config"))
	t, err := NewTrainer(cfg)
	if err != nil {
		return nil, connect.NewError(connect.CodeInvalidArgument, "session: load: "+err.Error())
	}
	e.install(t)
	e.logEvent(slog.LevelInfo, t.Summary())
	return &halov1.LoadResponse{Summary: t.Summary()}, nil
}

// install makes t the session's trainer, closing the previous one.
func (e *engine) install(t *train.Trainer) {
	if e.t != nil && e.t != t {
		if err := e.t.Close(); err != nil {
			e.log.Warn("closing the previous trainer", "err", err)
		}
	}
	e.t, e.bg, e.paused, e.fg, e.tok, e.tokDir = t, nil, false, nil, nil, ""
	t.SetClientReward(e.rewards)
	e.rec = newRecs(t)
	e.mu.Lock()
	e.snap.summary, e.snap.last, e.snap.lastErr, e.snap.saved = t.Summary(), nil, "", int64(t.Steps())
	e.mu.Unlock()
	e.publishState(reasonLoaded)
}

func (e *engine) cmdStep(c *command, n int) (any, error) {
	if err := errors.Join(e.needTrainer(), e.needInteractive("step")); err != nil {
		return nil, err
	}
	if n <= 0 || n > 1_000_000 {
		return nil, connect.Errorf(connect.CodeInvalidArgument, "session: step: n must be between 1 and 1000000, got %d", n)
	}
	if e.stepping() {
		return nil, precondition("step: a run is in progress; pause it first (or observe it with Events)")
	}
	e.fg = &job{target: e.t.Steps() + n, waiter: c}
	return deferred{}, nil
}

func (e *engine) cmdRun(maxSteps int64) (any, error) {
	if err := errors.Join(e.needTrainer(), e.needInteractive("run")); err != nil {
		return nil, err
	}
	if e.stepping() {
		return nil, precondition("run: a run is already in progress")
	}
	if maxSteps < 0 {
		return nil, connect.Errorf(connect.CodeInvalidArgument, "session: run: max_steps must be >= 0, got %d", maxSteps)
	}
	target := e.t.TotalSteps()
	if maxSteps > 0 {
		target = e.t.Steps() + int(min(maxSteps, math.MaxInt32))
	}
	if target <= e.t.Steps() {
		return nil, precondition("run: the planned %d steps are done; pass max_steps to train further", e.t.TotalSteps())
	}
	e.bg, e.paused = &job{target: target}, false
	e.logEvent(slog.LevelInfo, fmt.Sprintf("running to step %d", target))
	return e.statusPB(), nil
}

func (e *engine) cmdPause() (any, error) {
	if err := e.needTrainer(); err != nil {
		return nil, err
	}
	switch {
	case e.launch:
		e.paused = true
	case e.fg != nil:
		e.endJob(e.fg, nil, "paused")
	case e.bg != nil && !e.paused:
		e.paused = true
	case e.bg != nil:
	default:
		return nil, precondition("pause: nothing is running")
	}
	e.publishState("paused")
	e.logEvent(slog.LevelInfo, fmt.Sprintf("paused after step %d", e.t.Steps()))
	return e.statusPB(), nil
}

func (e *engine) cmdResume() (any, error) {
	if err := e.needTrainer(); err != nil {
		return nil, err
	}
	if !e.paused {
		return nil, precondition("resume: nothing is paused (start training with Run or Step)")
	}
	e.paused = false
	e.publishState("resumed")
	return e.statusPB(), nil
}

func (e *engine) cmdEval(ctx context.Context) (any, error) {
	if err := e.needTrainer(); err != nil {
		return nil, err
	}
	l, err := e.t.Eval(ctx)
	if err != nil {
		return nil, precondition("eval: %v", err)
	}
	e.logEvent(slog.LevelInfo, fmt.Sprintf("held-out loss after step %d: %.4f", e.t.Steps(), l))
	return &halov1.EvalResponse{Loss: l, Step: int64(e.t.Steps())}, nil
}

func (e *engine) cmdSave(dir string) (any, error) {
	if err := e.needTrainer(); err != nil {
		return nil, err
	}
	if strings.TrimSpace(dir) == "" {
		return nil, connect.NewError(connect.CodeInvalidArgument, "session: save: dir is required")
	}
	if err := e.t.Save(dir); err != nil {
		return nil, connect.NewError(connect.CodeInternal, "session: save: "+err.Error())
	}
	e.mu.Lock()
	e.snap.saved = int64(e.t.Steps())
	e.mu.Unlock()
	e.logEvent(slog.LevelInfo, fmt.Sprintf("saved step %d to %s", e.t.Steps(), dir))
	return &halov1.SaveResponse{Dir: dir, Step: int64(e.t.Steps())}, nil
}

func (e *engine) cmdSetHyper(r *halov1.SetHyperRequest) (any, error) {
	if err := e.needTrainer(); err != nil {
		return nil, err
	}
	h := e.t.Hyper()
	var changed []string
	set := func(name string, ok bool, apply func()) {
		if ok {
			apply()
			changed = append(changed, name)
		}
	}
	set("learning_rate", r.LearningRate != nil, func() { h.LearningRate = r.GetLearningRate() })
	set("lr_scheduler_type", r.LrSchedulerType != nil, func() { h.LRSchedulerType = r.GetLrSchedulerType() })
	set("weight_decay", r.WeightDecay != nil, func() { h.WeightDecay = r.GetWeightDecay() })
	set("adam_beta1", r.AdamBeta1 != nil, func() { h.AdamBeta1 = r.GetAdamBeta1() })
	set("adam_beta2", r.AdamBeta2 != nil, func() { h.AdamBeta2 = r.GetAdamBeta2() })
	set("adam_epsilon", r.AdamEpsilon != nil, func() { h.AdamEpsilon = r.GetAdamEpsilon() })
	set("max_grad_norm", r.MaxGradNorm != nil, func() { h.MaxGradNorm = r.GetMaxGradNorm() })
	set("gradient_accumulation_steps", r.GradientAccumulationSteps != nil, func() { h.GradientAccumulationSteps = int(r.GetGradientAccumulationSteps()) })
	if len(changed) == 0 {
		return nil, connect.NewError(connect.CodeInvalidArgument, "session: set hyper: no field is set")
	}
	if err := e.t.SetHyper(h); err != nil {
		return nil, connect.NewError(connect.CodeInvalidArgument, "session: set hyper: "+err.Error())
	}
	e.updateSnap()
	e.logEvent(slog.LevelInfo, fmt.Sprintf("from step %d: %s", e.t.Steps()+1, describeHyper(h, changed)))
	return hyperPB(e.t.Hyper()), nil
}

// cmdSetLayout moves the run to another layout; commands run at step boundaries, so no step
// is torn. A refused target leaves the run as it was.
func (e *engine) cmdSetLayout(spec string) (any, error) {
	if err := e.needTrainer(); err != nil {
		return nil, err
	}
	if strings.TrimSpace(spec) == "" {
		return nil, connect.NewError(connect.CodeInvalidArgument, "session: set layout: give a layout, e.g. \"tp=2\" or \"devices=cpu:4 tp=2 fsdp\" (\"dp=1\" goes back to one device)")
	}
	before := e.t.Layout()
	d, err := e.t.SetLayout(spec)
	if err != nil {
		e.logEvent(slog.LevelWarn, fmt.Sprintf("layout %q refused at step %d; the run continues in %s on %s: %v", spec, e.t.Steps(), before.Layout, before.Devices, err))
		return nil, connect.NewError(connect.CodeInvalidArgument, "session: set layout: "+err.Error())
	}
	now := e.t.Layout()
	e.updateSnap()
	e.logEvent(slog.LevelInfo, fmt.Sprintf("layout at step %d: %s on %s (was %s on %s), redistributed in %.3f s",
		e.t.Steps(), now.Layout, now.Devices, before.Layout, before.Devices, d.Seconds()))
	return &halov1.SetLayoutResponse{Layout: now.Layout, Devices: now.Devices, Previous: before.Layout,
		DurationS: d.Seconds(), Step: int64(e.t.Steps())}, nil
}

func describeHyper(h train.Hyper, fields []string) string {
	var parts []string
	pb := hyperPB(h)
	m := map[string]string{
		"learning_rate": strconv.FormatFloat(pb.LearningRate, 'g', -1, 64), "lr_scheduler_type": pb.LrSchedulerType,
		"weight_decay": strconv.FormatFloat(pb.WeightDecay, 'g', -1, 64), "adam_beta1": strconv.FormatFloat(pb.AdamBeta1, 'g', -1, 64),
		"adam_beta2": strconv.FormatFloat(pb.AdamBeta2, 'g', -1, 64), "adam_epsilon": strconv.FormatFloat(pb.AdamEpsilon, 'g', -1, 64),
		"max_grad_norm": strconv.FormatFloat(pb.MaxGradNorm, 'g', -1, 64), "gradient_accumulation_steps": strconv.Itoa(int(pb.GradientAccumulationSteps)),
	}
	for _, f := range fields {
		parts = append(parts, f+"="+m[f])
	}
	return strings.Join(parts, " ")
}

func (e *engine) cmdProfile(c *command, k int, trace bool) (any, error) {
	if err := e.needTrainer(); err != nil {
		return nil, err
	}
	if k <= 0 || k > 1000 {
		return nil, connect.Errorf(connect.CodeInvalidArgument, "session: profile: steps must be between 1 and 1000, got %d", k)
	}
	if e.rec == nil {
		return nil, precondition("profile: the trainer's backend was opened without profiling support (build it with server.NewTrainer, not train.New)")
	}
	if e.prof != nil {
		return nil, precondition("profile: a profile is already being taken")
	}
	e.prof = &profPlan{remaining: k, trace: trace, waiter: c}
	switch {
	case !e.launch && !e.stepping():
		e.fg = &job{target: e.t.Steps() + k, forProfile: true}
	case e.launch && e.paused:
		// A paused batch run steps k more steps for the profile, then pauses again; without
		// this the profile would wait for a resume that its caller cannot give while it waits.
		e.paused, e.repauseAfterProfile = false, true
		e.publishState(fmt.Sprintf("profiling %d step(s) of the paused run", k))
	}
	return deferred{}, nil
}

const maxInspectValues = 1 << 20

func (e *engine) cmdInspect(r *halov1.InspectRequest) (any, error) {
	if err := e.needTrainer(); err != nil {
		return nil, err
	}
	if r.Activations {
		if e.rec == nil {
			return nil, precondition("inspect: the trainer's backend was opened without profiling support, which activation capture needs")
		}
		e.captureNext = true
	}
	kind := r.Kind
	if kind == "" {
		kind = "param"
	}
	if kind != "param" && kind != "grad" && kind != "activation" && kind != "adapter" {
		return nil, connect.Errorf(connect.CodeInvalidArgument, "session: inspect: kind %q: want param, grad, activation or adapter", kind)
	}
	if kind == "adapter" {
		return e.inspectAdapters()
	}
	if kind == "activation" && r.Name != "" {
		for _, a := range e.acts {
			if a.Name == r.Name {
				if r.Count != 0 {
					return nil, connect.NewError(connect.CodeInvalidArgument, "session: inspect: activations keep statistics only, not values")
				}
				return &halov1.InspectResponse{Step: int64(e.actsStep), Stats: []*halov1.TensorStats{a}}, nil
			}
		}
		return nil, connect.Errorf(connect.CodeNotFound, "session: inspect: no captured activation %q (capture with activations=true, take a step, then list them with an empty name)", r.Name)
	}
	// On a parallel plan this gathers the parameters of the last step (once per step).
	m, err := e.t.HostModel()
	if err != nil {
		return nil, connect.NewError(connect.CodeInternal, "session: inspect: "+err.Error())
	}
	resp := &halov1.InspectResponse{Step: int64(e.t.Steps())}
	get := func(name, kind string) ([]float32, error) {
		if kind == "grad" {
			if m.Grads == nil {
				return nil, precondition("inspect: no gradients yet: take a step first")
			}
			if err := e.t.SyncGrads(); err != nil {
				return nil, connect.NewError(connect.CodeInternal, "session: inspect: "+err.Error())
			}
			return m.GradFloat32(name)
		}
		return m.ParamFloat32(name)
	}
	if r.Name == "" {
		if r.Count != 0 || r.Offset != 0 {
			return nil, connect.NewError(connect.CodeInvalidArgument, "session: inspect: offset and count need a tensor name")
		}
		for _, sp := range m.Specs {
			for _, k := range []string{"param", "grad"} {
				if k == "grad" && m.Grads == nil {
					continue
				}
				v, err := get(sp.Name, k)
				if err != nil {
					return nil, connect.NewError(connect.CodeInternal, "session: inspect: "+err.Error())
				}
				resp.Stats = append(resp.Stats, tensorStats(sp.Name, k, sp.Shape, v))
			}
		}
		resp.Stats = append(resp.Stats, e.acts...)
		return resp, nil
	}
	i := slices.IndexFunc(m.Specs, func(s models.ParamSpec) bool { return s.Name == r.Name })
	if i < 0 {
		return nil, connect.Errorf(connect.CodeNotFound, "session: inspect: no tensor %q (Inspect with an empty name lists them)", r.Name)
	}
	v, err := get(r.Name, kind)
	if err != nil {
		if connect.CodeOf(err) != connect.CodeUnknown {
			return nil, err
		}
		return nil, connect.NewError(connect.CodeInternal, "session: inspect: "+err.Error())
	}
	resp.Stats = []*halov1.TensorStats{tensorStats(r.Name, kind, m.Specs[i].Shape, v)}
	if r.Count < 0 || r.Offset < 0 {
		return nil, connect.Errorf(connect.CodeInvalidArgument, "session: inspect: offset %d and count %d must be >= 0", r.Offset, r.Count)
	}
	if r.Count > 0 {
		if r.Offset >= int64(len(v)) {
			return nil, connect.Errorf(connect.CodeOutOfRange, "session: inspect: tensor %q has %d values; offset %d is past the end", r.Name, len(v), r.Offset)
		}
		if r.Count > maxInspectValues {
			return nil, connect.Errorf(connect.CodeInvalidArgument, "session: inspect: count %d is more than %d values; ask for slices", r.Count, maxInspectValues)
		}
		end := min(int64(len(v)), r.Offset+r.Count)
		resp.Values = v[r.Offset:end]
	}
	return resp, nil
}

// inspectAdapters returns the norms of every LoRA adapter of the run.
func (e *engine) inspectAdapters() (any, error) {
	m, err := e.t.HostModel()
	if err != nil {
		return nil, connect.NewError(connect.CodeInternal, "session: inspect: "+err.Error())
	}
	if m.LoRA() == nil {
		return nil, precondition("inspect: kind adapter: the run has no LoRA adapters (set use_peft: true to train some)")
	}
	norms, err := m.AdapterNorms()
	if err != nil {
		return nil, connect.NewError(connect.CodeInternal, "session: inspect: "+err.Error())
	}
	resp := &halov1.InspectResponse{Step: int64(e.t.Steps())}
	for _, n := range norms {
		resp.Adapters = append(resp.Adapters, &halov1.AdapterNorm{Module: n.Module, Layer: layerOf(n.Module + "."),
			ANorm: n.A, BNorm: n.B, DeltaNorm: n.Delta})
	}
	return resp, nil
}

// layerOf returns N of "model.layers.N." names, else -1.
func layerOf(name string) int64 {
	const p = "model.layers."
	i := strings.Index(name, p)
	if i < 0 {
		return -1
	}
	rest := name[i+len(p):]
	j := strings.IndexByte(rest, '.')
	if j < 0 {
		return -1
	}
	n, err := strconv.Atoi(rest[:j])
	if err != nil {
		return -1
	}
	return int64(n)
}

func tensorStats(name, kind string, shape []int, v []float32) *halov1.TensorStats {
	st := profile.Summarize(v)
	s := &halov1.TensorStats{Name: name, Kind: kind, Layer: layerOf(name),
		Mean: st.Mean, Std: st.Std, Rms: st.RMS, MaxAbs: st.MaxAbs, Nan: st.NaN, Inf: st.Inf}
	for _, d := range shape {
		s.Shape = append(s.Shape, int64(d))
	}
	return s
}

// generation is what Generate needs beyond the model: the tokenizer and stop tokens.
func (e *engine) tokenizer() (*tokenizer.Tokenizer, string, error) {
	if e.tok != nil {
		return e.tok, e.tokDir, nil
	}
	dir := e.t.Cfg.Model.TokenizerNameOrPath
	if dir == "" {
		dir = e.t.Cfg.Model.ModelNameOrPath
	}
	tok, err := tokenizer.FromDir(dir)
	if err != nil {
		return nil, "", precondition("generate: tokenizer: %v", err)
	}
	e.tok, e.tokDir = tok, dir
	return tok, dir, nil
}

// cmdGenerate runs generation on the engine goroutine, sending pieces to out (buffered for
// every token, so the engine never waits on the client).
func (e *engine) cmdGenerate(r *halov1.GenerateRequest, out chan<- *halov1.GenerateResponse) (any, error) {
	if err := e.needTrainer(); err != nil {
		return nil, err
	}
	tok, dir, err := e.tokenizer()
	if err != nil {
		return nil, err
	}
	text := r.Prompt
	if r.Chat {
		tpl, err := chat.Load(dir)
		if err != nil {
			return nil, precondition("generate: chat template: %v", err)
		}
		if text, err = tpl.Render([]chat.Message{{Role: "user", Content: chat.Text(r.Prompt)}}, chat.Options{AddGenerationPrompt: true}); err != nil {
			return nil, precondition("generate: chat template: %v", err)
		}
	}
	var ids []int32
	for _, id := range tok.Encode(text) {
		ids = append(ids, int32(id))
	}
	if len(ids) == 0 {
		return nil, connect.NewError(connect.CodeInvalidArgument, "session: generate: the prompt encodes to no tokens")
	}
	m, err := e.t.HostModel()
	if err != nil {
		return nil, connect.NewError(connect.CodeInternal, "session: generate: "+err.Error())
	}
	if r.WithoutAdapter {
		if m.LoRA() == nil {
			return nil, precondition("generate: without_adapter: the run has no LoRA adapters (set use_peft: true to train some)")
		}
		m.SetAdaptersEnabled(false)
		defer m.SetAdaptersEnabled(true)
	}
	o := models.GenerateOptions{MaxNewTokens: int(r.MaxNewTokens), Temperature: r.Temperature, TopK: int(r.TopK), TopP: r.TopP, Seed: r.Seed}
	if cfg := m.Config(); cfg != nil {
		for _, id := range cfg.EOSTokenIDs {
			o.StopIDs = append(o.StopIDs, int32(id))
		}
	}
	for _, s := range []string{"<|im_end|>", "<|endoftext|>", "<|eot_id|>", "</s>"} {
		if id, ok := tok.TokenToID(s); ok && !slices.Contains(o.StopIDs, int32(id)) {
			o.StopIDs = append(o.StopIDs, int32(id))
		}
	}
	dec := tok.NewStreamDecoder(true)
	n := int32(0)
	o.OnToken = func(id int32) error {
		n++
		if slices.Contains(o.StopIDs, id) {
			return nil
		}
		s, err := dec.Step(int(id))
		if err != nil {
			return err
		}
		if s != "" {
			out <- &halov1.GenerateResponse{Text: s, Tokens: n}
		}
		return nil
	}
	if _, err := m.Generate(ids, o); err != nil {
		return nil, connect.NewError(connect.CodeInvalidArgument, "session: generate: "+err.Error())
	}
	out <- &halov1.GenerateResponse{Done: true, Tokens: n}
	return nil, nil
}

func (e *engine) statusPB() *halov1.StatusResponse {
	e.updateSnap()
	s := e.snapshot()
	return &halov1.StatusResponse{Name: e.name, State: s.state, Step: s.step, TotalSteps: s.total,
		ConfigSummary: s.summary, Device: s.device, Hyper: s.hyper, LastError: s.lastErr, LastMetrics: s.last,
		Layout: s.layout.Layout, Devices: s.layout.Devices, SavedStep: s.saved}
}

func firstNonEmpty(a, b string) string {
	if a != "" {
		return a
	}
	return b
}

// ---- conversions ----

func metricsPB(m train.StepMetrics) *halov1.StepMetrics {
	pm := &halov1.StepMetrics{Step: int64(m.Step), Loss: m.Loss, GradNorm: m.GradNorm, Lr: m.LR, Tokens: int64(m.Tokens),
		TokensPerS: m.TokensPerS, Targets: int64(m.Targets), Epoch: m.Epoch, StepTimeS: m.StepTimeS, EvalLoss: m.EvalLoss}
	if len(m.TimeByOpS) > 0 {
		pm.TimeByOpS = m.TimeByOpS
	}
	pm.AuxLoss = m.AuxLoss
	if len(m.Method) > 0 {
		pm.Method = m.Method
	}
	for _, l := range m.ExpertLoad {
		el := &halov1.ExpertLoad{Layer: int32(l.Layer), Max: int64(l.Max), Min: int64(l.Min), Cv: l.CV, Dead: int32(l.Dead),
			Tokens: make([]int64, len(l.Tokens))}
		for e, n := range l.Tokens {
			el.Tokens[e] = int64(n)
		}
		pm.ExpertLoad = append(pm.ExpertLoad, el)
	}
	return pm
}

func hyperPB(h train.Hyper) *halov1.Hyper {
	return &halov1.Hyper{LearningRate: h.LearningRate, LrSchedulerType: h.LRSchedulerType, WeightDecay: h.WeightDecay,
		AdamBeta1: h.AdamBeta1, AdamBeta2: h.AdamBeta2, AdamEpsilon: h.AdamEpsilon, MaxGradNorm: h.MaxGradNorm,
		GradientAccumulationSteps: int32(h.GradientAccumulationSteps)}
}

func stepProfilePB(s profile.Step, m *halov1.StepMetrics) *halov1.StepProfile {
	p := &halov1.StepProfile{Step: int64(s.Step), StepS: s.Wall.Seconds(), HostS: s.Host.Seconds(), Ops: int64(s.Ops), Syncs: s.Syncs,
		Flops: float64(s.FLOPs), Bytes: float64(s.Bytes), Metrics: m, ComputeS: map[string]float64{}, CommS: map[string]float64{}}
	for _, c := range profile.Classes {
		p.ComputeS[c] = s.Compute[c].Seconds()
	}
	for k, d := range s.Compute {
		p.ComputeS[k] = d.Seconds()
	}
	for k, d := range s.Comm {
		p.CommS[k] = d.Seconds()
	}
	if len(s.CommBytes) > 0 {
		p.CommBytes = map[string]float64{}
		for k, b := range s.CommBytes {
			p.CommBytes[k] = float64(b)
		}
	}
	return p
}

func (e *engine) profileResponse(p *profPlan) *halov1.ProfileResponse {
	r := &halov1.ProfileResponse{}
	for i, s := range p.steps {
		r.Steps = append(r.Steps, stepProfilePB(s, p.metrics[i]))
	}
	if p.trace && len(p.steps) > 0 {
		var b strings.Builder
		if err := e.rec.writeTrace(&b, p.steps); err == nil {
			r.TraceJson = []byte(b.String())
		}
	}
	return r
}
