package parallel

import (
	"fmt"
	"strings"
	"testing"

	"github.com/halo-shell/halo-shell/engine/backend"
	"github.com/halo-shell/halo-shell/engine/backend/cpu"
	"github.com/halo-shell/halo-shell/engine/mesh"
	"github.com/halo-shell/halo-shell/engine/models"
	"github.com/halo-shell/halo-shell/engine/profile"
)

// profiledStep runs one ForwardBackward of src on n profiled CPU devices under layout and
// returns each rank's spans.
func profiledStep(t *testing.T, src *models.Model, n int, layout string, rows []models.Batch) []profile.Step {
	t.Helper()
	recs := make([]*profile.Recorder, n)
	for r := range recs {
		recs[r] = profile.NewRecorder()
	}
	l, err := mesh.ParseLayout(layout)
	if err != nil {
		t.Fatal(err)
	}
	p, err := New(src, cpuDevices(n), l, Options{NewBackend: func(r int) (backend.Backend, error) {
		return profile.Wrap(cpu.New(cpu.Options{Workers: 1}), recs[r]), nil
	}})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	for r, rec := range recs {
		p.SetRankRecorder(r, rec)
		rec.Enable(true, true)
		rec.BeginStep(1)
	}
	if _, _, err := p.ForwardBackward(rows); err != nil {
		t.Fatal(err)
	}
	steps := make([]profile.Step, n)
	for r, rec := range recs {
		st, ok := rec.EndStep()
		if !ok {
			t.Fatalf("rank %d: no step", r)
		}
		steps[r] = st
	}
	return steps
}

// hostReads counts the downloads of a step outside collectives (the in-process communicator
// stages its operands on the host with downloads of its own, which a device communicator does
// not).
func hostReads(st profile.Step) int {
	n := 0
	for _, sp := range st.Spans {
		if sp.Name != "Download" {
			continue
		}
		inside := false
		for _, c := range st.Spans {
			inside = inside || (c.Comm && sp.Start >= c.Start && sp.Start+sp.Dur <= c.Start+c.Dur)
		}
		if !inside {
			n++
		}
	}
	return n
}

func countSpans(st profile.Step, name string) int {
	n := 0
	for _, sp := range st.Spans {
		if sp.Name == name {
			n++
		}
	}
	return n
}

// Under expert parallelism the MoE blocks stay on the device path: routing, the sort and the
// combine are the device ops, the experts run as grouped GEMMs on their owners, and the only
// host read the exchange adds is one download of the split sizes per MoE layer (a data-parallel
// step on as many devices reads the same otherwise). The backward exchanges reuse the
// forward's splits. Each layer's forward runs three all-to-alls (counts, rows, results), its
// backward two.
func TestExpertParallelDevicePathReadsSplitsOncePerLayer(t *testing.T) {
	for _, tc := range []struct {
		family string
		n      int
		layout string
	}{{"mixtral", 2, "ep=2"}, {"qwen3_moe", 4, "ep=4"}, {"qwen3_moe_e8", 8, "ep=8"}, {"mixtral", 4, "ep=2 fsdp"}} {
		t.Run(fmt.Sprintf("%s/%s", tc.family, strings.ReplaceAll(tc.layout, " ", ",")), func(t *testing.T) {
			src := tinyModel(t, tc.family, 2)
			rows := tinyRows(tc.n, 16, 41, 3)
			layers := len(src.MoELayers())
			dataLayout := strings.TrimSpace(strings.Replace(tc.layout, "ep="+strings.Fields(tc.layout)[0][3:], "", 1))
			ref := profiledStep(t, src, tc.n, dataLayout, rows)
			got := profiledStep(t, src, tc.n, tc.layout, rows)
			for r, st := range got {
				if n := countSpans(st, "MoEPermute"); n < 2*layers {
					t.Errorf("rank %d: %d MoEPermute ops for %d MoE layers: the blocks did not take the device path", r, n, layers)
				}
				if n := countSpans(st, "GroupedGEMM.forward"); n != 2*layers {
					t.Errorf("rank %d: %d grouped forward GEMMs, want two per MoE layer (%d)", r, n, 2*layers)
				}
				reads, refReads := hostReads(st), hostReads(ref[r])
				if reads-refReads != layers {
					t.Errorf("rank %d: %d host reads under %s, %d under %q: want one more per MoE layer (%d)", r, reads, tc.layout, refReads, dataLayout, layers)
				}
				if r == 0 {
					t.Logf("host reads per forward and backward: %d under %s, %d under %q", reads, tc.layout, refReads, dataLayout)
				}
				a2a := 0
				for _, sp := range st.Spans {
					if sp.Comm && (sp.Class == profile.CommAllToAllDispatch || sp.Class == profile.CommAllToAllCombine) {
						a2a++
					}
				}
				if a2a != 5*layers {
					t.Errorf("rank %d: %d all-to-alls, want 5 per MoE layer (%d)", r, a2a, 5*layers)
				}
			}
		})
	}
}
