// Package testnet gives tests a localhost TCP address to hand to a server they start later (a
// rendezvous store, a node's listener, a child process).
//
// The usual trick, listening on port 0 and closing the listener, returns a port from the
// kernel's ephemeral range, the range outgoing connections take their local ports from: between
// the close and the server's bind, any connection made on the machine (another test package's
// nodes joining their own store) can take it, and the server fails with "address already in
// use". FreeAddr picks instead a port below that range (ip_local_port_range; 32768 where it
// cannot be read), which no outgoing connection takes, checks that it can be bound, and
// releases it: only a test doing the same can collide with it, and one picks randomly among
// some twenty thousand ports.
package testnet

import (
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"strconv"
	"strings"
	"testing"
)

// lowestPort is the first port FreeAddr considers: above the registered services commonly
// running on a development machine or CI runner.
const lowestPort = 10000

// FreeAddr returns "127.0.0.1:PORT" for a port below the kernel's ephemeral range that was free
// a moment ago.
func FreeAddr(tb testing.TB) string {
	tb.Helper()
	return freeIn(tb, lowestPort, ephemeralLow())
}

// freeIn returns "127.0.0.1:PORT" for a random port of [lo, hi) that was free a moment ago.
func freeIn(tb testing.TB, lo, hi int) string {
	tb.Helper()
	for range 200 {
		port := lo + rand.IntN(hi-lo)
		addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
		ln, err := net.Listen("tcp", addr)
		if err != nil {
			continue // taken: try another
		}
		ln.Close()
		return addr
	}
	tb.Fatalf("testnet: no free localhost port in [%d, %d) after 200 tries", lo, hi)
	return ""
}

// ephemeralLow is the first port of the kernel's ephemeral range, or 32768 (Linux's default)
// where /proc does not say.
func ephemeralLow() int {
	if b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range"); err == nil {
		var lo, hi int
		if n, _ := fmt.Sscan(strings.TrimSpace(string(b)), &lo, &hi); n == 2 && lo > lowestPort+1000 {
			return lo
		}
	}
	return 32768
}
