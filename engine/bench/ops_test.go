package bench

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/halo-shell/halo-shell/engine/backend"
	"github.com/halo-shell/halo-shell/engine/backend/cpu"
	"github.com/halo-shell/halo-shell/engine/tensor"
)

func fastReq(op string, dt tensor.DType, sizes ...int64) OpRequest {
	return OpRequest{Op: op, Sizes: sizes, DType: dt, Repeats: 3, MinSample: time.Millisecond, MaxTotal: 200 * time.Millisecond}
}

func TestMeasureOpReportsWorkAndTime(t *testing.T) {
	b := cpu.New(cpu.Options{})
	defer b.Close()
	for _, tc := range []struct {
		op           string
		dt           tensor.DType
		sizes        []int64
		flops, bytes float64
	}{
		{OpGEMM, tensor.F32, []int64{32, 16, 8}, 2 * 32 * 16 * 8, 4 * (32*8 + 8*16 + 32*16)},
		{OpGEMM, tensor.BF16, []int64{8, 8, 8}, 2 * 512, 2 * 3 * 64},
		{OpCopy, tensor.F32, []int64{4096}, 0, 2 * 4096},
		{OpCopy, tensor.BF16, []int64{3}, 0, 2 * 4}, // rounded up to whole elements
		{OpLaunch, tensor.F32, nil, 1, 8},
		{OpAddRMSNorm, tensor.F32, []int64{4, 64}, 5 * 256, 4*4*256 + 4*64 + 4*4},
		{OpAddThenRMSNorm, tensor.F32, []int64{4, 64}, 5 * 256, 5*4*256 + 4*64 + 4*4},
		{OpAttention, tensor.F32, []int64{16, 2, 8}, 2 * 16 * 16 * 2 * 8, 4*4*16*16 + 4*16*2},
	} {
		r, err := MeasureOp(context.Background(), b, fastReq(tc.op, tc.dt, tc.sizes...))
		if err != nil {
			t.Fatalf("%s %v: %v", tc.op, tc.sizes, err)
		}
		if r.Device != "cpu" || r.Op != tc.op || r.DType != tc.dt || r.HostThreads < 1 {
			t.Errorf("%s: result names %q %q %v threads %d", tc.op, r.Device, r.Op, r.DType, r.HostThreads)
		}
		if r.FLOPs != tc.flops || r.Bytes != tc.bytes {
			t.Errorf("%s %v: flops %v bytes %v, want %v and %v", tc.op, tc.sizes, r.FLOPs, r.Bytes, tc.flops, tc.bytes)
		}
		if len(r.Samples) == 0 || r.Median <= 0 || r.OpsPerSample < 1 {
			t.Errorf("%s: samples %v median %v ops %d", tc.op, r.Samples, r.Median, r.OpsPerSample)
		}
		// An op far shorter than MinSample is batched.
		if tc.op == OpLaunch && r.OpsPerSample < 2 {
			t.Errorf("launch: %d ops per sample of %v each, want a batch", r.OpsPerSample, r.Median)
		}
		if tc.flops > 0 && r.TFLOPS() <= 0 || r.GBPerS() <= 0 {
			t.Errorf("%s: tflops %v gb/s %v", tc.op, r.TFLOPS(), r.GBPerS())
		}
	}
	if b.MemStats().Allocated != 0 {
		t.Errorf("measurements left %d bytes allocated", b.MemStats().Allocated)
	}
}

func TestMeasureOpGEMMTimeGrowsWithWork(t *testing.T) {
	b := cpu.New(cpu.Options{})
	defer b.Close()
	small, err := MeasureOp(context.Background(), b, fastReq(OpGEMM, tensor.F32, 16, 16, 16))
	if err != nil {
		t.Fatal(err)
	}
	big, err := MeasureOp(context.Background(), b, fastReq(OpGEMM, tensor.F32, 256, 256, 256))
	if err != nil {
		t.Fatal(err)
	}
	// 4096 times the arithmetic cannot take less time per op.
	if big.Median <= small.Median {
		t.Errorf("gemm 256^3 took %v, 16^3 %v", big.Median, small.Median)
	}
}

func TestMeasureOpInfoTimesNothing(t *testing.T) {
	b := cpu.New(cpu.Options{})
	defer b.Close()
	r, err := MeasureOp(context.Background(), b, OpRequest{Op: OpInfo})
	if err != nil || r.Device != "cpu" || len(r.Samples) != 0 {
		t.Fatalf("info: %+v, %v", r, err)
	}
}

// noFused is a backend without optional capabilities.
type noFused struct{ backend.Backend }

func (noFused) Optional() backend.Optional { return backend.Optional{} }

func TestMeasureOpRefusesBadRequests(t *testing.T) {
	b := cpu.New(cpu.Options{})
	defer b.Close()
	for _, tc := range []struct {
		name string
		r    OpRequest
		want error
	}{
		{"unknown op", OpRequest{Op: "conv"}, ErrBadOp},
		{"missing sizes", OpRequest{Op: OpGEMM, Sizes: []int64{4, 4}}, ErrBadOp},
		{"sizes for launch", OpRequest{Op: OpLaunch, Sizes: []int64{4}}, ErrBadOp},
		{"zero size", OpRequest{Op: OpCopy, Sizes: []int64{0}}, ErrBadOp},
		{"integer dtype", OpRequest{Op: OpCopy, Sizes: []int64{64}, DType: tensor.I32}, ErrBadOp},
		{"too large", OpRequest{Op: OpGEMM, Sizes: []int64{1 << 20, 1 << 20, 1 << 20}}, ErrBadOp},
	} {
		if _, err := MeasureOp(context.Background(), b, tc.r); !errors.Is(err, tc.want) {
			t.Errorf("%s: err %v, want %v", tc.name, err, tc.want)
		}
	}
	if _, err := MeasureOp(context.Background(), noFused{b}, fastReq(OpAddRMSNorm, tensor.F32, 2, 8)); !errors.Is(err, ErrNoFusedOp) {
		t.Errorf("fused op on a backend without it: %v", err)
	}
	if b.MemStats().Allocated != 0 {
		t.Errorf("refused measurements left %d bytes allocated", b.MemStats().Allocated)
	}
}

// hostTimer is a backend.DeviceTimer whose marks are host clock readings: the CPU backend's
// ops finish before they return, so its "device" times are the host's.
type hostTimer struct {
	marks []time.Time
	live  int
}

func (h *hostTimer) Mark() (backend.TimeMark, error) {
	h.marks = append(h.marks, time.Now())
	h.live++
	return backend.TimeMark(len(h.marks)), nil
}

func (h *hostTimer) Elapsed(from, to backend.TimeMark) (time.Duration, error) {
	return h.marks[to-1].Sub(h.marks[from-1]), nil
}

func (h *hostTimer) Release(marks ...backend.TimeMark) {
	for _, m := range marks {
		if m != 0 {
			h.live--
		}
	}
}

// timed is the CPU backend with a device timer, counting its copies.
type timed struct {
	*cpu.Backend
	t      *hostTimer
	copies int
}

func (b *timed) Optional() backend.Optional {
	o := b.Backend.Optional()
	o.Timer = b.t
	return o
}

func (b *timed) Copy(dst, src tensor.Tensor) error { b.copies++; return b.Backend.Copy(dst, src) }

func TestMeasureOpDeviceTimeAndProps(t *testing.T) {
	c := cpu.New(cpu.Options{Workers: 2})
	defer c.Close()
	plain, err := MeasureOp(context.Background(), c, fastReq(OpLaunch, tensor.F32))
	if err != nil {
		t.Fatal(err)
	}
	if plain.DeviceFastest != 0 {
		t.Errorf("a backend without a timer has no device time: %v", plain.DeviceFastest)
	}
	if plain.Props.Units != 2 {
		t.Errorf("Props.Units %d, want the backend's 2 workers", plain.Props.Units)
	}
	b := &timed{Backend: c, t: &hostTimer{}}
	r, err := MeasureOp(context.Background(), b, fastReq(OpLaunch, tensor.F32))
	if err != nil {
		t.Fatal(err)
	}
	if r.DeviceFastest <= 0 || r.DeviceFastest > 10*r.Median+time.Millisecond {
		t.Errorf("device time %v against a median of %v", r.DeviceFastest, r.Median)
	}
	// Every device sample is queued behind one busy copy, and its marks are handed back.
	if b.copies < 1 || b.copies > fastReq(OpLaunch, tensor.F32).Repeats {
		t.Errorf("%d busy copies for at most %d device samples", b.copies, fastReq(OpLaunch, tensor.F32).Repeats)
	}
	if b.t.live != 0 {
		t.Errorf("%d marks not released", b.t.live)
	}
	if c.MemStats().Allocated != 0 {
		t.Errorf("the device samples left %d bytes allocated", c.MemStats().Allocated)
	}
}
