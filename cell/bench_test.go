package cell

import (
	"context"
	"testing"
)

// BenchmarkEvalExpression is the cost of one small cell (split, compile, run, format).
func BenchmarkEvalExpression(b *testing.B) {
	it, err := New(Options{Session: "bench-none"})
	if err != nil {
		b.Fatal(err)
	}
	defer it.Close()
	ctx := context.Background()
	if _, err := it.Eval(ctx, "x := 20"); err != nil {
		b.Fatal(err)
	}
	for b.Loop() {
		if _, err := it.Eval(ctx, "x*2 + 2"); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkEvalLoop is interpreted arithmetic: a cell summing one million integers.
func BenchmarkEvalLoop(b *testing.B) {
	it, err := New(Options{Session: "bench-none"})
	if err != nil {
		b.Fatal(err)
	}
	defer it.Close()
	ctx := context.Background()
	for b.Loop() {
		if _, err := it.Eval(ctx, "s := 0\nfor i := 0; i < 1000000; i++ {\n\ts += i\n}\ns"); err != nil {
			b.Fatal(err)
		}
	}
}
