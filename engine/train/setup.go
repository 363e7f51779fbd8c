package train

import (
	"context"
	"errors"
	"fmt"
	"math"
	"runtime"
	"slices"
	"sort"
	"strings"

	"github.com/halo-shell/halo-shell/engine/backend"
	"github.com/halo-shell/halo-shell/engine/data"
	"github.com/halo-shell/halo-shell/engine/models"
	"github.com/halo-shell/halo-shell/engine/parallel"
	"github.com/halo-shell/halo-shell/engine/profile"
	"github.com/halo-shell/halo-shell/engine/tensor"
)

// New builds a trainer from a validated config: it opens the device, loads or initialises the
// model, reads and tokenizes the data on all cores, packs it and plans the run. When
// resume_from_checkpoint is set it continues from that checkpoint (see Resume).
func New(cfg *Config) (*Trainer, error) { return NewWrapped(cfg, nil) }

// NewWrapped is New with the trainer's own device passed through wrap (when not nil) before
// anything is built on it: a session wraps it with profile.Wrap so that it can record that
// device's ops, without changing how any other trainer in the process opens devices. The
// devices of a parallel plan are opened and wrapped by the plan, one recorder per rank
// (RankRecorders), not by wrap.
func NewWrapped(cfg *Config, wrap func(backend.Backend) backend.Backend) (*Trainer, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	dev := cfg.Run.Device
	if d, _, isParallel, err := cfg.ParallelLayout(); err == nil {
		switch {
		case isParallel && d.Kind != "cpu":
			// The devices hold the plan; the single model, the host view of the run, stays
			// in host memory rather than taking a second copy's room on a GPU.
			dev = "cpu"
		case !isParallel && cfg.Parallel.Devices != "":
			dev = fmt.Sprintf("%s:%d", d.Kind, d.IDs[0]) // one named device
		}
	}
	b, note, err := backend.Resolve(dev)
	if err != nil {
		return nil, fmt.Errorf("train: device %s: %w", cfg.Run.Device, err)
	}
	if err := capMemory(b, cfg.Run.MaxDeviceMemoryGiB); err != nil {
		_ = b.Close()
		return nil, err
	}
	if wrap != nil {
		b = wrap(b)
	}
	return newOn(cfg, b, note, nil)
}

// NewOn is New on a backend the caller opened (for instance one wrapped by engine/profile,
// whose per-op-class times then appear in StepMetrics.TimeByOpS); cfg's device is ignored.
// The trainer owns b from then on and closes it in Close.
func NewOn(cfg *Config, b backend.Backend) (*Trainer, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	return newOn(cfg, b, "", nil)
}

func newOn(cfg *Config, b backend.Backend, note string, nodes *nodeSpec) (*Trainer, error) {
	var err error
	t := &Trainer{Cfg: cfg, b: b, hyper: hyperFrom(cfg), deviceNote: note, nodes: nodes}
	if t.method, err = LookupMethod(cfg.Method); err != nil {
		_ = b.Close()
		return nil, err
	}
	ok := false
	defer func() {
		if !ok {
			_ = t.Close()
		}
	}()
	if t.tok, err = loadCodec(cfg.Model.TokenizerNameOrPath, cfg.Dataset.Format == string(data.FormatTokens)); err != nil {
		return nil, err
	}
	dt := tensor.F32
	if cfg.Run.BF16 {
		dt = tensor.BF16
	}
	devs, layout, err := cfg.Parallel.Resolve()
	if err != nil {
		return nil, fmt.Errorf("train: devices: %w", err)
	}
	usePlan := wantsPlan(devs, layout)
	if nodes != nil {
		// The mesh spans every node's devices.
		if devs, layout, err = NodeDevices(cfg, nodes.rc.NNodes); err != nil {
			return nil, err
		}
		usePlan = true
	}
	if usePlan && !t.method.Parallel {
		return nil, fmt.Errorf("train: method %s runs on one device; devices %s asks for a parallel layout: set devices to one device (e.g. cuda:0), or remove devices and the parallel sizes", cfg.Method, cfg.Parallel.Devices)
	}
	if nodes != nil && t.method.WholeSequences {
		// Their micro-batches are prepared and scored by the process that holds the whole
		// plan (parallel.Plan.ForwardBackwardRows), which one node's process does not.
		return nil, fmt.Errorf("train: method %s runs on the devices of one node (any layout but context parallelism there); across %d nodes only pretrain and sft run: launch it on one node", cfg.Method, nodes.rc.NNodes)
	}
	if nodes == nil {
		// The estimate is checked against the machine before anything is allocated.
		if mc, err := modelConfig(cfg, t.tok.vocabSize()); err == nil {
			if err := checkMemory(cfg, mc, b); err != nil {
				return nil, err
			}
		}
	}
	if usePlan {
		// The layout is checked against config.json before any weight is read.
		mc, err := modelConfig(cfg, t.tok.vocabSize())
		if err != nil {
			return nil, err
		}
		shape, err := parallel.ShapeFromConfig(mc)
		if err != nil {
			return nil, fmt.Errorf("train: layout: %w", err)
		}
		if err := checkLayout(devs, layout, shape, cfg.Batch.GradientAccumulationSteps, t.method); err != nil {
			return nil, err
		}
	}
	if t.model, err = buildModel(cfg, b, dt, t.tok.vocabSize()); err != nil {
		return nil, err
	}
	if t.model.IsClassifier() && t.model.Arch.PadID < 0 && t.tok.eos >= 0 {
		// The score is pooled at the last token that is not pad_token_id; without one in
		// config.json the eos token takes its place, and the saved config says so.
		t.model.Arch.PadID = int(t.tok.eos)
	}
	if t.model.Arch.Vocab < t.tok.vocabSize() {
		return nil, fmt.Errorf("train: the model's vocab_size %d is smaller than the tokenizer's %d tokens", t.model.Arch.Vocab, t.tok.vocabSize())
	}
	if err := t.setupMoE(); err != nil {
		return nil, err
	}
	if t.obj, err = t.method.Setup(t); err != nil {
		return nil, err
	}
	if t.opt, err = newOptimizer(t.model, cfg); err != nil {
		return nil, err
	}
	t.exec = t.deviceStepper()
	if r := cfg.Run.ResumeFromCheckpoint; r != "" {
		if err := t.Resume(r); err != nil {
			return nil, err
		}
	}
	if usePlan {
		if err := t.startPlan(devs, layout); err != nil {
			return nil, err
		}
	}
	ok = true
	return t, nil
}

// readRecords returns the train and held-out records the config names.
func readRecords(cfg *Config) (train, eval []data.Record, err error) {
	d := cfg.Dataset
	if sy := d.Synthetic; sy != nil {
		return data.Arithmetic(data.ArithmeticOptions{Seed: uint64(sy.Seed), MaxOperand: sy.MaxOperand, Train: sy.Train, Eval: sy.Eval})
	}
	f := data.Format(d.Format)
	if train, err = data.ReadFiles(d.Path, f); err != nil {
		return nil, nil, err
	}
	if len(d.EvalPath) > 0 {
		if eval, err = data.ReadFiles(d.EvalPath, f); err != nil {
			return nil, nil, err
		}
		return train, eval, nil
	}
	return data.Split(train, d.EvalSplit, uint64(*cfg.Run.Seed))
}

func (t *Trainer) setupData() error {
	cfg := t.Cfg
	trainRecs, evalRecs, err := readRecords(cfg)
	if err != nil {
		return err
	}
	enc := t.tok.encoder(cfg.Method, t.model.Arch.Vocab)
	maxLen := cfg.Batch.MaxLength
	docs, st, err := data.Tokenize(trainRecs, enc, maxLen, runtime.GOMAXPROCS(0))
	if err != nil {
		return err
	}
	t.Stats = st
	opts := data.LoaderOptions{Packing: *cfg.Batch.Packing, BatchSize: cfg.Batch.PerDeviceTrainBatchSize,
		MaxLength: maxLen, Shuffle: *cfg.Dataset.Shuffle, Seed: uint64(*cfg.Run.Seed)}
	if t.loader, err = data.NewLoader(docs, opts); err != nil {
		return err
	}
	if len(evalRecs) > 0 {
		edocs, est, err := data.Tokenize(evalRecs, enc, maxLen, runtime.GOMAXPROCS(0))
		if err != nil {
			return fmt.Errorf("train: held-out data: %w", err)
		}
		t.EvalStats = est
		eopts := opts
		eopts.Shuffle, eopts.BatchSize = false, cfg.Batch.PerDeviceEvalBatchSize
		el, err := data.NewLoader(edocs, eopts)
		if err != nil {
			return err
		}
		if t.evalBatches, err = el.All(0); err != nil {
			return err
		}
		t.evalRecords = evalRecs
	}
	t.trainAnswer = mostFrequentAnswer(trainRecs)
	t.planLength()
	return nil
}

// planLength plans the run's steps from the loader: max_steps, or num_train_epochs over its
// micro-batches; and the warmup.
func (t *Trainer) planLength() {
	cfg := t.Cfg
	perEpoch := t.loader.BatchesPerEpoch()
	accum := cfg.Batch.GradientAccumulationSteps
	if s := cfg.Sched.MaxSteps; s > 0 {
		t.totalSteps = s
	} else {
		t.totalSteps = max(1, int(math.Ceil(cfg.Sched.NumTrainEpochs*float64(perEpoch)/float64(accum))))
	}
	t.warmup = warmupSteps(cfg.Sched, t.totalSteps)
}

// mostFrequentAnswer is the most common final assistant reply of chat records, or completion
// of prompt/completion records (ties broken by the smaller string); "" when there are none.
func mostFrequentAnswer(recs []data.Record) string {
	count := map[string]int{}
	for _, r := range recs {
		if r.Kind == data.FormatMessages && len(r.Messages) > 0 {
			if last := r.Messages[len(r.Messages)-1]; last.Role == "assistant" {
				count[strings.TrimSpace(last.Content)]++
			}
		}
		if r.Kind == data.FormatPromptCompletion {
			count[strings.TrimSpace(r.Completion)]++
		}
	}
	keys := make([]string, 0, len(count))
	for k := range count {
		keys = append(keys, k)
	}
	sort.Slice(keys, func(i, j int) bool {
		if count[keys[i]] != count[keys[j]] {
			return count[keys[i]] > count[keys[j]]
		}
		return keys[i] < keys[j]
	})
	if len(keys) == 0 {
		return ""
	}
	return keys[0]
}

// GenerationResult is the outcome of EvalGeneration.
type GenerationResult struct {
	// Samples is the number of held-out chats generated for.
	Samples int `json:"samples"`
	// Correct counts replies equal to the reference (after trimming spaces).
	Correct int `json:"correct"`
	// Accuracy is Correct / Samples.
	Accuracy float64 `json:"accuracy"`
	// Chance is the accuracy of always answering the most frequent training reply.
	Chance float64 `json:"chance"`
	// Examples holds a few (prompt, reference, generated) triples.
	Examples [][3]string `json:"examples"`
}

// EvalGeneration greedily generates the final assistant reply of up to maxSamples held-out
// chats (or the completion of prompt/completion records) and compares it with the reference: exact-match accuracy against the chance level of
// always giving the most frequent training answer.
func (t *Trainer) EvalGeneration(ctx context.Context, maxSamples, maxNewTokens int) (GenerationResult, error) {
	var res GenerationResult
	if len(t.evalRecords) == 0 {
		return res, errors.New("train: generation eval: no held-out data")
	}
	if err := t.tok.needTokenizer("generation eval"); err != nil {
		return res, fmt.Errorf("train: %w", err)
	}
	chance := 0
	for _, r := range t.evalRecords {
		if res.Samples >= maxSamples {
			break
		}
		var want, question string
		var prompt []int32
		switch {
		case r.Kind == data.FormatPromptCompletion:
			want, question, prompt = strings.TrimSpace(r.Completion), r.Prompt, t.tok.ids(r.Prompt)
		case r.Kind == data.FormatMessages && len(r.Messages) >= 2 && r.Messages[len(r.Messages)-1].Role == "assistant":
			want, question = strings.TrimSpace(r.Messages[len(r.Messages)-1].Content), r.Messages[len(r.Messages)-2].Content
			var err error
			if prompt, err = t.tok.generationPrompt(r.Messages[:len(r.Messages)-1]); err != nil {
				return res, fmt.Errorf("train: generation eval: %s: %w", r.Where(), err)
			}
		default:
			continue
		}
		if err := ctx.Err(); err != nil {
			return res, err
		}
		got, err := t.generate(prompt, maxNewTokens)
		if err != nil {
			return res, fmt.Errorf("train: generation eval: %s: %w", r.Where(), err)
		}
		got = strings.TrimSpace(got)
		res.Samples++
		if got == want {
			res.Correct++
		}
		if want == t.trainAnswer {
			chance++
		}
		if len(res.Examples) < 5 {
			res.Examples = append(res.Examples, [3]string{question, want, got})
		}
	}
	if res.Samples == 0 {
		return res, errors.New("train: generation eval: no held-out chat ends with an assistant reply, and no record is a prompt/completion")
	}
	res.Accuracy = float64(res.Correct) / float64(res.Samples)
	res.Chance = float64(chance) / float64(res.Samples)
	return res, nil
}

// generate greedily continues prompt with the single model (its parameters brought up to date
// first) and decodes the reply up to the first stop token.
func (t *Trainer) generate(prompt []int32, maxNewTokens int) (string, error) {
	if err := t.exec.syncParams(); err != nil {
		return "", err
	}
	out, err := t.model.Generate(prompt, models.GenerateOptions{MaxNewTokens: maxNewTokens, StopIDs: t.tok.stop})
	if err != nil {
		return "", err
	}
	for i, id := range out {
		if slices.Contains(t.tok.stop, id) {
			out = out[:i]
			break
		}
	}
	return t.tok.decode(out), nil
}

// Complete continues a prompt greedily with up to maxNewTokens tokens and returns the decoded
// text up to the first stop token. With chat, prompt is a user message rendered by the chat
// template with the generation prompt; otherwise it is raw text.
func (t *Trainer) Complete(prompt string, chat bool, maxNewTokens int) (string, error) {
	if maxNewTokens < 1 {
		return "", fmt.Errorf("train: complete: max new tokens %d must be >= 1", maxNewTokens)
	}
	if err := t.tok.needTokenizer("complete"); err != nil {
		return "", fmt.Errorf("train: %w", err)
	}
	var ids []int32
	if chat {
		var err error
		if ids, err = t.tok.generationPrompt([]data.Message{{Role: "user", Content: prompt}}); err != nil {
			return "", fmt.Errorf("train: complete: %w", err)
		}
	} else {
		ids = t.tok.ids(prompt)
	}
	if len(ids) == 0 {
		return "", errors.New("train: complete: the prompt has no tokens")
	}
	return t.generate(ids, maxNewTokens)
}

// Backend is the device the trainer runs on (memory statistics, synchronisation).
func (t *Trainer) Backend() backend.Backend { return t.b }

// capMemory applies max_device_memory_gib (when set) to a device just opened, through the
// profiling wrapper if it has one.
func capMemory(b backend.Backend, gib float64) error {
	if gib == 0 {
		return nil
	}
	if _, inner, ok := profile.Unwrap(b); ok {
		b = inner
	}
	if err := backend.LimitMemory(b, gib, "max_device_memory_gib"); err != nil {
		return fmt.Errorf("train: %w", err)
	}
	return nil
}
