package server

import (
	"slices"
	"testing"

	"github.com/halo-shell/halo-shell/session"
	halov1 "github.com/halo-shell/halo-shell/session/proto/halo/v1"
)

func metricsEvent(step int64) *halov1.Event {
	return &halov1.Event{Kind: &halov1.Event_Metrics{Metrics: &halov1.StepMetrics{Step: step}}}
}

func stepsOf(evs []*halov1.Event) []int64 {
	var out []int64
	for _, ev := range evs {
		if m := ev.GetMetrics(); m != nil {
			out = append(out, m.Step)
		}
	}
	return out
}

// The hub keeps the latest metrics of the loaded model for subscribers that ask for them:
// exactly the ones published before the subscription, the newest ones when fewer are asked
// for, none of a model loaded before.
func TestHubMetricsHistory(t *testing.T) {
	h := newHub()
	h.publish(metricsEvent(1))
	h.publish(&halov1.Event{Kind: &halov1.Event_State{State: &halov1.StateEvent{Reason: reasonLoaded}}})
	for s := int64(1); s <= 4; s++ {
		h.publish(metricsEvent(s))
		h.publish(&halov1.Event{Kind: &halov1.Event_Log{Log: &halov1.LogEvent{Message: "x"}}})
	}
	if _, past := h.subscribeWithHistory(0, 0); past != nil {
		t.Errorf("history 0 gave %d events", len(past))
	}
	sub, past := h.subscribeWithHistory(0, 3)
	if got := stepsOf(past); !slices.Equal(got, []int64{2, 3, 4}) || len(past) != 3 {
		t.Fatalf("history of 3 = steps %v (%d events), want the metrics of steps 2-4", got, len(past))
	}
	if _, past := h.subscribeWithHistory(0, 100); !slices.Equal(stepsOf(past), []int64{1, 2, 3, 4}) {
		t.Errorf("history of 100 = steps %v, want 1-4 of the model loaded last", stepsOf(past))
	}
	h.publish(metricsEvent(5))
	if evs, _ := sub.take(); !slices.Equal(stepsOf(evs), []int64{5}) {
		t.Errorf("after subscribing the queue holds steps %v, want only step 5", stepsOf(evs))
	}
	for s := int64(6); s < 6+maxMetricsHistory; s++ {
		h.publish(metricsEvent(s))
	}
	_, past = h.subscribeWithHistory(0, maxEventBuffer)
	if len(past) != maxMetricsHistory || stepsOf(past)[0] != 6 {
		t.Errorf("a long run keeps %d events from step %d, want the last %d", len(past), stepsOf(past)[0], maxMetricsHistory)
	}
}

// Over RPC: a client that subscribes with history gets the steps trained before it, after the
// state event; a negative history is refused.
func TestEventsWithHistoryOverRPC(t *testing.T) {
	_, c := loaded(t)
	ctx := ctxT(t)
	if _, err := c.Step(ctx, 3); err != nil {
		t.Fatal(err)
	}
	st, err := c.SubscribeWithHistory(ctx, 0, 2)
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	var got []*session.Event
	for range 3 {
		ev, err := st.Recv()
		if err != nil {
			t.Fatal(err)
		}
		got = append(got, ev)
	}
	if got[0].GetState().GetReason() != "attached" || !slices.Equal(stepsOf(got[1:]), []int64{2, 3}) {
		t.Fatalf("events %v, want the attached state then steps 2 and 3", got)
	}
	bad, err := c.SubscribeWithHistory(ctx, 0, -1)
	if err == nil {
		_, err = bad.Recv()
		bad.Close()
	}
	if err == nil {
		t.Fatal("history -1 was accepted")
	}
}
