package train

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"strconv"

	"github.com/halo-shell/halo-shell/engine/data"
	"github.com/halo-shell/halo-shell/engine/models"
)

// Preference data. A paired row (prompt, chosen, rejected) becomes one data.Document of two
// segments, prompt+chosen and prompt+rejected, so that both halves of a pair are always in
// the same micro-batch; an unpaired KTO row becomes prompt+completion and, as its second
// segment, its prompt with the completion of the next row (TRL's mismatched pairs for the KL
// estimate). Only completion tokens are targets. Chat rows are rendered with the
// tokenizer's chat template as for SFT: the prompt with the generation prompt, the whole
// conversation, and the completion is every token after the prompt's (TRL's rule).

// prefDoc is what an objective needs of one document beyond its tokens.
type prefDoc struct {
	label bool       // unpaired: the completion is desirable
	ref   [2]float64 // the reference model's log-prob sums of segments 0 and 1
}

// prefSet is the per-document side table of the training or held-out documents, indexed
// like the loader's documents (data.Batch.Sources).
type prefSet struct {
	docs []prefDoc
}

// encodedTurns is a prompt and a completion as token ids.
type encodedTurns struct {
	prompt, completion []int32
}

// encodeTurns tokenizes a prompt and one completion. Text: the prompt's ids, then the
// completion's and the eos token. Chat: the conversation prompt+completion rendered by the
// chat template; the prompt is the longest common start of that and the prompt rendered
// with the generation prompt.
func (c *textCodec) encodeTurns(prompt, completion data.Turns) (encodedTurns, error) {
	var e encodedTurns
	if err := c.needTokenizer("a preference row"); err != nil {
		return e, err
	}
	if !prompt.Chat {
		p, err := c.idsErr(prompt.Text)
		if err != nil {
			return e, err
		}
		comp, err := c.idsErr(completion.Text)
		if err != nil {
			return e, err
		}
		if c.eos >= 0 {
			comp = append(comp, c.eos)
		}
		return encodedTurns{prompt: p, completion: comp}, nil
	}
	if c.chat == nil {
		return e, fmt.Errorf("conversational row but %s/tokenizer_config.json has no chat_template", c.dir)
	}
	p, err := c.chat.prompt(prompt.Messages)
	if err != nil {
		return e, err
	}
	msgs := append(append([]data.Message{}, prompt.Messages...), completion.Messages...)
	s, err := c.chat.render(msgs, false)
	if err != nil {
		return e, err
	}
	full, err := c.idsErr(s)
	if err != nil {
		return e, err
	}
	k := 0
	for k < len(p) && k < len(full) && p[k] == full[k] {
		k++
	}
	return encodedTurns{prompt: full[:k], completion: full[k:]}, nil
}

// sequence joins a prompt and a completion, cut to maxLen tokens, with the completion's
// tokens marked as targets; truncated reports whether the completion was cut.
func sequence(prompt, completion []int32, maxLen int) (ids []int32, train []bool, truncated bool) {
	ids = append(append(make([]int32, 0, len(prompt)+len(completion)), prompt...), completion...)
	train = make([]bool, len(ids))
	for i := len(prompt); i < len(ids); i++ {
		train[i] = true
	}
	if len(ids) > maxLen {
		ids, train, truncated = ids[:maxLen], train[:maxLen], true
	}
	return ids, train, truncated
}

// segmentsDoc lays sequences end to end as one document of segments; each segment's first
// token is never a target.
func segmentsDoc(seqs [][]int32, trains [][]bool) data.Document {
	var d data.Document
	for k := range seqs {
		d.Segments = append(d.Segments, int32(len(d.Tokens)))
		d.Tokens = append(d.Tokens, seqs[k]...)
		tr := append([]bool{}, trains[k]...)
		tr[0] = false
		d.Train = append(d.Train, tr...)
	}
	return d
}

// prefTokens are the tokenized rows of a preference dataset.
type prefTokens struct {
	docs  []data.Document
	side  prefSet
	stats data.Stats
	bad   []data.BadRow
}

// tokenizePref encodes preference rows into documents of segments (see the top of this
// file). Rows whose prompt leaves no room for a completion within max_length, and rows that
// cannot be encoded, are bad rows.
func (t *Trainer) tokenizePref(recs []data.PrefRecord, kind data.PrefKind) (prefTokens, error) {
	maxLen := t.Cfg.Batch.MaxLength
	var out prefTokens
	out.stats.Records = len(recs)
	type row struct {
		rec   data.PrefRecord
		turns []encodedTurns
	}
	var rows []row
	for _, r := range recs {
		comps := []data.Turns{r.Chosen, r.Rejected}
		if kind == data.Unpaired {
			comps = []data.Turns{r.Completion}
		}
		var turns []encodedTurns
		var reason, detail string
		for _, c := range comps {
			e, err := t.tok.encodeTurns(r.Prompt, c)
			if err != nil {
				reason, detail = "cannot be encoded", err.Error()
				break
			}
			if len(e.prompt) >= maxLen {
				reason, detail = "prompt longer than max_length", fmt.Sprintf("%d prompt tokens, max_length %d", len(e.prompt), maxLen)
				break
			}
			if len(e.completion) == 0 {
				reason = "empty completion"
				break
			}
			turns = append(turns, e)
		}
		if reason != "" {
			out.bad = append(out.bad, data.BadRow{Source: r.Source, Line: r.Line, Reason: reason, Detail: detail})
			continue
		}
		rows = append(rows, row{rec: r, turns: turns})
	}
	if kind == data.Unpaired && len(rows) == 1 {
		return out, fmt.Errorf("train: %s needs at least 2 usable rows: the KL estimate pairs each prompt with another row's completion", t.Cfg.Method)
	}
	for i, r := range rows {
		var seqs [][]int32
		var trains [][]bool
		add := func(p, c []int32) {
			ids, tr, cut := sequence(p, c, maxLen)
			if cut {
				out.stats.Truncated++
			}
			seqs, trains = append(seqs, ids), append(trains, tr)
		}
		if kind == data.Unpaired {
			next := rows[(i+1)%len(rows)].turns[0]
			add(r.turns[0].prompt, r.turns[0].completion)
			add(r.turns[0].prompt, next.completion)
		} else {
			add(r.turns[0].prompt, r.turns[0].completion)
			add(r.turns[1].prompt, r.turns[1].completion)
		}
		d := segmentsDoc(seqs, trains)
		out.docs = append(out.docs, d)
		out.side.docs = append(out.side.docs, prefDoc{label: r.rec.Label})
		out.stats.Tokens += len(d.Tokens)
		out.stats.Targets += d.Targets()
	}
	out.stats.Documents = len(out.docs)
	if len(out.docs) == 0 {
		return out, fmt.Errorf("train: no usable preference row: %s; the first: %s", data.SummarizeBadRows(out.bad, len(recs)), out.bad[0])
	}
	return out, nil
}

// readPref returns the training and held-out rows the config names: dataset.path (and
// eval_path or eval_split), or synthetic arithmetic pairs. bad lists the rows left out.
func readPref(cfg *Config, kind data.PrefKind) (train, eval []data.PrefRecord, bad []data.BadRow, err error) {
	d := cfg.Dataset
	if sy := d.Synthetic; sy != nil {
		tr, ev, err := data.Arithmetic(data.ArithmeticOptions{Seed: uint64(sy.Seed), MaxOperand: sy.MaxOperand, Train: sy.Train, Eval: sy.Eval})
		if err != nil {
			return nil, nil, nil, err
		}
		return arithmeticPref(tr, kind, uint64(sy.Seed)), arithmeticPref(ev, kind, uint64(sy.Seed)+1), nil, nil
	}
	if train, bad, err = data.ReadPreferenceFiles(d.Path, kind); err != nil {
		return nil, nil, nil, err
	}
	if len(d.EvalPath) > 0 {
		ev, evBad, err := data.ReadPreferenceFiles(d.EvalPath, kind)
		if err != nil {
			return nil, nil, nil, fmt.Errorf("train: held-out data: %w", err)
		}
		return train, ev, append(bad, evBad...), nil
	}
	train, eval, err = data.SplitPreference(train, d.EvalSplit, uint64(*cfg.Run.Seed))
	return train, eval, bad, err
}

// arithmeticPref turns arithmetic chats into preference rows: for paired data the right
// answer is chosen and a wrong one (off by 1 to 9, never negative) rejected; for unpaired
// data every other row gets the wrong answer and label false.
func arithmeticPref(recs []data.Record, kind data.PrefKind, seed uint64) []data.PrefRecord {
	rng := rand.New(rand.NewPCG(seed, 0x9ef))
	out := make([]data.PrefRecord, 0, len(recs))
	for i, r := range recs {
		right, _ := strconv.Atoi(r.Messages[1].Content)
		off := 1 + rng.IntN(9)
		if rng.IntN(2) == 0 && right-off >= 0 {
			off = -off
		}
		wrong := strconv.Itoa(right + off)
		prompt := data.Turns{Chat: true, Messages: r.Messages[:1]}
		reply := func(s string) data.Turns {
			return data.Turns{Chat: true, Messages: []data.Message{{Role: "assistant", Content: s}}}
		}
		p := data.PrefRecord{Source: "synthetic-" + r.Source, Line: r.Line, Prompt: prompt}
		if kind == data.Unpaired {
			p.Label = i%2 == 0
			p.Completion = reply(wrong)
			if p.Label {
				p.Completion = reply(r.Messages[1].Content)
			}
		} else {
			p.Chosen, p.Rejected = reply(r.Messages[1].Content), reply(wrong)
		}
		out = append(out, p)
	}
	return out
}

// setupPref reads, tokenizes and loads the method's preference data into t, and plans the
// run's steps. A pair or example is one document of the loader: without packing a
// micro-batch holds per_device_train_batch_size of them, with packing as many as fit in
// per_device_train_batch_size * 2 * max_length tokens.
func (t *Trainer) setupPref(kind data.PrefKind) (train, eval prefSet, err error) {
	cfg := t.Cfg
	trainRecs, evalRecs, bad, err := readPref(cfg, kind)
	if err != nil {
		return train, eval, err
	}
	tr, err := t.tokenizePref(trainRecs, kind)
	if err != nil {
		return train, eval, err
	}
	t.Stats = tr.stats
	t.badRows = append(bad, tr.bad...)
	t.badTotal = len(trainRecs) + len(evalRecs) + len(bad)
	maxLen := 2 * cfg.Batch.MaxLength
	opts := data.LoaderOptions{Packing: *cfg.Batch.Packing, BatchSize: cfg.Batch.PerDeviceTrainBatchSize,
		MaxLength: maxLen, Shuffle: *cfg.Dataset.Shuffle, Seed: uint64(*cfg.Run.Seed)}
	if t.loader, err = data.NewLoader(tr.docs, opts); err != nil {
		return train, eval, err
	}
	t.prefDocs = tr.docs
	if len(evalRecs) > 0 {
		ev, err := t.tokenizePref(evalRecs, kind)
		if err != nil {
			return train, eval, fmt.Errorf("train: held-out data: %w", err)
		}
		t.EvalStats = ev.stats
		t.badRows = append(t.badRows, ev.bad...)
		eopts := opts
		eopts.Shuffle, eopts.BatchSize = false, cfg.Batch.PerDeviceEvalBatchSize
		el, err := data.NewLoader(ev.docs, eopts)
		if err != nil {
			return train, eval, err
		}
		if t.evalBatches, err = el.All(0); err != nil {
			return train, eval, err
		}
		t.prefEvalDocs = ev.docs
		eval = ev.side
	}
	t.planLength()
	return tr.side, eval, nil
}

// seqsPerDoc is the number of sequences of a training document: 2 for the preference
// methods' pairs and examples (the loader's budget is twice max_length per one), else 1.
func (t *Trainer) seqsPerDoc() int {
	if t.prefDocs != nil {
		return 2
	}
	return 1
}

// seqLogps sums, per sequence d of a batch, the log-probs lp of its target tokens, and
// counts them.
func seqLogps(b data.Batch, lp []float32) (sums []float64, counts []int) {
	D := b.Docs()
	sums, counts = make([]float64, D), make([]int, D)
	for d := 0; d < D; d++ {
		for i := b.DocStarts[d]; i < b.DocStarts[d+1]; i++ {
			if b.Targets[i] != data.IgnoreIndex {
				sums[d] += float64(lp[i])
				counts[d]++
			}
		}
	}
	return sums, counts
}

// reference gives the reference model's log-prob sums of a batch's sequences: from the
// table computed before training, or (precompute_ref_log_probs: false) by running the
// reference on the batch.
type reference struct {
	run     func(b data.Batch) ([]float32, error) // nil when precomputed
	closeFn func() error
}

// newReference prepares the reference model of a method with a frozen reference: the
// policy before its first step (it is the model the run starts from), the base with the
// adapters off under LoRA, or ref_model_name_or_path. With precompute it fills the
// reference log-prob sums of every training and held-out document into train and eval
// and frees what it loaded; otherwise the returned reference runs every micro-batch.
func (t *Trainer) newReference(train, eval *prefSet) (*reference, error) {
	cfg := t.Cfg
	pre := cfg.Objective.PrecomputeRefLogProbs == nil || *cfg.Objective.PrecomputeRefLogProbs
	ref := &reference{closeFn: func() error { return nil }}
	var refModel *models.Model
	switch {
	case cfg.Objective.RefModelNameOrPath != "":
		rc := *cfg
		rc.Model.ModelNameOrPath, rc.Model.Init = cfg.Objective.RefModelNameOrPath, nil
		rc.PEFT = PEFTConfig{}
		rc.Quant = QuantConfig{}
		m, err := buildModel(&rc, t.b, t.model.DType(), t.tok.vocabSize())
		if err != nil {
			return nil, fmt.Errorf("train: ref_model_name_or_path: %w", err)
		}
		if m.Arch.Vocab != t.model.Arch.Vocab {
			m.Close()
			return nil, fmt.Errorf("train: ref_model_name_or_path: vocab_size %d differs from the policy's %d", m.Arch.Vocab, t.model.Arch.Vocab)
		}
		refModel = m
		ref.run = func(b data.Batch) ([]float32, error) { return m.TokenLogprobs(toModelBatch(b)) }
		ref.closeFn = m.Close
	case t.model.LoRA() != nil:
		m := t.model
		ref.run = func(b data.Batch) ([]float32, error) {
			m.SetAdaptersEnabled(false)
			defer m.SetAdaptersEnabled(true)
			return m.TokenLogprobs(toModelBatch(b))
		}
	case pre:
		// The policy has not stepped yet: it is the reference.
		m := t.model
		ref.run = func(b data.Batch) ([]float32, error) { return m.TokenLogprobs(toModelBatch(b)) }
	default:
		// A frozen copy of the starting model stays in memory.
		rc := *cfg
		rc.PEFT = PEFTConfig{}
		rc.Quant = QuantConfig{}
		m, err := buildModel(&rc, t.b, t.model.DType(), t.tok.vocabSize())
		if err != nil {
			return nil, fmt.Errorf("train: reference model: %w", err)
		}
		refModel = m
		ref.run = func(b data.Batch) ([]float32, error) { return m.TokenLogprobs(toModelBatch(b)) }
		ref.closeFn = m.Close
	}
	if !pre {
		return ref, nil
	}
	defer func() {
		if refModel != nil {
			_ = refModel.Close()
		}
	}()
	for _, set := range []struct {
		docs []data.Document
		side *prefSet
	}{{t.prefDocs, train}, {t.prefEvalDocs, eval}} {
		if err := fillReference(set.docs, set.side, ref.run, t.Cfg.Batch.PerDeviceEvalBatchSize); err != nil {
			return nil, err
		}
	}
	return &reference{closeFn: func() error { return nil }}, nil
}

// fillReference computes the reference log-prob sums of every document's segments, per
// documents in groups of per.
func fillReference(docs []data.Document, side *prefSet, run func(data.Batch) ([]float32, error), per int) error {
	for lo := 0; lo < len(docs); lo += per {
		idx := make([]int, 0, per)
		for i := lo; i < min(lo+per, len(docs)); i++ {
			idx = append(idx, i)
		}
		b := data.Assemble(docs, idx)
		lp, err := run(b)
		if err != nil {
			return fmt.Errorf("train: reference log-probs: %w", err)
		}
		sums, _ := seqLogps(b, lp)
		for d, s := range sums {
			side.docs[b.Sources[d]].ref[b.Segs[d]] = s
		}
	}
	return nil
}

// refSums returns the reference log-prob sum of every sequence of b: from side, or from
// running ref on b.
func (r *reference) refSums(b data.Batch, side prefSet) ([]float64, error) {
	if r.run == nil {
		out := make([]float64, b.Docs())
		for d := range out {
			out[d] = side.docs[b.Sources[d]].ref[b.Segs[d]]
		}
		return out, nil
	}
	lp, err := r.run(b)
	if err != nil {
		return nil, fmt.Errorf("train: reference log-probs: %w", err)
	}
	s, _ := seqLogps(b, lp)
	return s, nil
}

var errNoSegments = errors.New("train: a preference micro-batch without segment sources (internal)")

// EncodeCompletion tokenizes a prompt and its completion with the tokenizer in dir exactly as
// the preference methods and reward models do for training (see encodeTurns), for scoring a
// text with a trained reward model.
func EncodeCompletion(dir string, prompt, completion data.Turns) ([]int32, error) {
	c, err := loadCodec(dir, false)
	if err != nil {
		return nil, err
	}
	e, err := c.encodeTurns(prompt, completion)
	if err != nil {
		return nil, fmt.Errorf("train: %w", err)
	}
	return append(e.prompt, e.completion...), nil
}
