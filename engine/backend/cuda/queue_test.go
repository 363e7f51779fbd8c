package cuda

import (
	"errors"
	"strings"
	"sync"
	"testing"
)

// testQueue starts a goroutine serving q as a device goroutine does and returns a stop function.
func testQueue(async bool) (*cmdQueue, func()) {
	return testQueueClosed(async, func() bool { return false })
}

func testQueueClosed(async bool, closed func() bool) (*cmdQueue, func()) {
	q := newCmdQueue("device 0", closed)
	q.async = async
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		defer close(q.done)
		for f := range q.cmds {
			f()
		}
	}()
	return q, func() { close(q.cmds); wg.Wait() }
}

func TestPostedFunctionsRunInOrderBeforeALaterDo(t *testing.T) {
	for _, async := range []bool{true, false} {
		q, stop := testQueue(async)
		var got []int // touched only on the serving goroutine, read after a Do
		for i := range 3000 {
			if err := q.post(func() error { got = append(got, i); return nil }); err != nil {
				t.Fatal(err)
			}
		}
		var n int
		if err := q.do(func() error { n = len(got); return nil }); err != nil {
			t.Fatal(err)
		}
		stop()
		if n != 3000 {
			t.Fatalf("async %v: a Do after 3000 Posts saw %d of them", async, n)
		}
		for i, v := range got {
			if v != i {
				t.Fatalf("async %v: position %d ran post %d", async, i, v)
			}
		}
	}
}

func TestPostedErrorIsReportedOnceByTheNextCall(t *testing.T) {
	boom := errors.New("launch of k failed")
	for _, tc := range []struct {
		name string
		next func(q *cmdQueue) error
	}{
		{"next Do", func(q *cmdQueue) error { return q.do(func() error { return nil }) }},
		{"next Post", func(q *cmdQueue) error { return q.post(func() error { return nil }) }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			q, stop := testQueue(true)
			defer stop()
			// The failing op waits for release, so nothing is kept while the later ops are
			// posted; once ran is closed, both failures have run and the first is kept.
			release, ran := make(chan struct{}), make(chan struct{})
			for _, f := range []func() error{
				func() error { <-release; return boom },
				func() error { return errors.New("second failure") },
				func() error { close(ran); return nil },
			} {
				if err := q.post(f); err != nil {
					t.Fatalf("post returned %v before any op failed", err)
				}
			}
			close(release)
			<-ran
			err := tc.next(q)
			if !errors.Is(err, boom) || !strings.Contains(err.Error(), "an earlier queued op failed") {
				t.Fatalf("got %v, want the first posted failure named as earlier", err)
			}
			if err := q.do(func() error { return nil }); err != nil {
				t.Fatalf("the error was reported twice, or the second kept: %v", err)
			}
		})
	}
}

func TestDoReturnsItsOwnErrorBesideAKeptOne(t *testing.T) {
	q, stop := testQueue(true)
	defer stop()
	first, own := errors.New("posted failure"), errors.New("own failure")
	if err := q.post(func() error { return first }); err != nil {
		t.Fatal(err)
	}
	err := q.do(func() error { return own })
	if !errors.Is(err, first) || !errors.Is(err, own) {
		t.Fatalf("got %v, want both the kept and the Do's own error", err)
	}
}

func TestPanicsAndClosedDevicesBecomeErrors(t *testing.T) {
	q, stop := testQueue(true)
	if err := q.post(func() error { panic("bad index") }); err != nil {
		t.Fatal(err)
	}
	err := q.do(func() error { return nil })
	if err == nil || !strings.Contains(err.Error(), "panic on the device thread: bad index") {
		t.Fatalf("got %v, want the panic as an error", err)
	}
	stop()
	qc, stopc := testQueueClosed(true, func() bool { return true })
	if err := qc.do(func() error { t.Error("ran on a closed device"); return nil }); err == nil || !strings.Contains(err.Error(), "closed") {
		t.Fatalf("got %v, want device is closed", err)
	}
	stopc()
	if err := q.post(func() error { return nil }); err == nil || !strings.Contains(err.Error(), "closed") {
		t.Fatalf("post after stop: got %v, want device is closed", err)
	}
	if err := q.do(func() error { return nil }); err == nil || !strings.Contains(err.Error(), "closed") {
		t.Fatalf("do after stop: got %v, want device is closed", err)
	}
}
