package testnet

import (
	"net"
	"strconv"
	"testing"
)

// FreeAddr's addresses are on localhost, below the ephemeral range, and can be listened on.
func TestFreeAddrIsBindableBelowTheEphemeralRange(t *testing.T) {
	lo := ephemeralLow()
	seen := map[string]bool{}
	for range 20 {
		addr := FreeAddr(t)
		host, p, err := net.SplitHostPort(addr)
		if err != nil || host != "127.0.0.1" {
			t.Fatalf("FreeAddr = %q: want 127.0.0.1:PORT (%v)", addr, err)
		}
		port, _ := strconv.Atoi(p)
		if port < lowestPort || port >= lo {
			t.Errorf("port %d outside [%d, %d)", port, lowestPort, lo)
		}
		ln, err := net.Listen("tcp", addr)
		if err != nil {
			t.Fatalf("FreeAddr's %s cannot be listened on: %v", addr, err)
		}
		ln.Close()
		seen[addr] = true
	}
	if len(seen) < 10 {
		t.Errorf("20 calls gave %d distinct addresses: the choice is not spread", len(seen))
	}
}

// A port held by a listener is not returned while it is held: of two neighbouring ports with
// the first held, the second comes back every time.
func TestFreeAddrSkipsTakenPorts(t *testing.T) {
	held, err := net.Listen("tcp", FreeAddr(t))
	if err != nil {
		t.Fatal(err)
	}
	defer held.Close()
	port := held.Addr().(*net.TCPAddr).Port
	next := net.JoinHostPort("127.0.0.1", strconv.Itoa(port+1))
	if ln, err := net.Listen("tcp", next); err != nil {
		t.Skipf("the neighbouring port %s is taken too: %v", next, err)
	} else {
		ln.Close()
	}
	for range 20 {
		if got := freeIn(t, port, port+2); got != next {
			t.Fatalf("freeIn over [%d, %d] with %d held = %s, want %s", port, port+1, port, got, next)
		}
	}
}
