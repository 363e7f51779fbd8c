package data

import (
	"fmt"
	"math"
	"math/rand/v2"
)

// Cursor is a position in the stream of micro-batches: the Index-th micro-batch of epoch Epoch
// (both from 0). It is all a Loader needs to resume exactly.
type Cursor struct {
	Epoch int `json:"epoch"`
	Index int `json:"index"`
}

// LoaderOptions say how documents become micro-batches.
type LoaderOptions struct {
	// Packing packs documents into micro-batches of at most BatchSize*MaxLength tokens by
	// best-fit decreasing. Without packing a micro-batch holds BatchSize documents.
	Packing bool
	// BatchSize is the micro-batch in sequences (per_device_train_batch_size).
	BatchSize int
	// MaxLength is the longest document in tokens; documents were truncated to it.
	MaxLength int
	// Shuffle reorders documents and micro-batches every epoch from (Seed, epoch).
	Shuffle bool
	// Seed fixes the shuffle.
	Seed uint64
}

// Budget is the token budget of one packed micro-batch.
func (o LoaderOptions) Budget() int { return o.BatchSize * o.MaxLength }

func (o LoaderOptions) validate() error {
	if o.BatchSize < 1 {
		return fmt.Errorf("data: batch size %d: must be at least 1", o.BatchSize)
	}
	if o.MaxLength < 2 {
		return fmt.Errorf("data: max_length %d: must be at least 2", o.MaxLength)
	}
	if o.BatchSize > math.MaxInt32/o.MaxLength {
		return fmt.Errorf("data: batch size %d x max_length %d overflows a micro-batch", o.BatchSize, o.MaxLength)
	}
	return nil
}

// Loader yields micro-batches epoch after epoch. It is not safe for concurrent use.
type Loader struct {
	docs   []Document
	opts   LoaderOptions
	cur    Cursor
	epoch  int     // epoch whose plan is in bins; -1 when none
	bins   [][]int // plan of epoch: document indices per micro-batch
	nBatch int     // micro-batches per epoch
}

// NewLoader checks the options and plans the first epoch.
func NewLoader(docs []Document, opts LoaderOptions) (*Loader, error) {
	if err := opts.validate(); err != nil {
		return nil, err
	}
	if len(docs) == 0 {
		return nil, fmt.Errorf("data: no documents to load")
	}
	for i, d := range docs {
		if len(d.Tokens) > opts.MaxLength || len(d.Tokens) == 0 {
			return nil, fmt.Errorf("data: document %d has %d tokens: must be in [1, max_length %d]", i, len(d.Tokens), opts.MaxLength)
		}
		for k, s := range d.Segments {
			if (k == 0 && s != 0) || (k > 0 && s <= d.Segments[k-1]) || int(s) >= len(d.Tokens) {
				return nil, fmt.Errorf("data: document %d: segment starts %v must begin at 0 and increase below its %d tokens", i, d.Segments, len(d.Tokens))
			}
		}
	}
	l := &Loader{docs: docs, opts: opts, epoch: -1}
	if err := l.plan(0); err != nil {
		return nil, err
	}
	l.nBatch = len(l.bins)
	return l, nil
}

// plan computes the micro-batches of an epoch. The number of micro-batches is the same for every
// epoch: packing sees the same multiset of lengths, only the order of equal lengths changes.
func (l *Loader) plan(epoch int) error {
	if l.epoch == epoch {
		return nil
	}
	n := len(l.docs)
	perm := make([]int, n)
	for i := range perm {
		perm[i] = i
	}
	var rng *rand.Rand
	if l.opts.Shuffle {
		rng = rand.New(rand.NewPCG(l.opts.Seed, uint64(epoch)+0x9e3779b97f4a7c15))
		rng.Shuffle(n, func(i, j int) { perm[i], perm[j] = perm[j], perm[i] })
	}
	var bins [][]int
	var err error
	if l.opts.Packing {
		lengths := make([]int, n)
		for i, p := range perm {
			lengths[i] = len(l.docs[p].Tokens)
		}
		bins, err = PackBestFitDecreasing(lengths, l.opts.Budget())
	} else {
		bins, err = PackSequential(n, l.opts.BatchSize)
	}
	if err != nil {
		return err
	}
	for _, b := range bins {
		for j, i := range b {
			b[j] = perm[i]
		}
	}
	if rng != nil {
		rng.Shuffle(len(bins), func(i, j int) { bins[i], bins[j] = bins[j], bins[i] })
	}
	l.bins, l.epoch = bins, epoch
	return nil
}

// BatchesPerEpoch is the number of micro-batches in one pass over the documents.
func (l *Loader) BatchesPerEpoch() int { return l.nBatch }

// Cursor is the position of the next micro-batch.
func (l *Loader) Cursor() Cursor { return l.cur }

// Seek moves to a cursor, e.g. one saved in a checkpoint.
func (l *Loader) Seek(c Cursor) error {
	if c.Epoch < 0 || c.Index < 0 || c.Index >= l.nBatch {
		return fmt.Errorf("data: cursor epoch %d index %d: index must be in [0, %d) and epoch >= 0 (was the checkpoint made with another dataset or batch size?)", c.Epoch, c.Index, l.nBatch)
	}
	l.cur = c
	return nil
}

// Next returns the micro-batch at the cursor and advances it, rolling over to the next epoch.
func (l *Loader) Next() (Batch, error) {
	if err := l.plan(l.cur.Epoch); err != nil {
		return Batch{}, err
	}
	b := Assemble(l.docs, l.bins[l.cur.Index])
	l.cur.Index++
	if l.cur.Index == l.nBatch {
		l.cur = Cursor{Epoch: l.cur.Epoch + 1}
	}
	return b, nil
}

// All returns every micro-batch of one epoch without moving the cursor (for evaluation, with
// Shuffle off).
func (l *Loader) All(epoch int) ([]Batch, error) {
	if err := l.plan(epoch); err != nil {
		return nil, err
	}
	out := make([]Batch, len(l.bins))
	for i, b := range l.bins {
		out[i] = Assemble(l.docs, b)
	}
	return out, nil
}

// Split sets aside a deterministic held-out part of recs: round(fraction*len) records, at least
// one when fraction > 0, chosen by seed; both parts keep the input order. It refuses a split
// that would leave either part empty.
func Split(recs []Record, fraction float64, seed uint64) (train, eval []Record, err error) {
	return splitHeld(recs, fraction, seed, "records")
}

// splitHeld is Split over rows of any kind; unit names them in errors.
func splitHeld[T any](recs []T, fraction float64, seed uint64, unit string) (train, eval []T, err error) {
	if fraction <= 0 {
		return recs, nil, nil
	}
	if fraction >= 1 || math.IsNaN(fraction) {
		return nil, nil, fmt.Errorf("data: eval_split %v: must be in [0, 1)", fraction)
	}
	nEval := max(1, int(math.Round(fraction*float64(len(recs)))))
	if nEval >= len(recs) {
		return nil, nil, fmt.Errorf("data: eval_split %v of %d %s leaves nothing to train on", fraction, len(recs), unit)
	}
	perm := rand.New(rand.NewPCG(seed, 0x5ee4_5b11)).Perm(len(recs))
	held := make([]bool, len(recs))
	for _, i := range perm[:nEval] {
		held[i] = true
	}
	for i, r := range recs {
		if held[i] {
			eval = append(eval, r)
		} else {
			train = append(train, r)
		}
	}
	return train, eval, nil
}
