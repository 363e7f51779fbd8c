package server

import (
	"fmt"
	"sort"
)

// traceEvent is the part of a Chrome trace event that stallsByStep reads.
type traceEvent struct {
	Name string  `json:"name"`
	Cat  string  `json:"cat"`
	Ph   string  `json:"ph"`
	Ts   float64 `json:"ts"`  // µs
	Dur  float64 `json:"dur"` // µs
}

// stallGap is the shortest gap between two op spans of the tiny test model that is counted as
// a stall rather than host work: its host work between two ops takes microseconds (all of
// it, over hundreds of ops, about 0.1-0.3 ms of a 2-4 ms step), while a process taken off
// the CPU of a loaded machine, or stopped by the garbage collector, is gone for milliseconds.
const stallGap = 1e3 // µs

// stallsByStep returns, per step of a trace, the seconds of the gaps between op spans (and
// between the step's edges and its first and last op) that are at least stallGap long.
func stallsByStep(evs []traceEvent) map[int64]float64 {
	type window struct {
		step       int64
		start, end float64
		spans      [][2]float64
	}
	var steps []*window
	for _, e := range evs {
		var n int64
		if e.Ph == "X" && e.Cat == "step" {
			if _, err := fmt.Sscanf(e.Name, "step %d", &n); err == nil {
				steps = append(steps, &window{step: n, start: e.Ts, end: e.Ts + e.Dur})
			}
		}
	}
	for _, e := range evs {
		if e.Ph != "X" || e.Cat == "step" {
			continue
		}
		for _, w := range steps {
			if e.Ts >= w.start && e.Ts < w.end {
				w.spans = append(w.spans, [2]float64{e.Ts, e.Ts + e.Dur})
			}
		}
	}
	out := map[int64]float64{}
	for _, w := range steps {
		sort.Slice(w.spans, func(i, j int) bool { return w.spans[i][0] < w.spans[j][0] })
		at, stalled := w.start, 0.0
		for _, sp := range append(w.spans, [2]float64{w.end, w.end}) {
			if gap := sp[0] - at; gap >= stallGap {
				stalled += gap
			}
			at = max(at, sp[1])
		}
		out[w.step] = stalled / 1e6
	}
	return out
}
