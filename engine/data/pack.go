package data

import (
	"fmt"
	"sort"
)

// IgnoreIndex marks a position whose target is not trained on (the Hugging Face convention).
const IgnoreIndex = -100

// Batch is one packed micro-batch: several documents laid end to end in one row of T tokens.
//
// Shapes: Tokens, Positions and Targets are [T]; DocStarts is [D+1] with DocStarts[0] = 0,
// DocStarts[D] = T, document d occupying [DocStarts[d], DocStarts[d+1]) (the cu_seqlens
// convention). Positions restart at 0 in every document. Targets[i] is the token the model is
// trained to predict after position i: Tokens[i+1] when i+1 lies in the same document and is a
// trained token, IgnoreIndex otherwise (always at a document's last position).
//
// When a document has Segments, each segment is a document of the batch (its own DocStarts
// entry, positions restarting at 0), and Sources and Segs say where sequence d came from:
// Sources[d] is the index of its Document (as given to Assemble or the Loader) and Segs[d]
// its segment number. Both are nil when no document of the batch has segments.
type Batch struct {
	Tokens    []int32
	Positions []int32
	DocStarts []int32
	Targets   []int32
	Sources   []int32
	Segs      []int32
}

// Len is the number of tokens T.
func (b *Batch) Len() int { return len(b.Tokens) }

// Docs is the number of documents D.
func (b *Batch) Docs() int { return max(0, len(b.DocStarts)-1) }

// NumTargets counts the positions whose target is not IgnoreIndex.
func (b *Batch) NumTargets() int {
	n := 0
	for _, t := range b.Targets {
		if t != IgnoreIndex {
			n++
		}
	}
	return n
}

// Assemble lays the documents docs[idx[0]], docs[idx[1]], ... end to end into one batch.
func Assemble(docs []Document, idx []int) Batch {
	total := 0
	for _, i := range idx {
		total += len(docs[i].Tokens)
	}
	b := Batch{
		Tokens:    make([]int32, 0, total),
		Positions: make([]int32, 0, total),
		DocStarts: make([]int32, 1, len(idx)+1),
		Targets:   make([]int32, 0, total),
	}
	segmented := false
	for _, i := range idx {
		segmented = segmented || docs[i].Segments != nil
	}
	for _, i := range idx {
		d := docs[i]
		segs := d.Segments
		if segs == nil {
			segs = []int32{0}
		}
		for k, lo := range segs {
			hi := int32(len(d.Tokens))
			if k+1 < len(segs) {
				hi = segs[k+1]
			}
			for p := lo; p < hi; p++ {
				b.Tokens = append(b.Tokens, d.Tokens[p])
				b.Positions = append(b.Positions, p-lo)
				if p+1 < hi && d.Train[p+1] {
					b.Targets = append(b.Targets, d.Tokens[p+1])
				} else {
					b.Targets = append(b.Targets, IgnoreIndex)
				}
			}
			b.DocStarts = append(b.DocStarts, int32(len(b.Tokens)))
			if segmented {
				b.Sources = append(b.Sources, int32(i))
				b.Segs = append(b.Segs, int32(k))
			}
		}
	}
	return b
}

// PackBestFitDecreasing groups documents of the given lengths into bins of at most budget
// tokens: documents in decreasing length order, each into the open bin whose free space is the
// smallest that still fits it, or a new bin. Documents of equal length keep their input order,
// so shuffling the input before packing changes which documents share a bin. Every length must
// be in [1, budget]. The bins are returned in the order they were opened, each listing document
// indices in the order they were placed.
func PackBestFitDecreasing(lengths []int, budget int) ([][]int, error) {
	if budget < 1 {
		return nil, fmt.Errorf("data: packing budget %d tokens: must be positive", budget)
	}
	order := make([]int, len(lengths))
	for i, n := range lengths {
		if n < 1 || n > budget {
			return nil, fmt.Errorf("data: document %d has %d tokens: must be in [1, %d] to pack", i, n, budget)
		}
		order[i] = i
	}
	sort.SliceStable(order, func(a, b int) bool { return lengths[order[a]] > lengths[order[b]] })

	var bins [][]int
	// open holds (free, bin) sorted by free space ascending, then bin id, for binary search.
	type slot struct{ free, bin int }
	var open []slot
	for _, i := range order {
		n := lengths[i]
		k := sort.Search(len(open), func(j int) bool { return open[j].free >= n })
		var s slot
		if k == len(open) {
			s = slot{free: budget, bin: len(bins)}
			bins = append(bins, nil)
		} else {
			s = open[k]
			open = append(open[:k], open[k+1:]...)
		}
		bins[s.bin] = append(bins[s.bin], i)
		s.free -= n
		if s.free > 0 {
			k = sort.Search(len(open), func(j int) bool {
				return open[j].free > s.free || (open[j].free == s.free && open[j].bin > s.bin)
			})
			open = append(open, slot{})
			copy(open[k+1:], open[k:])
			open[k] = s
		}
	}
	return bins, nil
}

// PackSequential groups documents in input order, perBatch documents per bin (the last bin may
// hold fewer). It is the layout without packing: one sequence per document.
func PackSequential(n, perBatch int) ([][]int, error) {
	if perBatch < 1 {
		return nil, fmt.Errorf("data: %d sequences per micro-batch: must be positive", perBatch)
	}
	var bins [][]int
	for i := 0; i < n; i += perBatch {
		bin := make([]int, 0, perBatch)
		for j := i; j < min(n, i+perBatch); j++ {
			bin = append(bin, j)
		}
		bins = append(bins, bin)
	}
	return bins, nil
}
