package comm

import (
	"fmt"
	"testing"

	"github.com/halo-shell/halo-shell/engine/tensor"
)

// BenchmarkCollectives reports the in-process cost of each collective on 1 MiB per rank
// (bytes/s is per rank).
func BenchmarkCollectives(b *testing.B) {
	const numel = 1 << 18 // 1 MiB of f32
	for _, n := range []int{2, 4, 8} {
		for _, kind := range []string{KindAllReduce, KindAllGather, KindReduceScatter, KindAllToAllDispatch} {
			b.Run(fmt.Sprintf("%s/n%d", kind, n), func(b *testing.B) {
				w := newWorld(&testing.T{}, n)
				cs := worldComms(w)
				type bufs struct{ x, big T }
				bs := make([]bufs, n)
				for i, c := range cs {
					bs[i].x, _ = c.Backend().Alloc(tensor.F32, numel)
					bs[i].big, _ = c.Backend().Alloc(tensor.F32, numel*n)
				}
				counts := make([]int, n)
				for i := range counts {
					counts[i] = numel / n
				}
				b.SetBytes(numel * 4)
				b.ResetTimer()
				for b.Loop() {
					errs := spmd(cs, func(c *Comm) error {
						x, big := bs[c.Rank()].x, bs[c.Rank()].big
						switch kind {
						case KindAllReduce:
							return c.AllReduce(x, Sum)
						case KindAllGather:
							return c.AllGather(big, x)
						case KindReduceScatter:
							part, _ := big.View(0, numel/n)
							xs, _ := x.View(0, numel/n*n)
							return c.ReduceScatter(part, xs, Sum)
						default:
							r, _ := x.Reshape(numel, 1)
							return c.AllToAll(r, r, counts, counts, Dispatch)
						}
					})
					for _, err := range errs {
						if err != nil {
							b.Fatal(err)
						}
					}
				}
			})
		}
	}
}
