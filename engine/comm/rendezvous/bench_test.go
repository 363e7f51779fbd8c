package rendezvous

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"
)

// BenchmarkJoin measures one rendezvous of n nodes on loopback (goroutines of this process):
// listen, n-1 challenges and hellos, and the world sent to every node.
func BenchmarkJoin(b *testing.B) {
	for _, n := range []int{2, 8, 32} {
		b.Run(fmt.Sprintf("nodes=%d", n), func(b *testing.B) {
			payload := make([]byte, 128)
			for i := 0; i < b.N; i++ {
				addr := freeAddr(b)
				var wg sync.WaitGroup
				errs := make([]error, n)
				for r := 0; r < n; r++ {
					wg.Add(1)
					go func() {
						defer wg.Done()
						cfg := Config{NNodes: n, NodeRank: r, Addr: addr, Bind: addr, Token: "t", Timeout: 20 * time.Second}
						_, errs[r] = Join(context.Background(), cfg, 8, payload)
					}()
				}
				wg.Wait()
				for r, err := range errs {
					if err != nil {
						b.Fatalf("node %d: %v", r, err)
					}
				}
			}
		})
	}
}
