package bench

import (
	"context"
	"errors"
	"math"
	"testing"
	"time"

	"github.com/halo-shell/halo-shell/engine/backend/cpu"
	"github.com/halo-shell/halo-shell/engine/tensor"
)

func TestRoundingKeepsOrLosesSmallUpdates(t *testing.T) {
	b := cpu.New(cpu.Options{})
	defer b.Close()
	const n, steps, lr = 1 << 14, 100, 1e-4 // lr is 1/39 of bf16's spacing just below 1
	for _, tc := range []struct {
		mode       RoundingMode
		stateBytes int64 // per weight
		stale      [2]float64
		change     [2]float64 // as a fraction of the expected -steps*lr
	}{
		// Nearest: every update is under half a unit, so nothing ever moves.
		{BF16Nearest, 4, [2]float64{1, 1}, [2]float64{0, 0}},
		// Stochastic: a step moves lr/ulp of the weights by one unit; the mean is exact.
		{BF16Stochastic, 4, [2]float64{0.96, 0.99}, [2]float64{0.9, 1.1}},
		// fp32 master: the master accumulates exactly; the bf16 copy is its rounding.
		{MasterF32, 12, [2]float64{1, 1}, [2]float64{0.7, 1.3}},
	} {
		r, err := MeasureRounding(context.Background(), b, RoundingRequest{Mode: tc.mode, N: n, Steps: steps, LR: lr, W0: 1})
		if err != nil {
			t.Fatalf("%s: %v", tc.mode, err)
		}
		if r.ULP != 1.0/256 {
			t.Errorf("%s: ulp below 1 = %v, want 2^-8", tc.mode, r.ULP)
		}
		if r.StateBytes != tc.stateBytes*n || r.WeightBytes != 2*n || r.GradBytes != 2*n {
			t.Errorf("%s: state %d, weights %d, grads %d bytes; want %d, %d, %d", tc.mode, r.StateBytes, r.WeightBytes, r.GradBytes, tc.stateBytes*n, 2*n, 2*n)
		}
		if r.StaleFraction < tc.stale[0] || r.StaleFraction > tc.stale[1] {
			t.Errorf("%s: stale fraction %.4f, want %v", tc.mode, r.StaleFraction, tc.stale)
		}
		if f := r.MeanChange / r.ExpectedChange; f < tc.change[0] || f > tc.change[1] {
			t.Errorf("%s: mean change %.3g = %.3f of the expected %.3g, want %v", tc.mode, r.MeanChange, f, r.ExpectedChange, tc.change)
		}
		if r.StepSeconds <= 0 || r.StepBytes <= 0 {
			t.Errorf("%s: step %v s, %v bytes", tc.mode, r.StepSeconds, r.StepBytes)
		}
	}
	for _, bad := range []RoundingRequest{{N: 0, Steps: 1, LR: 1, W0: 1}, {N: 1, Steps: 0, LR: 1, W0: 1},
		{N: 1, Steps: 1, LR: -1, W0: 1}, {N: 1, Steps: 1, LR: 1, W0: math.NaN()}, {Mode: 7, N: 1, Steps: 1, LR: 1, W0: 1}} {
		if _, err := MeasureRounding(context.Background(), b, bad); !errors.Is(err, ErrBadOp) {
			t.Errorf("%+v: error %v, want ErrBadOp", bad, err)
		}
	}
}

func TestRoPEPositionsMergeAtReducedPrecision(t *testing.T) {
	b := cpu.New(cpu.Options{})
	defer b.Close()
	// merges counts positions 1..4095 that round to the same number as the one before.
	merges := func(round func(float32) float32) int {
		n := 0
		for p := 1; p < 4096; p++ {
			if round(float32(p)) == round(float32(p-1)) {
				n++
			}
		}
		return n
	}
	bf16 := func(f float32) float32 { return tensor.BF16ToF32(tensor.F32ToBF16(f)) }
	for _, tc := range []struct {
		prec          RoPEPrecision
		merged, first int
	}{
		{RoPEF32, 0, -1},
		// bf16 holds integers exactly to 256; 257 rounds (ties to even) to 256, and from
		// 256 on every other position merges, from 512 three in four, ...
		{RoPEBF16, merges(bf16), 257},
		// TF32 holds integers exactly to 2048; 2049 rounds away to 2050, so 2050 merges
		// with 2049, and every other position after.
		{RoPETF32, 1023, 2050},
	} {
		r, err := MeasureRoPE(context.Background(), b, RoPERequest{T: 4096, R: 16, Precision: tc.prec})
		if err != nil {
			t.Fatalf("%s: %v", tc.prec, err)
		}
		if r.TableFirstMerged != tc.first || r.TableMerged != tc.merged {
			t.Errorf("%s: table merged %d from %d, want %d from %d", tc.prec, r.TableMerged, r.TableFirstMerged, tc.merged, tc.first)
		}
		if r.EngineMerged != 0 || r.EngineFirstMerged != -1 {
			t.Errorf("%s: the engine's RoPE merged %d positions from %d; its angles use exact integer positions", tc.prec, r.EngineMerged, r.EngineFirstMerged)
		}
	}
	for _, bad := range []RoPERequest{{T: 1, R: 16}, {T: 8, R: 3}, {T: 8, R: 16, Precision: "f16"}} {
		if _, err := MeasureRoPE(context.Background(), b, bad); !errors.Is(err, ErrBadOp) {
			t.Errorf("%+v: error %v, want ErrBadOp", bad, err)
		}
	}
}

func TestRoundTF32(t *testing.T) {
	for _, tc := range []struct{ in, want float32 }{
		{2048, 2048}, {2049, 2050}, {2050, 2050}, {2051, 2052}, {1, 1}, {-2049, -2050},
		{1 + 1.0/1024, 1 + 1.0/1024}, {1 + 1.0/4096, 1}, {float32(math.Inf(1)), float32(math.Inf(1))},
	} {
		if got := RoundTF32(tc.in); got != tc.want {
			t.Errorf("RoundTF32(%v) = %v, want %v", tc.in, got, tc.want)
		}
	}
}

func TestCollectivesOnSimulatedDevices(t *testing.T) {
	for _, op := range CollectiveOps() {
		r, err := MeasureCollective(context.Background(), CollectiveRequest{Op: op, Bytes: 1<<16 + 3, Ranks: 4, Device: "cpu",
			Repeats: 2, MinSample: time.Millisecond, MaxTotal: 50 * time.Millisecond})
		if err != nil {
			t.Fatalf("%s: %v", op, err)
		}
		if r.Bytes != 1<<16 || r.Ranks != 4 || r.Devices != "cpu:4 (simulated)" || r.DType != tensor.F32 {
			t.Errorf("%s: %+v", op, r)
		}
		want := 0.75 * (1 << 16)
		if op == OpAllReduce {
			want *= 2
		}
		if r.WireBytes != want {
			t.Errorf("%s: wire bytes %v, want %v", op, r.WireBytes, want)
		}
		if r.Median <= 0 || len(r.Samples) == 0 || r.OpsPerSample < 1 || r.BusGBps() <= 0 {
			t.Errorf("%s: no time: %+v", op, r)
		}
	}
	for _, bad := range []CollectiveRequest{{Op: "gossip", Bytes: 64, Ranks: 2}, {Op: OpAllReduce, Bytes: 64, Ranks: 1},
		{Op: OpAllReduce, Bytes: 4, Ranks: 2}, {Op: OpAllReduce, Bytes: 64, Ranks: 2, Device: "tpu"},
		{Op: OpAllReduce, Bytes: 64, Ranks: 2, DType: tensor.I32}} {
		if _, err := MeasureCollective(context.Background(), bad); !errors.Is(err, ErrBadOp) {
			t.Errorf("%+v: error %v, want ErrBadOp", bad, err)
		}
	}
}

func TestBusFactor(t *testing.T) {
	for _, tc := range []struct {
		op    string
		ranks int
		want  float64
	}{{OpAllReduce, 8, 1.75}, {OpReduceScatter, 8, 0.875}, {OpAllGather, 2, 0.5}, {OpAllToAll, 4, 0.75}, {OpAllReduce, 1, 0}} {
		if got := BusFactor(tc.op, tc.ranks); got != tc.want {
			t.Errorf("BusFactor(%s, %d) = %v, want %v", tc.op, tc.ranks, got, tc.want)
		}
	}
}

func TestRoundingStepDeviceTime(t *testing.T) {
	c := cpu.New(cpu.Options{Workers: 2})
	defer c.Close()
	req := RoundingRequest{Mode: MasterF32, N: 1 << 10, Steps: 5, LR: 1e-4, W0: 1}
	r, err := MeasureRounding(context.Background(), c, req)
	if err != nil {
		t.Fatal(err)
	}
	if r.StepDeviceSeconds != 0 {
		t.Errorf("a backend without a timer has no device step time: %v", r.StepDeviceSeconds)
	}
	b := &timed{Backend: c, t: &hostTimer{}}
	r, err = MeasureRounding(context.Background(), b, req)
	if err != nil {
		t.Fatal(err)
	}
	// The marks lie inside each host-timed step, so the device time cannot exceed it.
	if r.StepDeviceSeconds <= 0 || r.StepDeviceSeconds > r.StepSeconds {
		t.Errorf("device step %v s against a host step of %v s", r.StepDeviceSeconds, r.StepSeconds)
	}
	if b.t.live != 0 {
		t.Errorf("%d marks not released", b.t.live)
	}
}
