package nn

import "sort"

// torchTopK returns the indices of the k largest of v as torch.topk on the CPU selects them,
// ties included: for k*64 > len(v) torch runs an nth_element (introselect: median-of-three
// partitions down to at most three elements, then an insertion sort) over (value, index)
// pairs compared by value alone, and keeps the first k. Which of several equal values it
// keeps depends on that order, and a model whose scores tie exactly (a ReLU indexer scoring
// zero, a hash of equal router scores) must keep the same ones to compute the same thing.
// Other regimes (k*64 <= len(v): a heap-based partial sort) keep a value-correct set whose
// ties go to the lower index.
func torchTopK(v []float64, k int) []int {
	n := len(v)
	idx := make([]int, n)
	for i := range idx {
		idx[i] = i
	}
	if k <= 0 {
		return nil
	}
	if k >= n {
		return idx
	}
	greater := func(a, b int) bool { return v[idx[a]] > v[idx[b]] }
	swap := func(a, b int) { idx[a], idx[b] = idx[b], idx[a] }
	if k*64 <= n {
		sort.SliceStable(idx, func(a, b int) bool { return v[idx[a]] > v[idx[b]] })
		return idx[:k]
	}
	first, last, nth := 0, n, k-1
	depth := 0
	for m := n; m > 1; m >>= 1 {
		depth += 2
	}
	for last-first > 3 {
		if depth == 0 {
			// Degenerate partitions: finish with a stable selection.
			sub := idx[first:last]
			sort.SliceStable(sub, func(a, b int) bool { return v[sub[a]] > v[sub[b]] })
			return idx[:k]
		}
		depth--
		// The median of first+1, mid and last-1 moves to first and is the pivot.
		a, b, c := first+1, first+(last-first)/2, last-1
		switch {
		case greater(a, b):
			switch {
			case greater(b, c):
				swap(first, b)
			case greater(a, c):
				swap(first, c)
			default:
				swap(first, a)
			}
		case greater(a, c):
			swap(first, a)
		case greater(b, c):
			swap(first, c)
		default:
			swap(first, b)
		}
		lo, hi := first+1, last
		for {
			for greater(lo, first) {
				lo++
			}
			hi--
			for greater(first, hi) {
				hi--
			}
			if lo >= hi {
				break
			}
			swap(lo, hi)
			lo++
		}
		if lo <= nth {
			first = lo
		} else {
			last = lo
		}
	}
	// Insertion sort of [first, last): an element moves before those it strictly exceeds.
	for i := first + 1; i < last; i++ {
		for j := i; j > first && greater(j, j-1); j-- {
			swap(j, j-1)
		}
	}
	return idx[:k]
}
