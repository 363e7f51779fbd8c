package cuda

import (
	"bytes"
	"fmt"
	"strings"
	"testing"

	"github.com/halo-shell/halo-shell/engine/backend/cpu"
)

// TestSinkSoftmaxKernelsOnHost runs kernels/dsv4_softmax.cu (with dsv4_attention.cu's GSinks
// kernel) as host C++ (testdata/hostemu: a block's threads as fibers) on sinkSoftmaxCases and
// compares every output with the CPU backend's SinkSoftmax and SinkSoftmaxBackward: each case
// with the launcher's kernel and block, and a case of S a multiple of 4 also with the
// one-column kernels on blocks of 64 threads. It needs a C++17 compiler and skips without one
// (fails under CI).
func TestSinkSoftmaxKernelsOnHost(t *testing.T) {
	src, err := kernelSource(sinkSoftmaxFile)
	if err != nil {
		t.Fatal(err)
	}
	att, err := kernelFS.ReadFile("kernels/" + sinkAttnFile)
	if err != nil {
		t.Fatal(err)
	}
	const dyn = "extern __shared__ float sa_sm[];"
	src += "\n#line 1 \"" + sinkAttnFile + "\"\n" + strings.ReplaceAll(string(att), dyn, "float* sa_sm = emu_smem;")
	src = strings.ReplaceAll(src, "__shared__ ", "static ")
	bin := buildHostEmu(t, "sink-softmax", "dsv4_softmax_check", src, "-O1")
	c := cpu.New(cpu.Options{Workers: 1})
	defer c.Close()
	type run struct {
		sc            sinkSoftmaxCase
		vec           bool
		threads       int
		want          map[string][]float32
		desc          string
		hasMask, vecI int
	}
	var runs []run
	var in bytes.Buffer
	for _, sc := range sinkSoftmaxCases {
		d := sc.data()
		want, err := runSinkSoftmax(c, sc, d)
		if err != nil {
			t.Fatalf("%v: CPU: %v", sc, err)
		}
		s := sc.n + sc.c
		_, block, vec := sinkSoftmaxLaunch(sc.n*sc.h, s, nil, nil)
		variants := []run{{sc: sc, vec: vec, threads: int(block[0])}}
		if vec {
			variants = append(variants, run{sc: sc, threads: 64})
		}
		for _, v := range variants {
			v.want = want
			v.desc = fmt.Sprintf("%v, vec %v, %d threads", sc, v.vec, v.threads)
			if d.mask != nil {
				v.hasMask = 1
			}
			if v.vec {
				v.vecI = 1
			}
			fmt.Fprintf(&in, "%d %d %d %d %d %d %d %d %d\n", sc.n, sc.c, sc.h, sc.window, sc.rate, v.hasMask, int(sc.dt),
				v.vecI, v.threads)
			writeFloats(&in, d.x)
			writeFloats(&in, d.sinks)
			for _, m := range d.mask {
				fmt.Fprintf(&in, "%d ", m)
			}
			in.WriteByte('\n')
			writeFloats(&in, d.lse)
			writeFloats(&in, d.dp)
			writeFloats(&in, d.gs)
			runs = append(runs, v)
		}
	}
	gots := runHostEmu(t, bin, &in, len(sinkSoftmaxOutputs), len(runs))
	for i, r := range runs {
		if r.sc.noGSinks {
			delete(gots[i], "gsinks") // the harness runs the kernel anyway; the op skips it
		}
		t.Run(r.desc, func(t *testing.T) { compareSinkSoftmax(t, r.sc, gots[i], r.want, "the host-emulated kernel") })
	}
}
