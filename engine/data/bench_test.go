package data

import (
	"math/rand/v2"
	"testing"
)

// BenchmarkPackBestFitDecreasing packs 100,000 documents of 1..2048 tokens into 8x2048-token
// micro-batches.
func BenchmarkPackBestFitDecreasing(b *testing.B) {
	rng := rand.New(rand.NewPCG(1, 2))
	lengths := make([]int, 100_000)
	for i := range lengths {
		lengths[i] = 1 + rng.IntN(2048)
	}
	b.ReportAllocs()
	for b.Loop() {
		if _, err := PackBestFitDecreasing(lengths, 8*2048); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(len(lengths))*float64(b.N)/b.Elapsed().Seconds(), "docs/s")
}

// BenchmarkLoaderEpoch plans and assembles one shuffled epoch of 20,000 short documents.
func BenchmarkLoaderEpoch(b *testing.B) {
	docs := testDocs(20_000, 5)
	for b.Loop() {
		l, err := NewLoader(docs, LoaderOptions{Packing: true, BatchSize: 16, MaxLength: 32, Shuffle: true, Seed: 1})
		if err != nil {
			b.Fatal(err)
		}
		for range l.BatchesPerEpoch() {
			if _, err := l.Next(); err != nil {
				b.Fatal(err)
			}
		}
	}
}
