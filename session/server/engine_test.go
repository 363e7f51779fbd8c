package server

import (
	"context"
	"testing"
	"time"

	"connectrpc.com/connect/v2"
)

func TestCommandQueueTimeoutAndShutdown(t *testing.T) {
	old := queueTimeout
	queueTimeout = 20 * time.Millisecond
	defer func() { queueTimeout = old }()
	e := newEngine("q", discardLogger(), newHub(), "")
	go e.loop()
	release := make(chan struct{})
	started := make(chan struct{})
	go func() {
		_, _ = e.submit(context.Background(), func(*command) (any, error) {
			close(started)
			<-release
			return nil, nil
		})
	}()
	<-started
	_, err := e.submit(context.Background(), func(*command) (any, error) { return 1, nil })
	if connect.CodeOf(err) != connect.CodeDeadlineExceeded {
		t.Fatalf("command behind a busy engine: %v, want deadline_exceeded", err)
	}
	mustContain(t, err, "step boundary")
	// A caller whose context ends stops waiting, and its command never runs.
	ctx, cancel := context.WithCancel(context.Background())
	ran := make(chan struct{}, 1)
	go func() {
		time.Sleep(5 * time.Millisecond)
		cancel()
	}()
	queueTimeout = time.Minute
	_, err = e.submit(ctx, func(*command) (any, error) { ran <- struct{}{}; return nil, nil })
	if connect.CodeOf(err) != connect.CodeCanceled {
		t.Fatalf("cancelled caller: %v", err)
	}
	close(release)
	v, err := e.submit(context.Background(), func(*command) (any, error) { return 42, nil })
	if err != nil || v.(int) != 42 {
		t.Fatalf("after the busy command: %v, %v", v, err)
	}
	select {
	case <-ran:
		t.Fatal("a cancelled caller's command ran")
	default:
	}
	e.stop()
	<-e.done
	if _, err := e.submit(context.Background(), func(*command) (any, error) { return nil, nil }); err != errStopped {
		t.Fatalf("submit after stop: %v", err)
	}
}
