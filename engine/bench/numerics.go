package bench

import (
	"context"
	"fmt"
	"math"
	"slices"
	"time"

	"github.com/halo-shell/halo-shell/engine/backend"
	"github.com/halo-shell/halo-shell/engine/optim"
	"github.com/halo-shell/halo-shell/engine/tensor"
)

// The numerics experiments: ops whose findings are values, not only a time.
const (
	// OpAdamWRounding trains N bf16 weights with AdamW and a constant gradient (RoundingRequest).
	OpAdamWRounding = "adamw_rounding"
	// OpRoPEAngles counts RoPE positions that merge at reduced precision (RoPERequest).
	OpRoPEAngles = "rope_angles"
)

// RoundingMode is how AdamW stores bf16 weights in OpAdamWRounding.
type RoundingMode int

const (
	// MasterF32 keeps an fp32 master copy and fp32 moments (optim.MasterF32), rounding the
	// master to the bf16 weights after each step.
	MasterF32 RoundingMode = iota
	// BF16Stochastic keeps bf16 weights and moments, stochastically rounded (optim.BF16).
	BF16Stochastic
	// BF16Nearest keeps bf16 weights and moments, rounded to nearest even (optim.BF16 with
	// Nearest), as torch.optim.AdamW does with bf16 parameters.
	BF16Nearest
)

func (m RoundingMode) String() string {
	switch m {
	case MasterF32:
		return "adamw (fp32 master)"
	case BF16Stochastic:
		return "adamw_bf16 (stochastic rounding)"
	case BF16Nearest:
		return "adamw_bf16_nearest (round to nearest)"
	}
	return fmt.Sprintf("RoundingMode(%d)", int(m))
}

// RoundingRequest is one OpAdamWRounding experiment: N bf16 weights, all W0, trained for
// Steps AdamW steps (no weight decay) with the gradient 1 on every element. With a constant
// gradient Adam's bias-corrected update is LR per step (m̂/√v̂ = 1), so after Steps steps
// every weight should have moved by -Steps·LR; how far it did shows what the rounding keeps.
type RoundingRequest struct {
	Mode      RoundingMode
	N, Steps  int
	LR, W0    float64
	MaxMemory int64 // 0: MaxOpBytes
}

// RoundingResult is what a rounding experiment found.
type RoundingResult struct {
	Device string
	Mode   RoundingMode
	N      int
	Steps  int
	LR, W0 float64
	// ULP is the spacing of bf16 numbers just below W0 (where the weights move).
	ULP float64
	// StaleFraction is the fraction of bf16 weights the first step left unchanged.
	StaleFraction float64
	// MeanChange is the mean over weights of w_Steps - W0 (bf16 weights read back);
	// ExpectedChange is -Steps·LR, what exact arithmetic gives.
	MeanChange, ExpectedChange float64
	// WeightBytes and GradBytes are the bf16 weights' and gradients' allocation; StateBytes
	// what the optimizer allocated (moments, and the master copy), all measured on the
	// device's allocator.
	WeightBytes, GradBytes, StateBytes int64
	// StepSeconds is the median time of one optimizer step over the N weights (each step
	// synchronised); StepBytes the least bytes one step reads and writes.
	StepSeconds float64
	StepBytes   float64
	// StepDeviceSeconds is the median time of one step on the device, between device marks
	// around it (0 on backends without a device timer): the step's kernels without the host's
	// cost of issuing them and of waiting for the device.
	StepDeviceSeconds float64
}

// maxRoundingSteps bounds the steps of one experiment.
const maxRoundingSteps = 100000

// MeasureRounding runs a RoundingRequest on b, from the goroutine that owns b, and frees what
// it allocated.
func MeasureRounding(ctx context.Context, b backend.Backend, r RoundingRequest) (RoundingResult, error) {
	if r.N <= 0 || r.N > 1<<30 {
		return RoundingResult{}, badOp("adamw_rounding: N = %d weights: want 1 .. 2^30", r.N)
	}
	if r.Steps <= 0 || r.Steps > maxRoundingSteps {
		return RoundingResult{}, badOp("adamw_rounding: steps = %d: want 1 .. %d", r.Steps, maxRoundingSteps)
	}
	if !(r.LR > 0) || math.IsInf(r.LR, 0) {
		return RoundingResult{}, badOp("adamw_rounding: learning rate %v: want a finite number > 0", r.LR)
	}
	if math.IsNaN(r.W0) || math.Abs(r.W0) > 1e30 || r.W0 == 0 {
		return RoundingResult{}, badOp("adamw_rounding: w0 %v: want a finite, non-zero starting weight", r.W0)
	}
	var cfg optim.Config
	switch r.Mode {
	case MasterF32:
		cfg.Mode = optim.MasterF32
	case BF16Stochastic:
		cfg.Mode = optim.BF16
	case BF16Nearest:
		cfg.Mode, cfg.Nearest = optim.BF16, true
	default:
		return RoundingResult{}, badOp("adamw_rounding: mode %d: want 0 (adamw, fp32 master), 1 (adamw_bf16, stochastic) or 2 (adamw_bf16_nearest)", int(r.Mode))
	}
	limit := r.MaxMemory
	if limit <= 0 {
		limit = MaxOpBytes
	}
	if total := b.MemStats().Total; total > 0 {
		limit = min(limit, total/2)
	}
	if need := int64(r.N) * 16; need > limit {
		return RoundingResult{}, badOp("adamw_rounding: %d weights need %s with their optimizer state, more than this measurement may take on %s (%s)",
			r.N, humanBytes(need), b.Name(), humanBytes(limit))
	}
	o := &opRun{b: b, dt: tensor.BF16}
	defer o.free()
	w, err := o.tensor(OpAdamWRounding, tensor.BF16, float32(r.W0), r.N)
	if err != nil {
		return RoundingResult{}, err
	}
	g, err := o.tensor(OpAdamWRounding, tensor.BF16, 1, r.N)
	if err != nil {
		return RoundingResult{}, err
	}
	w0 := tensor.BF16ToF32(tensor.F32ToBF16(float32(r.W0)))
	res := RoundingResult{Device: b.Name(), Mode: r.Mode, N: r.N, Steps: r.Steps, LR: r.LR, W0: float64(w0),
		ExpectedChange: -float64(r.Steps) * r.LR, WeightBytes: w.Bytes(), GradBytes: g.Bytes()}
	below := math.Float32frombits(math.Float32bits(w0) - 1<<16) // the next bf16 towards zero
	if w0 < 0 {
		below = math.Float32frombits(math.Float32bits(w0) + 1<<16)
	}
	res.ULP = math.Abs(float64(w0) - float64(below))

	before := b.MemStats().Allocated
	opt, err := optim.NewAdamW(b, []optim.Param{{Name: "w", Value: w, Grad: g}}, cfg)
	if err != nil {
		return RoundingResult{}, fmt.Errorf("bench: adamw_rounding: %w", err)
	}
	defer opt.Free()
	res.StateBytes = b.MemStats().Allocated - before
	// Bytes one step moves: read the gradient; read and write each moment; the weights
	// (read and write), or the fp32 master (read and write) and the bf16 copy (write).
	n := float64(r.N)
	if r.Mode == MasterF32 {
		res.StepBytes = n * (2 + 8 + 8 + 8 + 2)
	} else {
		res.StepBytes = n * (2 + 4 + 4 + 4)
	}
	var times, devTimes []time.Duration
	host := make([]byte, w.Bytes())
	timer := b.Optional().Timer
	release := func(marks ...backend.TimeMark) {
		if timer != nil {
			timer.Release(marks...)
		}
	}
	for s := 1; s <= r.Steps; s++ {
		if err := ctx.Err(); err != nil {
			return RoundingResult{}, fmt.Errorf("bench: adamw_rounding: %w", err)
		}
		start := time.Now()
		var from, to backend.TimeMark
		if timer != nil {
			if from, err = timer.Mark(); err != nil {
				return RoundingResult{}, fmt.Errorf("bench: adamw_rounding: %w", err)
			}
		}
		if err := opt.Step(r.LR, 1); err != nil {
			release(from)
			return RoundingResult{}, fmt.Errorf("bench: adamw_rounding: %w", err)
		}
		if timer != nil {
			if to, err = timer.Mark(); err != nil {
				release(from)
				return RoundingResult{}, fmt.Errorf("bench: adamw_rounding: %w", err)
			}
		}
		if err := b.Sync(); err != nil {
			release(from, to)
			return RoundingResult{}, fmt.Errorf("bench: adamw_rounding: %w", err)
		}
		times = append(times, time.Since(start))
		if timer != nil {
			d, err := timer.Elapsed(from, to)
			release(from, to)
			if err != nil {
				return RoundingResult{}, fmt.Errorf("bench: adamw_rounding: %w", err)
			}
			devTimes = append(devTimes, d)
		}
		if s == 1 {
			if err := b.Download(host, w); err != nil {
				return RoundingResult{}, fmt.Errorf("bench: adamw_rounding: %w", err)
			}
			vals, err := tensor.DecodeFloat32(tensor.BF16, host)
			if err != nil {
				return RoundingResult{}, err
			}
			same := 0
			for _, v := range vals {
				if v == w0 {
					same++
				}
			}
			res.StaleFraction = float64(same) / n
		}
	}
	if err := b.Download(host, w); err != nil {
		return RoundingResult{}, fmt.Errorf("bench: adamw_rounding: %w", err)
	}
	vals, err := tensor.DecodeFloat32(tensor.BF16, host)
	if err != nil {
		return RoundingResult{}, err
	}
	var sum float64
	for _, v := range vals {
		sum += float64(v) - float64(w0)
	}
	res.MeanChange = sum / n
	slices.Sort(times)
	res.StepSeconds = times[len(times)/2].Seconds()
	if len(devTimes) > 0 {
		slices.Sort(devTimes)
		res.StepDeviceSeconds = devTimes[len(devTimes)/2].Seconds()
	}
	return res, nil
}

// RoPEPrecision is the arithmetic of the angle table in OpRoPEAngles.
type RoPEPrecision string

const (
	RoPEF32  RoPEPrecision = "f32"  // positions and frequencies in fp32
	RoPEBF16 RoPEPrecision = "bf16" // both rounded to bf16 (8 significant bits)
	// RoPETF32 rounds both to TF32 (11 significant bits: round to nearest, ties away from
	// zero, as the tensor cores round fp32 inputs with TF32 allowed) and multiplies in fp32.
	RoPETF32 RoPEPrecision = "tf32"
)

// RoPERequest is one OpRoPEAngles experiment over positions 0 .. T-1 of one head whose R
// dims are rotated (R even), with rope_theta Theta (0: 10000).
type RoPERequest struct {
	T, R      int
	Theta     float64
	Precision RoPEPrecision
}

// RoPEResult is what a RoPE experiment found. A position merges when every angle of it equals
// the angle of the position before: the model cannot tell the two apart.
type RoPEResult struct {
	Device    string
	T, R      int
	Precision RoPEPrecision
	// TableMerged counts the positions of the angle table pos·inv_freq, computed as the
	// Hugging Face rotary embedding does (an outer product through a GEMM on the device, its
	// inputs rounded to Precision), that merge with the previous one; TableFirstMerged is the
	// first such position (-1: none).
	TableMerged, TableFirstMerged int
	// EngineMerged and EngineFirstMerged count the same for the engine's own RoPE op
	// (backend RoPE on a row of ones, integer positions, fp32 angles).
	EngineMerged, EngineFirstMerged int
}

// maxRoPEPositions bounds T.
const maxRoPEPositions = 1 << 20

// MeasureRoPE runs a RoPERequest on b, from the goroutine that owns b.
func MeasureRoPE(ctx context.Context, b backend.Backend, r RoPERequest) (RoPEResult, error) {
	if r.T < 2 || r.T > maxRoPEPositions {
		return RoPEResult{}, badOp("rope_angles: T = %d positions: want 2 .. %d", r.T, maxRoPEPositions)
	}
	if r.R < 2 || r.R%2 != 0 || r.R > 512 {
		return RoPEResult{}, badOp("rope_angles: R = %d rotated dims: want an even number 2 .. 512", r.R)
	}
	if r.Theta == 0 {
		r.Theta = 10000
	}
	switch r.Precision {
	case "":
		r.Precision = RoPEF32
	case RoPEF32, RoPEBF16, RoPETF32:
	default:
		return RoPEResult{}, badOp("rope_angles: precision %q: want f32, bf16 or tf32", r.Precision)
	}
	inv, _, err := backend.RoPEConfig{Theta: r.Theta, HeadDim: r.R, MaxPositionEmbeddings: r.T}.Compute(r.T)
	if err != nil {
		return RoPEResult{}, badOp("rope_angles: %v", err)
	}
	res := RoPEResult{Device: b.Name(), T: r.T, R: r.R, Precision: r.Precision}
	o := &opRun{b: b, dt: tensor.F32}
	defer o.free()
	half := r.R / 2

	// The table: C[T, R/2] = pos[T, K] @ inv_freq[K, R/2], an outer product padded with zeros
	// to K = 8 (column 0 of pos and row 0 of inv_freq hold the values), so that the GEMM meets
	// every backend's alignment rules; the zeros add nothing.
	const k = 8
	pos := make([]float32, r.T*k)
	for i := range r.T {
		pos[i*k] = float32(i)
	}
	freq := make([]float32, k*half)
	copy(freq, inv)
	dt := tensor.F32
	switch r.Precision {
	case RoPEBF16:
		dt = tensor.BF16
	case RoPETF32:
		for i := range pos {
			pos[i] = RoundTF32(pos[i])
		}
		for i := range freq {
			freq[i] = RoundTF32(freq[i])
		}
	}
	a, err := o.tensor(OpRoPEAngles, dt, 0, r.T, k)
	if err != nil {
		return RoPEResult{}, err
	}
	f, err := o.tensor(OpRoPEAngles, dt, 0, k, half)
	if err != nil {
		return RoPEResult{}, err
	}
	c, err := o.tensor(OpRoPEAngles, tensor.F32, 0, r.T, half)
	if err != nil {
		return RoPEResult{}, err
	}
	for _, u := range []struct {
		t tensor.Tensor
		v []float32
	}{{a, pos}, {f, freq}} {
		data, err := tensor.EncodeFloat32(dt, u.v)
		if err != nil {
			return RoPEResult{}, err
		}
		if err := b.Upload(u.t, data); err != nil {
			return RoPEResult{}, fmt.Errorf("bench: rope_angles: %w", err)
		}
	}
	if err := b.GEMM(backend.GEMMArgs{A: a, B: f, C: c, Alpha: 1}); err != nil {
		return RoPEResult{}, fmt.Errorf("bench: rope_angles: the angle table: %w", err)
	}
	res.TableMerged, res.TableFirstMerged, err = mergedRows(b, c, r.T, half)
	if err != nil {
		return RoPEResult{}, err
	}
	if err := ctx.Err(); err != nil {
		return RoPEResult{}, fmt.Errorf("bench: rope_angles: %w", err)
	}

	// The engine's RoPE on ones: rows differ exactly when some angle differs.
	x, err := o.tensor(OpRoPEAngles, tensor.F32, 1, r.T, r.R)
	if err != nil {
		return RoPEResult{}, err
	}
	out, err := o.tensor(OpRoPEAngles, tensor.F32, 0, r.T, r.R)
	if err != nil {
		return RoPEResult{}, err
	}
	ip, err := o.tensor(OpRoPEAngles, tensor.I32, 0, r.T)
	if err != nil {
		return RoPEResult{}, err
	}
	ids := make([]int32, r.T)
	for i := range ids {
		ids[i] = int32(i)
	}
	if err := b.Upload(ip, tensor.EncodeInt32(ids)); err != nil {
		return RoPEResult{}, fmt.Errorf("bench: rope_angles: %w", err)
	}
	it, err := o.tensor(OpRoPEAngles, tensor.F32, 0, half)
	if err != nil {
		return RoPEResult{}, err
	}
	data, _ := tensor.EncodeFloat32(tensor.F32, inv)
	if err := b.Upload(it, data); err != nil {
		return RoPEResult{}, fmt.Errorf("bench: rope_angles: %w", err)
	}
	if err := b.RoPE(out, x, backend.RoPEArgs{Positions: ip, InvFreq: it, Heads: 1, HeadDim: r.R}); err != nil {
		return RoPEResult{}, fmt.Errorf("bench: rope_angles: the engine's RoPE: %w", err)
	}
	res.EngineMerged, res.EngineFirstMerged, err = mergedRows(b, out, r.T, r.R)
	return res, err
}

// mergedRows downloads the F32 matrix t [rows, cols] and counts the rows equal to the row
// before, and the first of them (-1: none).
func mergedRows(b backend.Backend, t tensor.Tensor, rows, cols int) (int, int, error) {
	host := make([]byte, t.Bytes())
	if err := b.Download(host, t); err != nil {
		return 0, 0, fmt.Errorf("bench: rope_angles: %w", err)
	}
	v, err := tensor.DecodeFloat32(tensor.F32, host)
	if err != nil {
		return 0, 0, err
	}
	merged, first := 0, -1
	for p := 1; p < rows; p++ {
		if slices.Equal(v[p*cols:(p+1)*cols], v[(p-1)*cols:p*cols]) {
			merged++
			if first < 0 {
				first = p
			}
		}
	}
	return merged, first, nil
}

// RoundTF32 rounds f to TF32 (10 explicit mantissa bits), to nearest with ties away from zero;
// NaN and Inf pass through.
func RoundTF32(f float32) float32 {
	u := math.Float32bits(f)
	if u&0x7f800000 == 0x7f800000 {
		return f
	}
	u += 1 << 12 // half of the 13 dropped bits: ties round away from zero
	return math.Float32frombits(u &^ (1<<13 - 1))
}
