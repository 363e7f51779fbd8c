package server

import (
	"math"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/halo-shell/halo-shell/engine/backend/cuda"
)

// TestProfileCUDA profiles steps of the quickstart model on a GPU through the session: the
// parts must add up to the trainer's measured step time within 5% although the device runs
// asynchronously (the wrapper syncs after each op only while profiling). It skips without a
// GPU.
func TestProfileCUDA(t *testing.T) {
	b, err := cuda.New(0)
	if err != nil {
		t.Skipf("needs a CUDA GPU: %v", strings.SplitN(err.Error(), "\n", 2)[0])
	}
	b.Close()
	s := startServer(t, Options{})
	c := dial(t, s.Socket(), "gpu")
	ctx := ctxT(t)
	if _, err := c.Load(ctx, "../../examples/quickstart.yaml", "sft", "--device=cuda", "--tokenizer_name_or_path=../../examples/quickstart/tokenizer",
		"--output_dir="+filepath.Join(t.TempDir(), "out"), "--dataset.synthetic.train=2048", "--dataset.synthetic.eval=8"); err != nil {
		t.Fatal(err)
	}
	ms, err := c.Step(ctx, 10)
	if err != nil {
		t.Fatal(err)
	}
	var plain time.Duration
	for _, m := range ms[5:] {
		plain += time.Duration(m.StepTimeS * float64(time.Second))
	}
	r, err := c.Profile(ctx, 5, false)
	if err != nil {
		t.Fatal(err)
	}
	var prof time.Duration
	for _, p := range r.Steps {
		sum := p.HostS
		for _, v := range p.ComputeS {
			sum += v
		}
		measured := p.Metrics.StepTimeS
		prof += time.Duration(measured * float64(time.Second))
		if math.Abs(sum-measured) > 0.05*measured {
			t.Errorf("step %d: parts %s, measured %s", p.Step, durationS(sum), durationS(measured))
		}
		t.Logf("step %d: %s = host %s + %v", p.Step, durationS(measured), durationS(p.HostS), p.ComputeS)
	}
	t.Logf("mean step: %s unprofiled, %s profiled (sync after every op)", plain/5, prof/5)
}
