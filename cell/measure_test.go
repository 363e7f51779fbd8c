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
