package chat

import (
	"sync"
	"testing"
)

// TestConcurrentRenders renders and masks from several goroutines with one Template and
// checks every result equals the sequential one (run with -race to check for data races).
func TestConcurrentRenders(t *testing.T) {
	cases := loadCases(t)
	tmpl, err := Load("testdata/templates/stress")
	if err != nil {
		t.Fatal(err)
	}
	c := cases["tool_call_object_args"]
	opts := caseOptions(c, true)
	want, err := tmpl.Render(c.Messages, opts)
	if err != nil {
		t.Fatal(err)
	}
	q, err := Load("testdata/templates/qwen3")
	if err != nil {
		t.Fatal(err)
	}
	mc := cases["thinking_inline"]
	_, wantSpans, err := q.AssistantSpans(mc.Messages, caseOptions(mc, false))
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	errs := make(chan string, 16)
	for g := 0; g < 8; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < 20; i++ {
				got, err := tmpl.Render(c.Messages, opts)
				if err != nil || got != want {
					errs <- "render differs"
					return
				}
				_, spans, err := q.AssistantSpans(mc.Messages, caseOptions(mc, false))
				if err != nil || len(spans) != len(wantSpans) || spans[0] != wantSpans[0] {
					errs <- "spans differ"
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for e := range errs {
		t.Fatal(e)
	}
}
