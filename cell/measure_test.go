package cell

import (
	"context"
	"strings"
	"testing"
	"time"
)

// TestMeasureFromCells times ops through the halo API on an in-process session with no model
// loaded: the session's own device (the CPU here) runs them.
func TestMeasureFromCells(t *testing.T) {
	sock := startSession(t)
	it, err := New(Options{Session: sock, ClientName: "measure-test"})
	if err != nil {
		t.Fatal(err)
	}
	defer it.Close()
	r := evalT(t, it, `d := halo.Device()
g := halo.MeasureGEMM(64, 64, 64, "")
fmt.Sprintf("%s|%s|%v|%v|%v", d.Name, g.Device, g.FLOPs, g.Seconds > 0, g.TFLOPS == g.FLOPs/g.Seconds/1e12)`)
	if got := plain(r.Value); got != `"cpu|cpu|524288|true|true"` {
		t.Fatalf("device and gemm: %s (stdout %q)", got, r.Stdout)
	}
	r = evalT(t, it, `c := halo.MeasureCopy(1 << 16)
l := halo.MeasureLaunch()
u := halo.MeasureAddRMSNorm(16, 128, "bf16", false)
f := halo.MeasureAddRMSNorm(16, 128, "bf16", true)
a := halo.MeasureAttention(32, 2, 16, "")
fmt.Sprintf("%v|%v|%v|%v|%v", c.Bytes, l.Seconds > 0, u.Bytes > f.Bytes, a.Op, a.Intensity > 0)`)
	if got := plain(r.Value); got != `"131072|true|true|attention|true"` {
		t.Fatalf("copy, launch, fusion, attention: %s", got)
	}
	// The memory estimate needs a model: the loaded run's estimate beside its device's use.
	evalT(t, it, ":load testdata/tiny.yaml")
	evalT(t, it, ":step 1")
	r = evalT(t, it, `mem := halo.MeasureMemory()
fmt.Sprintf("%s|%v|%v", mem.Device, mem.Total == mem.Params+mem.Grads+mem.Optimizer+mem.Activations+mem.Logits+mem.Scratch, mem.Params > 0 && mem.Peak > 0)`)
	if got := plain(r.Value); got != `"cpu|true|true"` {
		t.Fatalf("memory: %s", got)
	}
	// A step's metrics carry its own memory peak and its model FLOPs.
	r = evalT(t, it, `sm := halo.Metrics()
last := sm[len(sm)-1]
fmt.Sprintf("%d|%v|%v", len(last.Memory), last.Memory[0].Peak > last.Memory[0].Allocated && last.Memory[0].Allocated > 0, last.ModelFLOPs > 0 && last.TFLOPS > 0)`)
	if got := plain(r.Value); got != `"1|true|true"` {
		t.Fatalf("step memory and flops: %s", got)
	}
	// A timed continuation counts its new tokens.
	r = evalT(t, it, `g := halo.GenerateTimed("What is 2+3?", 4)
fmt.Sprintf("%v|%v", g.Tokens >= 1 && g.Tokens <= 4, g.Seconds > 0 && g.TokensPerS() > 0)`)
	if got := plain(r.Value); got != `"true|true"` {
		t.Fatalf("generate timed: %s", got)
	}
	// Collectives on simulated devices: the buffer, the ring's bytes per rank and a time.
	r = evalT(t, it, `ar := halo.MeasureCollective("all_reduce", 1<<16, 4, "")
rs := halo.MeasureCollectiveOn("cpu", "reduce_scatter", 1<<16, 4, "bf16")
fmt.Sprintf("%s|%v|%v|%v|%v|%v", ar.Device, ar.Bytes, ar.WireBytes, rs.WireBytes, ar.Seconds > 0 && ar.BusGBps > ar.AlgGBps, halo.BusFactor("all_reduce", 4))`)
	if got := plain(r.Value); got != `"cpu:4 (simulated)|65536|98304|49152|true|1.5"` {
		t.Fatalf("collectives: %s", got)
	}
	// Nearest rounding loses updates under half a bf16 unit; stochastic rounding keeps them
	// in the mean; the optimizer state is 12 bytes per weight with an fp32 master, 4 without.
	r = evalT(t, it, `near := halo.MeasureAdamW("adamw_bf16_nearest", 4096, 20, 1e-4, 1)
sr := halo.MeasureAdamW("adamw_bf16", 4096, 20, 1e-4, 1)
ms := halo.MeasureAdamW("adamw", 4096, 20, 1e-4, 1)
fmt.Sprintf("%v|%v|%v|%v|%v|%v", near.StaleFraction, near.MeanChange, sr.MeanChange < 0 && sr.StaleFraction < 1, ms.BytesPerParam(), sr.BytesPerParam(), near.ULP)`)
	if got := plain(r.Value); got != `"1|0|true|16|8|0.00390625"` {
		t.Fatalf("adamw rounding: %s", got)
	}
	r = evalT(t, it, `tf := halo.MeasureRoPE(4096, 16, "tf32")
f := halo.MeasureRoPE(4096, 16, "f32")
fmt.Sprintf("%d|%d|%d|%d", tf.TableFirst, tf.TableMerged, f.TableMerged, tf.EngineMerged)`)
	if got := plain(r.Value); got != `"2050|1023|0|0"` {
		t.Fatalf("rope: %s", got)
	}
	// On a parallel layout: the layout's estimate, each rank's peak and the step's bytes on
	// the wire by collective kind.
	evalT(t, it, `halo.Set("grad_accum", 2)`)
	evalT(t, it, `halo.Layout("dp=2 devices=cpu:2")`)
	r = evalT(t, it, `p := halo.Profile(1)
mem2 := halo.MeasureMemory()
fmt.Sprintf("%v|%d|%v", mem2.Layout != nil && mem2.Layout.Total > 0, len(mem2.RankPeak), p.Steps[0].CommBytes["all_reduce"] > 0)`)
	if got := plain(r.Value); got != `"true|2|true"` {
		t.Fatalf("layout memory and comm bytes: %s", got)
	}
	// A bad request is the cell's error, naming the call and what is wrong.
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	_, err = it.Eval(ctx, `halo.MeasureGEMM(0, 4, 4, "")`)
	if err == nil {
		t.Fatal("gemm with M=0 was accepted")
	}
	msg := err.Error()
	for _, part := range []string{"halo.MeasureGEMM", "size M = 0"} {
		if !strings.Contains(msg, part) {
			t.Errorf("error %q does not name %q", msg, part)
		}
	}
}
