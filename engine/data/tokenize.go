package data

import (
	"fmt"
	"runtime"
	"sync"
)

// Document is one tokenized record.
//
// Tokens are the ids in order. Train[i] says whether token i is a prediction target: the model
// is trained to predict Tokens[i] from Tokens[:i]. Train[0] is ignored (nothing precedes it).
//
// Segments, when set, cut the document into sequences that the model sees apart, as if
// they were documents of their own but always in the same micro-batch: Segments[k] is the
// offset where sequence k starts (Segments[0] = 0, increasing). A preference pair is one
// document of two segments (prompt+chosen, prompt+rejected), so both halves of the pair
// meet in one forward pass. Train is ignored at every segment's first token.
type Document struct {
	Tokens   []int32
	Train    []bool
	Segments []int32
}

// Targets counts the tokens that are trained on (positions 1..n-1 with Train set).
func (d Document) Targets() int {
	n := 0
	for i := 1; i < len(d.Train); i++ {
		if d.Train[i] {
			n++
		}
	}
	return n
}

// Encoder maps one record to a document. It must be safe for concurrent use.
type Encoder func(Record) (Document, error)

// Stats describes what tokenization and truncation did to a dataset.
type Stats struct {
	Records   int // records read
	Documents int // documents kept
	Tokens    int // tokens kept (after truncation)
	Targets   int // tokens trained on
	Truncated int // documents longer than max_length, cut to max_length
	Dropped   int // documents with no target left after truncation, dropped
}

// Tokenize encodes records on all cores (workers <= 0 means GOMAXPROCS), truncates documents
// to maxLength tokens and drops documents that keep no target. The output order follows the
// input order, so the result does not depend on the number of workers.
func Tokenize(recs []Record, enc Encoder, maxLength, workers int) ([]Document, Stats, error) {
	if maxLength < 2 {
		return nil, Stats{}, fmt.Errorf("data: max_length %d: need at least 2 tokens per document", maxLength)
	}
	if workers <= 0 {
		workers = runtime.GOMAXPROCS(0)
	}
	if workers > len(recs) {
		workers = max(1, len(recs))
	}
	docs := make([]Document, len(recs))
	errs := make([]error, len(recs))
	var wg sync.WaitGroup
	next := make(chan int, workers*4)
	for w := 0; w < workers; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range next {
				d, err := enc(recs[i])
				if err == nil && len(d.Tokens) != len(d.Train) {
					err = fmt.Errorf("encoder returned %d tokens but %d mask entries", len(d.Tokens), len(d.Train))
				}
				if err != nil {
					errs[i] = fmt.Errorf("data: %s: %w", recs[i].Where(), err)
					continue
				}
				docs[i] = d
			}
		}()
	}
	for i := range recs {
		next <- i
	}
	close(next)
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			return nil, Stats{}, err
		}
	}
	st := Stats{Records: len(recs)}
	kept := docs[:0]
	for _, d := range docs {
		if len(d.Tokens) > maxLength {
			d.Tokens, d.Train = d.Tokens[:maxLength:maxLength], d.Train[:maxLength:maxLength]
			st.Truncated++
		}
		t := d.Targets()
		if t == 0 {
			st.Dropped++
			continue
		}
		st.Tokens += len(d.Tokens)
		st.Targets += t
		kept = append(kept, d)
	}
	st.Documents = len(kept)
	if len(kept) == 0 {
		return nil, st, fmt.Errorf("data: none of %d records has a token to train on after truncation to max_length %d", len(recs), maxLength)
	}
	return kept, st, nil
}
