package bench

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/halo-shell/halo-shell/engine/backend"
	"github.com/halo-shell/halo-shell/engine/backend/cpu"
	"github.com/halo-shell/halo-shell/engine/backend/cuda"
)

// TestNumericsOnGPUMatchCPU runs the rounding and RoPE experiments on a GPU and on the CPU
// oracle: the CUDA AdamW uses the same stochastic-rounding stream, so the stale fractions and
// mean changes agree, and the bf16 and TF32 angle tables merge the same positions. With two GPUs
// it also times an all-reduce through NCCL. It skips without a CUDA GPU.
func TestNumericsOnGPUMatchCPU(t *testing.T) {
	if err := cuda.Available(); err != nil {
		t.Skipf("needs a CUDA GPU: %v", strings.SplitN(err.Error(), "\n", 2)[0])
	}
	g, err := backend.Open("cuda")
	if err != nil {
		t.Fatal(err)
	}
	defer g.Close()
	c := cpu.New(cpu.Options{})
	defer c.Close()
	ctx := context.Background()
	for _, mode := range []RoundingMode{MasterF32, BF16Stochastic, BF16Nearest} {
		req := RoundingRequest{Mode: mode, N: 1 << 16, Steps: 50, LR: 1e-4, W0: 1}
		rg, err := MeasureRounding(ctx, g, req)
		if err != nil {
			t.Fatalf("%s on the GPU: %v", mode, err)
		}
		rc, err := MeasureRounding(ctx, c, req)
		if err != nil {
			t.Fatal(err)
		}
		if rg.StateBytes != rc.StateBytes || abs(rg.StaleFraction-rc.StaleFraction) > 0.005 || abs(rg.MeanChange-rc.MeanChange) > 0.02*abs(rc.ExpectedChange) {
			t.Errorf("%s: GPU state %d B, stale %.4f, change %.5g; CPU %d B, %.4f, %.5g", mode, rg.StateBytes, rg.StaleFraction, rg.MeanChange,
				rc.StateBytes, rc.StaleFraction, rc.MeanChange)
		}
	}
	for _, p := range []RoPEPrecision{RoPEF32, RoPEBF16, RoPETF32} {
		req := RoPERequest{T: 4096, R: 128, Precision: p}
		rg, err := MeasureRoPE(ctx, g, req)
		if err != nil {
			t.Fatalf("%s on the GPU: %v", p, err)
		}
		rc, err := MeasureRoPE(ctx, c, req)
		if err != nil {
			t.Fatal(err)
		}
		if rg.TableMerged != rc.TableMerged || rg.TableFirstMerged != rc.TableFirstMerged || rg.EngineMerged != 0 {
			t.Errorf("%s: GPU table merged %d from %d, engine %d; CPU %d from %d", p, rg.TableMerged, rg.TableFirstMerged, rg.EngineMerged,
				rc.TableMerged, rc.TableFirstMerged)
		}
	}
	if cuda.DeviceCount() < 2 {
		t.Logf("one GPU: no NCCL all-reduce to time")
		return
	}
	r, err := MeasureCollective(ctx, CollectiveRequest{Op: OpAllReduce, Bytes: 64 << 20, Ranks: 2, Device: "cuda",
		Repeats: 3, MinSample: time.Millisecond, MaxTotal: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("all_reduce of 64 MiB over %s: %v, bus bandwidth %.1f GB/s", r.Devices, r.Median, r.BusGBps())
	if r.Median <= 0 || r.Devices != "cuda:0-1" {
		t.Errorf("%+v", r)
	}
}

func abs(x float64) float64 {
	if x < 0 {
		return -x
	}
	return x
}
