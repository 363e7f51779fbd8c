package cuda

import (
	"strings"
	"testing"

	"github.com/halo-shell/halo-shell/engine/backend"
	"github.com/halo-shell/halo-shell/engine/tensor"
)

// fakeBackend is a Backend over a device goroutine with no CUDA behind it: argument checking runs
// as usual, and anything that reaches the driver fails (the device goroutine turns the nil driver
// call's panic into an error). It lets the checks be tested on machines without a GPU.
func fakeBackend(t *testing.T) *Backend {
	t.Helper()
	d := &Device{
		info:    DeviceInfo{Ordinal: 0, SMs: 1, MaxSharedPerBlock: 48 << 10},
		drv:     &driverAPI{},
		libs:    &libraries{},
		modules: map[string]*module{},
		alloc:   newCachingAllocator(&fakeMemory{}),
	}
	d.q = newCmdQueue("device 0", func() bool { return d.closed })
	go func() {
		defer close(d.q.done)
		for f := range d.q.cmds {
			f()
		}
	}()
	t.Cleanup(func() { close(d.q.cmds) })
	o := defaultBackendOptions("sm_80")
	return &Backend{d: d, backendOptions: o}
}

var fakeAddr uintptr = 1 << 40

// ft makes a tensor on b's (fake) device.
func ft(b *Backend, dt tensor.DType, shape ...int) tensor.Tensor {
	n := uint64(tensor.Shape(shape).Numel() * dt.Size())
	fakeAddr += 1 << 30
	t, err := tensor.New(&Buffer{dev: b.d, ptr: fakeAddr, bytes: max(n, 1)}, 0, dt, shape...)
	if err != nil {
		panic(err)
	}
	return t
}

func TestOpsRejectBadArguments(t *testing.T) {
	b := fakeBackend(t)
	other := fakeBackend(t)
	bf, f32, i32 := tensor.BF16, tensor.F32, tensor.I32
	x := ft(b, bf, 8, 16)
	view, _ := x.Rows(2, 4)
	tests := []struct {
		name string
		call func() error
		want string
	}{
		{"free a view", func() error { return b.Free(view) }, "a view"},
		{"free another device's tensor", func() error { return b.Free(ft(other, bf, 4)) }, "not a tensor of"},
		{"upload wrong size", func() error { return b.Upload(x, make([]byte, 3)) }, "3 bytes"},
		{"tensor of another device", func() error { return b.Add(x, x, ft(other, bf, 8, 16)) }, "is not on"},
		{"add size mismatch", func() error { return b.Add(x, x, ft(b, bf, 8)) }, "element count"},
		{"f16 unsupported", func() error { return b.Scale(ft(b, tensor.F16, 4), 2) }, "dtype f16 is not supported"},
		{"embedding weight rank", func() error { return b.Embedding(x, ft(b, bf, 16), ft(b, i32, 8)) }, "must be [V, C]"},
		{"embedding ids dtype", func() error { return b.Embedding(x, ft(b, bf, 100, 16), ft(b, f32, 8)) }, "must be i32"},
		{"embedding out shape", func() error { return b.Embedding(x, ft(b, bf, 100, 16), ft(b, i32, 7)) }, "must hold [7, 16]"},
		{"gemm shapes", func() error {
			return b.GEMM(backend.GEMMArgs{A: ft(b, bf, 4, 8), B: ft(b, bf, 7, 3), C: ft(b, f32, 4, 3), Alpha: 1})
		}, "do not chain"},
		{"gemm mixed dtypes", func() error {
			return b.GEMM(backend.GEMMArgs{A: ft(b, bf, 4, 8), B: ft(b, f32, 8, 3), C: ft(b, f32, 4, 3), Alpha: 1})
		}, "same dtype"},
		{"gemm rank", func() error {
			return b.GEMM(backend.GEMMArgs{A: ft(b, bf, 4, 8, 1), B: ft(b, bf, 8, 3), C: ft(b, f32, 4, 3), Alpha: 1})
		}, "must be 2-D"},
		{"linear x width", func() error { return b.Linear(ft(b, bf, 8, 4), x, ft(b, bf, 4, 15), T{}) }, "must end in I=15"},
		{"linear bias size", func() error { return b.Linear(ft(b, bf, 8, 4), x, ft(b, bf, 4, 16), ft(b, bf, 5)) }, "bias"},
		{"rmsnorm rstd dtype", func() error { return b.RMSNorm(x, ft(b, bf, 8), x, ft(b, bf, 16), 1e-6) }, "must be f32 [8]"},
		{"rmsnorm dx aliases dy", func() error {
			return b.RMSNormBackward(backend.RMSNormBackwardArgs{DX: x, DY: x, X: ft(b, bf, 8, 16), W: ft(b, bf, 16), RStd: ft(b, f32, 8)})
		}, "may not alias"},
		{"rope odd rotary dim", func() error {
			return b.RoPE(x, x, backend.RoPEArgs{Positions: ft(b, i32, 8), InvFreq: ft(b, f32, 8), Heads: 1, HeadDim: 16, RotaryDim: 7})
		}, "even rotary dim"},
		{"rope positions", func() error {
			return b.RoPE(x, x, backend.RoPEArgs{Positions: ft(b, i32, 9), InvFreq: ft(b, f32, 8), Heads: 1, HeadDim: 16})
		}, "positions"},
		{"swiglu sizes", func() error { return b.SwiGLU(x, x, ft(b, bf, 3)) }, "element count"},
		{"attention heads", func() error {
			return b.Attention(backend.AttentionArgs{AttentionShape: backend.AttentionShape{CuSeqlens: ft(b, i32, 2), NH: 3, NKV: 2, HD: 16}, Out: x, Q: x, K: x, V: x})
		}, "multiple of NKV"},
		{"attention head dim", func() error {
			return b.Attention(backend.AttentionArgs{AttentionShape: backend.AttentionShape{CuSeqlens: ft(b, i32, 2), NH: 1, NKV: 1, HD: 520}, Out: x, Q: x, K: x, V: x})
		}, "head dim 520 is above the attention kernels' limit of 512"},
		{"attention backward head dim", func() error {
			return b.AttentionBackward(backend.AttentionBackwardArgs{AttentionShape: backend.AttentionShape{CuSeqlens: ft(b, i32, 2), NH: 1, NKV: 1, HD: 1024},
				DQ: x, DK: x, DV: x, DOut: x, Q: x, K: x, V: x, Out: x, LSE: ft(b, f32, 8)})
		}, "head dim 1024 is above the attention kernels' limit of 512"},
		{"attention head dim 512 is taken", func() error {
			// Past the head-dim check, Q's width is what is wrong.
			return b.Attention(backend.AttentionArgs{AttentionShape: backend.AttentionShape{CuSeqlens: ft(b, i32, 2), NH: 1, NKV: 1, HD: 512}, Out: x, Q: x, K: x, V: x})
		}, "must be [N, 1*512]"},
		{"attention cu_seqlens dtype", func() error {
			return b.Attention(backend.AttentionArgs{AttentionShape: backend.AttentionShape{CuSeqlens: ft(b, f32, 2), NH: 1, NKV: 1, HD: 16}, Out: x, Q: x, K: x, V: x})
		}, "must be i32 [D+1]"},
		{"attention key rows", func() error {
			k := ft(b, bf, 4, 16)
			return b.Attention(backend.AttentionArgs{AttentionShape: backend.AttentionShape{CuSeqlens: ft(b, i32, 2), NH: 1, NKV: 1, HD: 16}, Out: x, Q: x, K: k, V: k})
		}, "set CuSeqlensK"},
		{"cross-entropy targets", func() error {
			return b.CrossEntropy(backend.CrossEntropyArgs{Hidden: x, Weight: ft(b, bf, 32, 16), Targets: ft(b, i32, 7)})
		}, "N=8"},
		{"cross-entropy loss dtype", func() error {
			return b.CrossEntropy(backend.CrossEntropyArgs{Hidden: x, Weight: ft(b, bf, 32, 16), Targets: ft(b, i32, 8), Loss: ft(b, bf, 8)})
		}, "must be f32 [8]"},
		{"adamw step", func() error {
			p := ft(b, f32, 4)
			return b.AdamW(backend.AdamWArgs{Param: p, Grad: ft(b, f32, 4), M: ft(b, f32, 4), V: ft(b, f32, 4), Step: 0})
		}, "step 0"},
		{"adamw sizes", func() error {
			p := ft(b, f32, 4)
			return b.AdamW(backend.AdamWArgs{Param: p, Grad: ft(b, f32, 5), M: ft(b, f32, 4), V: ft(b, f32, 4), Step: 1})
		}, "grad"},
		{"missing tensor", func() error { return b.Scale(T{}, 1) }, "is required"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.call()
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("got %v, want an error containing %q", err, tc.want)
			}
			if err != nil && strings.Contains(err.Error(), "panic") {
				t.Errorf("argument error surfaced as a panic: %v", err)
			}
		})
	}
}

// TestDeviceThreadTurnsPanicsIntoErrors checks that a failure on the device goroutine is an error
// for the caller and the goroutine keeps serving.
func TestDeviceThreadTurnsPanicsIntoErrors(t *testing.T) {
	b := fakeBackend(t)
	err := b.d.Do(func() error { panic("boom") })
	if err == nil || !strings.Contains(err.Error(), "boom") {
		t.Fatalf("Do(panic) = %v, want an error carrying the panic", err)
	}
	if err := b.d.Do(func() error { return nil }); err != nil {
		t.Fatalf("device goroutine stopped serving after a panic: %v", err)
	}
}
