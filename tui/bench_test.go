package tui

import (
	"testing"
	"time"
)

// BenchmarkRender measures one frame of the dashboard at 120x40 with full chart history and
// a profile, which is the work done after every event.
func BenchmarkRender(b *testing.B) {
	m := New(newFake(statusAfterScript()), Options{Location: time.UTC})
	m.common.SetSize(120, 40)
	for _, ev := range script() {
		m.d.applyEvent(ev)
	}
	for s := int64(21); s <= maxHistory+20; s++ {
		m.d.applyMetrics(metricsAt(s))
	}
	b.ResetTimer()
	for b.Loop() {
		_ = m.render()
	}
}
