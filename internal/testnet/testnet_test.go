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

// A port held by a listener is not returned while it is held.
func TestFreeAddrSkipsTakenPorts(t *testing.T) {
	var held []net.Listener
	defer func() {
		for _, ln := range held {
			ln.Close()
		}
	}()
	taken := map[string]bool{}
	for range 20 {
		addr := FreeAddr(t)
		if taken[addr] {
			t.Fatalf("FreeAddr returned %s, which a listener holds", addr)
		}
		ln, err := net.Listen("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		held = append(held, ln)
		taken[addr] = true
	}
}
