package cpu

import (
	"math/bits"
	"sync"
)

// Scratch float32 buffers are recycled by power-of-two size class so that the many short-lived
// packing and score buffers of a training step do not keep the garbage collector busy.
var scratchPools [48]sync.Pool

// getScratch returns a buffer of length n with unspecified contents; give it back with
// putScratch when done.
func getScratch(n int) *[]float32 {
	if n <= 0 {
		s := []float32{}
		return &s
	}
	c := bits.Len(uint(n - 1)) // smallest class with 1<<c >= n
	if c < len(scratchPools) {
		if p, ok := scratchPools[c].Get().(*[]float32); ok {
			*p = (*p)[:n]
			return p
		}
	}
	s := make([]float32, n, 1<<c)
	return &s
}

func putScratch(p *[]float32) {
	c := bits.Len(uint(cap(*p) - 1))
	if cap(*p) == 0 || cap(*p) != 1<<c || c >= len(scratchPools) {
		return
	}
	scratchPools[c].Put(p)
}
