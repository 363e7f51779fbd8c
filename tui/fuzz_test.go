package tui

import (
	"math"
	"strings"
	"testing"
	"time"

	"github.com/charmbracelet/x/ansi"
	"google.golang.org/protobuf/proto"

	"github.com/halo-shell/halo-shell/session"
	halov1 "github.com/halo-shell/halo-shell/session/proto/halo/v1"
)

// FuzzEvents feeds arbitrary events (decoded from the wire format, as a session would send
// them) to the dashboard and renders it at arbitrary sizes: it must never panic, never draw
// outside the screen, and never pass escape sequences from the session to the terminal.
func FuzzEvents(f *testing.F) {
	for _, ev := range script() {
		b, err := proto.Marshal(ev)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b, uint8(80), uint8(24))
	}
	odd := []*session.Event{
		{Kind: &halov1.Event_Metrics{Metrics: &session.StepMetrics{Step: math.MaxInt64, Loss: math.NaN(), Lr: math.Inf(1), TokensPerS: -1}}},
		{Kind: &halov1.Event_Metrics{Metrics: &session.StepMetrics{Step: -3, Loss: 1e308, Lr: -1e308}}},
		{Kind: &halov1.Event_Metrics{Metrics: &session.StepMetrics{Step: 9, Loss: -1e308, Lr: 1e308}}},
		{Kind: &halov1.Event_Metrics{Metrics: &session.StepMetrics{Step: 9, Loss: 5e-324, Lr: math.SmallestNonzeroFloat64}}},
		{Kind: &halov1.Event_Profile{Profile: &session.StepProfile{Step: 1, StepS: math.Inf(1), HostS: math.NaN(), Flops: 1e308,
			ComputeS: map[string]float64{"matmul": 1e308, "\x1b[31mred": 1e308, "": -1}, CommS: map[string]float64{"all_reduce": math.MaxFloat64}}}},
		{Kind: &halov1.Event_Log{Log: &halov1.LogEvent{Level: "\x1b]0;title\x07", Message: "a\nb\r\n\x1b[2J\tc" + strings.Repeat("é", 300)}}},
		{Kind: &halov1.Event_State{State: &halov1.StateEvent{State: halov1.State(99), Step: -1, Controller: "\x1b[1mx", Reason: "attached"}}},
		{Kind: &halov1.Event_Dropped{Dropped: &halov1.DroppedEvent{Count: math.MinInt64}}},
	}
	for _, ev := range odd {
		b, err := proto.Marshal(ev)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b, uint8(80), uint8(24))
		f.Add(b, uint8(7), uint8(3))
	}
	f.Fuzz(func(t *testing.T, b []byte, w, h uint8) {
		ev := &session.Event{}
		if err := proto.Unmarshal(b, ev); err != nil {
			return
		}
		fk := newFake(statusAfterScript())
		m := New(fk, Options{Location: time.UTC})
		m.common.SetSize(int(w), int(h))
		for _, e := range script()[:10] { // attached, logs, running, steps 1-6

			m.d.applyEvent(e)
		}
		m.d.applyEvent(ev)
		m.d.applyEvent(ev) // a repeat
		out := m.render()
		plain := ansi.Strip(out)
		lines := strings.Split(plain, "\n")
		if len(lines) > max(int(h), 1) {
			t.Fatalf("%d lines on a %dx%d screen", len(lines), w, h)
		}
		for _, l := range lines {
			if ansi.StringWidth(l) > int(w) {
				t.Fatalf("a line of %d cells on a %dx%d screen: %q", ansi.StringWidth(l), w, h, l)
			}
			if strings.ContainsAny(l, "\x1b\x07\r") {
				t.Fatalf("a control character from the session reached the screen: %q", l)
			}
		}
	})
}
