package train

import (
	"context"
	"errors"
	"fmt"
	"math"
	"slices"
	"strings"
	"time"

	"github.com/halo-shell/halo-shell/engine/data"
	"github.com/halo-shell/halo-shell/engine/models"
)

// GRPO: group relative policy optimisation with built-in generation (TRL's GRPOTrainer). A
// step draws its prompts, samples num_generations completions of each with the policy,
// scores them with the reward functions, turns the rewards into group-normalised advantages
// and trains on the completions with the clipped surrogate (grpo_loss.go), num_iterations
// optimizer steps per generation batch. The optimizer part of a step is the common one
// (deviceSteps: gradient norm, clipping, AdamW); only the making of the micro-batches and
// the loss differ.

// MethodGRPO is the method's name.
const MethodGRPO = "grpo"

// Reward failure policies.
const (
	RewardFailureRetry = "retry"
	RewardFailureSkip  = "skip"
)

func init() {
	RegisterMethod(&MethodSpec{
		Name:     MethodGRPO,
		Summary:  "group relative policy optimisation: sample completions, score them with reward functions, reinforce the better ones",
		Parallel: true, WholeSequences: true,
		Keys: []string{"beta", "loss_type", "ref_model_name_or_path", "num_generations", "max_completion_length", "temperature", "top_p",
			"top_k", "epsilon", "epsilon_high", "scale_rewards", "num_iterations", "mask_truncated_completions", "reward_funcs",
			"reward_timeout", "reward_retries", "reward_failure"},
		Defaults: grpoDefaults,
		Validate: grpoValidate,
		Setup:    newGRPO,
	})
}

func defaultInt(p **int, v int) {
	if *p == nil {
		*p = &v
	}
}

func grpoDefaults(c *Config) {
	o := &c.Objective
	defaultFloat(&o.Beta, 0)
	if o.LossType == "" {
		o.LossType = LossDAPO
	}
	defaultInt(&o.NumGenerations, 8)
	defaultInt(&o.MaxCompletionLength, 256)
	defaultFloat(&o.Temperature, 1)
	defaultFloat(&o.TopP, 1)
	defaultInt(&o.TopK, 0)
	defaultFloat(&o.Epsilon, 0.2)
	defaultFloat(&o.EpsilonHigh, *o.Epsilon)
	if o.ScaleRewards == "" {
		o.ScaleRewards = ScaleGroup
	}
	defaultInt(&o.NumIterations, 1)
	defaultFloat(&o.RewardTimeout, 60)
	defaultInt(&o.RewardRetries, 1)
	if o.RewardFailure == "" {
		o.RewardFailure = RewardFailureRetry
	}
}

func grpoValidate(c *Config, bad func(key, format string, args ...any)) {
	o := &c.Objective
	if o.Beta != nil && (*o.Beta < 0 || math.IsNaN(*o.Beta)) {
		bad("beta", "beta %v must be >= 0 (0: no KL term and no reference model)", *o.Beta)
	}
	if !slices.Contains(grpoLossTypes, o.LossType) {
		bad("loss_type", "loss_type %q: use one of %s", o.LossType, strings.Join(grpoLossTypes, ", "))
	}
	if !slices.Contains(grpoScales, o.ScaleRewards) {
		bad("scale_rewards", "scale_rewards %q: use one of %s", o.ScaleRewards, strings.Join(grpoScales, ", "))
	}
	if o.RewardFailure != RewardFailureRetry && o.RewardFailure != RewardFailureSkip {
		bad("reward_failure", "reward_failure %q: use retry or skip", o.RewardFailure)
	}
	g := *o.NumGenerations
	if g < 2 {
		bad("num_generations", "num_generations %d must be at least 2 (advantages compare the completions of one prompt)", g)
	} else if per := c.Batch.PerDeviceTrainBatchSize * c.Batch.GradientAccumulationSteps; per%g != 0 {
		bad("num_generations", "per_device_train_batch_size * gradient_accumulation_steps = %d completions per step is not a multiple of num_generations %d", per, g)
	}
	if n := *o.MaxCompletionLength; n < 1 {
		bad("max_completion_length", "max_completion_length %d must be >= 1", n)
	}
	if v := *o.Temperature; !(v > 0) {
		bad("temperature", "temperature %v must be > 0 (GRPO samples; 0 would make every completion of a prompt the same)", v)
	}
	if v := *o.TopP; !(v > 0 && v <= 1) {
		bad("top_p", "top_p %v must be in (0, 1]", v)
	}
	if *o.TopK < 0 {
		bad("top_k", "top_k %d must be >= 0 (0: off)", *o.TopK)
	}
	if v := *o.Epsilon; !(v >= 0 && v < 1) {
		bad("epsilon", "epsilon %v must be in [0, 1)", v)
	}
	if v := *o.EpsilonHigh; !(v >= 0) {
		bad("epsilon_high", "epsilon_high %v must be >= 0", v)
	}
	if *o.NumIterations < 1 {
		bad("num_iterations", "num_iterations %d must be >= 1", *o.NumIterations)
	}
	if v := *o.RewardTimeout; !(v > 0) {
		bad("reward_timeout", "reward_timeout %v must be > 0 seconds", v)
	}
	if *o.RewardRetries < 0 {
		bad("reward_retries", "reward_retries %d must be >= 0", *o.RewardRetries)
	}
	if len(o.RewardFuncs) == 0 {
		bad("reward_funcs", "GRPO needs at least one reward function: reward_funcs: [{name: arithmetic}] (one of %s)", strings.Join(RewardNames, ", "))
	}
	for i, r := range o.RewardFuncs {
		key := fmt.Sprintf("reward_funcs[%d]", i)
		if r.Weight != nil && (math.IsNaN(*r.Weight) || math.IsInf(*r.Weight, 0)) {
			bad(key, "weight %v must be finite", *r.Weight)
		}
		if r.Name == RewardClient {
			continue
		}
		if _, err := builtinReward(r); err != nil {
			bad(key, "%v", err)
		}
	}
	if o.RefModelNameOrPath != "" {
		bad("ref_model_name_or_path", "GRPO's reference is the model the run starts from (or the base under LoRA): remove ref_model_name_or_path")
	}
}

// grpo is the method's state in a run.
type grpo struct {
	t        *Trainer
	sample   sampleOptions
	loss     grpoLoss
	scale    string
	iters    int
	skip     bool
	rewards  rewardRunner
	names    []string
	prompts  map[string]int // prompt tokens -> index into recs
	recs     []grpoPrompt
	dropped  int
	dropNote string
	ref      *models.Model // the frozen reference (beta > 0, without LoRA); nil otherwise
	roll     *grpoRollouts // the current generation batch
	next     int           // the micro-batch ForwardBackward is called for next
	perMicro int
}

// clientRewardProxy is reward function "client": it forwards to the trainer's client reward
// at call time, so the session can attach one after the trainer is built.
type clientRewardProxy struct{ t *Trainer }

func (c clientRewardProxy) Name() string { return RewardClient }

func (c clientRewardProxy) Rewards(ctx context.Context, rs []Rollout) ([]float64, error) {
	if c.t.clientReward == nil {
		return nil, ErrNoClientReward
	}
	return c.t.clientReward.Rewards(ctx, rs)
}

func newGRPO(t *Trainer) (Objective, error) {
	cfg := t.Cfg
	o := cfg.Objective
	if err := t.tok.needTokenizer("grpo"); err != nil {
		return nil, fmt.Errorf("train: %w", err)
	}
	g := &grpo{t: t, scale: o.ScaleRewards, iters: *o.NumIterations, skip: o.RewardFailure == RewardFailureSkip,
		perMicro: cfg.Batch.PerDeviceTrainBatchSize, prompts: map[string]int{}}
	g.sample = sampleOptions{G: *o.NumGenerations, MaxCompletionLen: *o.MaxCompletionLength, Temperature: *o.Temperature,
		TopP: *o.TopP, TopK: *o.TopK, MaskTruncated: o.MaskTruncatedCompletions}
	g.loss = grpoLoss{Type: o.LossType, EpsLow: *o.Epsilon, EpsHigh: *o.EpsilonHigh, Beta: *o.Beta, MaxCompletionLen: *o.MaxCompletionLength}
	g.rewards = rewardRunner{timeout: time.Duration(*o.RewardTimeout * float64(time.Second)), retries: *o.RewardRetries}
	for _, spec := range o.RewardFuncs {
		var f RewardFunc = clientRewardProxy{t}
		if spec.Name != RewardClient {
			var err error
			if f, err = builtinReward(spec); err != nil {
				return nil, fmt.Errorf("train: %w", err)
			}
		}
		w := 1.0
		if spec.Weight != nil {
			w = *spec.Weight
		}
		g.rewards.funcs = append(g.rewards.funcs, f)
		g.rewards.weights = append(g.rewards.weights, w)
	}
	g.names = uniqueNames(g.rewards.funcs)

	trainRecs, evalRecs, err := readRecords(cfg)
	if err != nil {
		return nil, err
	}
	var why []string
	var docs []data.Document
	maxLen := 2
	for _, r := range trainRecs {
		p, err := t.grpoPromptOf(r)
		if err == nil && len(p.ids) > cfg.Batch.MaxLength {
			err = fmt.Errorf("the prompt has %d tokens, above max_length %d", len(p.ids), cfg.Batch.MaxLength)
		}
		if err != nil {
			g.dropped++
			if len(why) < 3 {
				why = append(why, fmt.Sprintf("%s: %v", r.Where(), err))
			}
			continue
		}
		key := promptKey(p.ids)
		if _, dup := g.prompts[key]; !dup {
			g.prompts[key] = len(g.recs)
		}
		g.recs = append(g.recs, p)
		docs = append(docs, data.Document{Tokens: p.ids, Train: make([]bool, len(p.ids))})
		maxLen = max(maxLen, len(p.ids))
	}
	if len(docs) == 0 {
		return nil, fmt.Errorf("train: grpo: no usable prompt among %d records (%s)", len(trainRecs), strings.Join(why, "; "))
	}
	t.Stats = data.Stats{Records: len(trainRecs), Documents: len(docs), Dropped: g.dropped}
	for _, d := range docs {
		t.Stats.Tokens += len(d.Tokens)
	}
	if g.dropped > 0 {
		g.dropNote = fmt.Sprintf("grpo: dropped %d of %d prompts (%s)", g.dropped, len(trainRecs), strings.Join(why, "; "))
	}
	perStep := cfg.Batch.PerDeviceTrainBatchSize * cfg.Batch.GradientAccumulationSteps / g.sample.G
	if t.loader, err = data.NewLoader(docs, data.LoaderOptions{BatchSize: perStep, MaxLength: maxLen,
		Shuffle: *cfg.Dataset.Shuffle, Seed: uint64(*cfg.Run.Seed)}); err != nil {
		return nil, fmt.Errorf("train: grpo: %w", err)
	}
	t.evalRecords = evalRecs
	t.trainAnswer = mostFrequentAnswer(trainRecs)
	if s := cfg.Sched.MaxSteps; s > 0 {
		t.totalSteps = s
	} else {
		t.totalSteps = max(1, int(math.Ceil(cfg.Sched.NumTrainEpochs*float64(t.loader.BatchesPerEpoch()*g.iters))))
	}
	t.warmup = warmupSteps(cfg.Sched, t.totalSteps)
	// The loss scores completions at the temperature they were sampled at, as TRL does.
	if err := t.model.SetLossTemperature(g.sample.Temperature); err != nil {
		return nil, fmt.Errorf("train: grpo: temperature: %w", err)
	}
	if g.loss.Beta > 0 && t.model.LoRA() == nil {
		if g.ref, err = frozenCopy(t.model); err != nil {
			return nil, fmt.Errorf("train: grpo: the reference model: %w", err)
		}
		if err := g.ref.SetLossTemperature(g.sample.Temperature); err != nil {
			return nil, fmt.Errorf("train: grpo: temperature: %w", err)
		}
		t.closers = append(t.closers, g.close)
	}
	return g, nil
}

func promptKey(ids []int32) string {
	var b strings.Builder
	for _, id := range ids {
		fmt.Fprintf(&b, "%d,", id)
	}
	return b.String()
}

// grpoPromptOf makes the prompt of a record: a chat without its final assistant message
// (which is the reference answer), rendered with the generation prompt, or a
// prompt/completion record's prompt (its completion is the reference).
func (t *Trainer) grpoPromptOf(r data.Record) (grpoPrompt, error) {
	var p grpoPrompt
	var err error
	switch r.Kind {
	case data.FormatPromptCompletion:
		p.text, p.question, p.answer = r.Prompt, r.Prompt, strings.TrimSpace(r.Completion)
		p.ids = t.tok.ids(r.Prompt)
	case data.FormatMessages:
		msgs := r.Messages
		if n := len(msgs); n > 0 && msgs[n-1].Role == "assistant" {
			p.answer = strings.TrimSpace(msgs[n-1].Content)
			msgs = msgs[:n-1]
		}
		for _, m := range msgs {
			if m.Role == "user" {
				p.question = m.Content
			}
		}
		if len(msgs) == 0 {
			return p, errors.New("the chat has no message before its answer")
		}
		if p.ids, err = t.tok.generationPrompt(msgs); err != nil {
			return p, err
		}
		p.text = t.tok.decode(p.ids)
	default:
		return p, fmt.Errorf("GRPO reads chats ({\"messages\": ...}) or prompt/completion records, not %s", r.Kind)
	}
	if len(p.ids) == 0 {
		return p, errors.New("the prompt has no tokens")
	}
	return p, nil
}

// frozenCopy is a second model with m's current weights, for the reference log-probs.
func frozenCopy(m *models.Model) (*models.Model, error) {
	ref, err := models.New(m.Config(), m.Backend(), models.Options{DType: m.DType()})
	if err != nil {
		return nil, err
	}
	if err := m.Backend().Copy(ref.Params.Flat, m.Params.Flat); err != nil {
		ref.Close()
		return nil, err
	}
	return ref, nil
}

// Units is the number of completions of a micro-batch (documents).
func (g *grpo) Units(b data.Batch) int { return b.Docs() }

// Eval is not defined for GRPO: its held-out measure is the generation eval (exact match).
func (g *grpo) Eval(*models.Model, data.Batch, StepAt) (float64, int, Metrics, error) {
	return 0, 0, nil, errors.New("train: grpo has no held-out loss; use the generation eval (generation_eval) for held-out accuracy")
}

// ForwardBackward trains on the current generation batch's micro-batch g.next (the stepper
// calls it once per micro-batch, in order): the clipped surrogate's per-token gradient
// scales, from the log-probs of this forward.
func (g *grpo) ForwardBackward(m *models.Model, b data.Batch, total int, at StepAt) (float64, Metrics, error) {
	run, err := g.prepareRow(b, total, at)
	if err != nil {
		return 0, nil, err
	}
	return run(m, toModelBatch(b))
}

// prepareRow implements rowObjective: micro-batch b is the next of the rollouts' micro-batches
// (a step prepares them in order), whose samples carry their advantages, weights and old and
// reference log-probs.
func (g *grpo) prepareRow(b data.Batch, _ int, _ StepAt) (rowRun, error) {
	mi := g.next
	g.next++
	roll := g.roll
	var idx []int
	for i := range roll.samples {
		if roll.samples[i].micro == mi {
			idx = append(idx, i)
		}
	}
	return func(m *models.Model, mb models.Batch) (float64, Metrics, error) {
		lossSum := 0.0
		var kl, low, high, tokens float64
		err := m.ForwardBackwardWeighted(mb, func(lp []float32) ([]float32, error) {
			scale := make([]float32, len(lp))
			for _, i := range idx {
				s := &roll.samples[i]
				w := roll.weights[i]
				for k := range s.counted {
					pos := s.offset + k
					cur := float64(lp[pos])
					old, ref := cur, cur
					if s.old != nil {
						old = float64(s.old[k])
					}
					if s.ref != nil {
						ref = float64(s.ref[k])
					}
					term := g.loss.token(cur, old, ref, s.adv)
					lossSum += w * term.loss
					scale[pos] = float32(-w * term.dlp)
					kl += term.kl
					low += b2f(term.low)
					high += b2f(term.high)
					tokens++
				}
			}
			return scale, nil
		})
		if err != nil {
			return 0, nil, err
		}
		ms := Metrics{}
		ms.Add("clip_ratio/low_mean", low, tokens)
		ms.Add("clip_ratio/high_mean", high, tokens)
		ms.Add("clip_ratio/region_mean", low+high, tokens)
		if g.loss.Beta != 0 {
			ms.Add("kl", kl, tokens)
		}
		return lossSum, ms, nil
	}, nil
}

// rewardError marks a failure of the reward functions (the one reward_failure applies to).
type rewardError struct{ error }

func (e rewardError) Unwrap() error { return e.error }

// runStep is Trainer.Step for GRPO.
func (g *grpo) runStep(ctx context.Context) (StepMetrics, error) {
	t := g.t
	start := time.Now()
	timers := t.exec.timers()
	for _, ot := range timers {
		ot.ResetOpTimes()
	}
	h := t.hyper
	fresh := g.roll == nil || g.roll.used >= g.iters
	if fresh {
		cur := t.loader.Cursor()
		roll, err := g.makeRollouts(ctx)
		if err != nil {
			var re rewardError
			// A missing client is a setup problem, not a failed reward: it is never skipped.
			if g.skip && errors.As(err, &re) && !errors.Is(err, ErrNoClientReward) {
				t.step++
				m := t.stepMetrics(time.Since(start), stepOut{}, t.schedule(h).At(min(t.step-1, t.totalSteps)), 0, 0, timers)
				m.Method = map[string]float64{"skipped": 1}
				return m, nil
			}
			_ = t.loader.Seek(cur)
			return StepMetrics{}, err
		}
		g.roll = roll
	}
	roll := g.roll
	lr := t.schedule(h).At(min(t.step, t.totalSteps))
	g.next = 0
	trainStart := time.Now()
	out, _, err := t.exec.step(ctx, roll.micro, 1, h, lr, t.step+1)
	if err != nil {
		// The generation batch stays: running the step again trains on the same rollouts.
		return StepMetrics{}, err
	}
	trainTime := time.Since(trainStart)
	roll.used++
	t.step++
	tokens, targets := 0, 0
	for _, b := range roll.micro {
		tokens += b.Len()
		targets += b.NumTargets()
	}
	m := t.stepMetrics(time.Since(start), out, lr, tokens, targets, timers)
	if m.Method == nil {
		m.Method = map[string]float64{}
	}
	for k, v := range roll.metrics {
		m.Method[k] = v
	}
	m.Method["time/training_s"] = trainTime.Seconds()
	if fresh {
		m.Method["time/generation_s"] = roll.genTime.Seconds()
		m.Method["time/reward_s"] = roll.rewTime.Seconds()
	} else {
		m.Method["time/generation_s"], m.Method["time/reward_s"] = 0, 0
	}
	return m, nil
}

// makeRollouts draws the next prompts, samples and scores their completions, and lays them
// out for training with their advantages, weights and (when needed) old and reference
// log-probs.
func (g *grpo) makeRollouts(ctx context.Context) (*grpoRollouts, error) {
	t := g.t
	b, err := t.loader.Next()
	if err != nil {
		return nil, err
	}
	prompts := make([]grpoPrompt, 0, b.Docs())
	for d := range b.Docs() {
		ids := b.Tokens[b.DocStarts[d]:b.DocStarts[d+1]]
		i, ok := g.prompts[promptKey(ids)]
		if !ok {
			return nil, fmt.Errorf("train: grpo: internal error: a batch prompt is not in the dataset")
		}
		prompts = append(prompts, g.recs[i])
	}
	if err := t.exec.syncParams(); err != nil {
		return nil, err
	}
	roll := &grpoRollouts{funcs: g.names}
	genStart := time.Now()
	seed := uint64(*t.Cfg.Run.Seed)<<32 ^ uint64(t.step+1)
	if roll.samples, err = generateRollouts(t.model, prompts, g.sample, t.tok.stop, seed); err != nil {
		return nil, err
	}
	roll.genTime = time.Since(genStart)
	rs := make([]Rollout, len(roll.samples))
	for i, s := range roll.samples {
		p := prompts[s.group]
		rs[i] = Rollout{Prompt: p.text, Question: p.question, Completion: completionText(t.tok, s), Answer: p.answer,
			Group: s.group, Truncated: s.truncated, Step: t.step + 1}
	}
	rewStart := time.Now()
	sum, perFunc, err := g.rewards.score(ctx, rs)
	roll.rewTime = time.Since(rewStart)
	if err != nil {
		return nil, rewardError{err}
	}
	adv, groupStd, err := advantages(sum, g.sample.G, g.scale)
	if err != nil {
		return nil, err
	}
	roll.groupStd = groupStd
	for i := range roll.samples {
		s := &roll.samples[i]
		s.reward, s.adv = sum[i], adv[i]
		for k := range perFunc {
			s.perFunc = append(s.perFunc, perFunc[k][i])
		}
	}
	roll.micro = layoutMicroBatches(roll.samples, g.perMicro)
	lens, micro := make([]int, len(roll.samples)), make([]int, len(roll.samples))
	for i, s := range roll.samples {
		lens[i], micro[i] = s.counted, s.micro
	}
	if roll.weights, err = g.loss.weights(lens, micro, len(roll.micro)); err != nil {
		return nil, err
	}
	if g.iters > 1 {
		if err := g.logprobs(t.model, roll, func(s *grpoSample, v []float32) { s.old = v }); err != nil {
			return nil, err
		}
	}
	if g.loss.Beta > 0 {
		ref := g.ref
		if ref == nil { // LoRA: the base with the adapters off
			ref = t.model
			t.model.SetAdaptersEnabled(false)
			defer t.model.SetAdaptersEnabled(true)
		}
		if err := g.logprobs(ref, roll, func(s *grpoSample, v []float32) { s.ref = v }); err != nil {
			return nil, err
		}
	}
	roll.metrics = rolloutMetrics(roll.samples, perFunc, g.names, groupStd)
	return roll, nil
}

// logprobs computes each sample's completion log-probs under m (no gradients) and hands them
// to set.
func (g *grpo) logprobs(m *models.Model, roll *grpoRollouts, set func(*grpoSample, []float32)) error {
	for mi, b := range roll.micro {
		lp, err := m.TokenLogprobs(toModelBatch(b))
		if err != nil {
			return fmt.Errorf("train: grpo: log-probs: %w", err)
		}
		for i := range roll.samples {
			if s := &roll.samples[i]; s.micro == mi {
				set(s, slices.Clone(lp[s.offset:s.offset+len(s.tokens)]))
			}
		}
	}
	return nil
}

// note is the summary's line about the method: what a step samples, the reward functions,
// and the prompts dropped, if any.
func (g *grpo) note() string {
	perStep := g.t.Cfg.Batch.PerDeviceTrainBatchSize * g.t.Cfg.Batch.GradientAccumulationSteps / g.sample.G
	s := fmt.Sprintf("grpo: %d prompts x %d completions per step (max_completion_length %d, temperature %g), loss %s, beta %g, rewards %s",
		perStep, g.sample.G, g.sample.MaxCompletionLen, g.sample.Temperature, g.loss.Type, g.loss.Beta, strings.Join(g.names, " + "))
	if g.dropNote != "" {
		s += "\n" + g.dropNote
	}
	return s
}

// close frees the reference model.
func (g *grpo) close() error {
	if g.ref == nil {
		return nil
	}
	err := g.ref.Close()
	g.ref = nil
	return err
}
