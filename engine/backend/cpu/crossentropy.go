package cpu

import (
	"fmt"
	"math"

	"github.com/halo-shell/halo-shell/engine/backend"
)

// ceLogitBudget bounds the fp32 logits held at once (elements): chunk rows = budget / V
// (128 MiB; about 220 tokens for a 152k vocabulary). Each chunk re-packs the LM head for the
// GEMM, so chunks must be large enough for that to be cheap next to the matmuls.
const ceLogitBudget = 1 << 25

// CrossEntropy is the fused LM head + cross-entropy; see backend.Ops. Logits exist for at most
// ChunkRows tokens at a time.
func (b *Backend) CrossEntropy(a backend.CrossEntropyArgs) error {
	const op = "cross-entropy"
	if a.Weight.IsNil() || a.Weight.Rank() != 2 {
		return fmt.Errorf("cpu: %s: Weight %v must be 2-D [V, C]", op, a.Weight)
	}
	v, c := a.Weight.Dim(0), a.Weight.Dim(1)
	tg, err := ints(op, "Targets", a.Targets)
	if err != nil {
		return err
	}
	n := len(tg)
	if err := numel(op, "Hidden", a.Hidden, n*c, "numel(Targets)*C"); err != nil {
		return err
	}
	for i, t := range tg {
		if t != backend.IgnoreIndex && (t < 0 || int(t) >= v) {
			return fmt.Errorf("cpu: %s: Targets[%d] = %d is outside the vocabulary [0, %d) and is not the ignore index %d",
				op, i, t, v, backend.IgnoreIndex)
		}
	}
	if a.Softcap < 0 || math.IsNaN(float64(a.Softcap)) || math.IsInf(float64(a.Softcap), 0) {
		return fmt.Errorf("cpu: %s: Softcap %v must be a positive cap or 0 for none", op, a.Softcap)
	}
	var loss, logp []float32
	if !a.Loss.IsNil() {
		if err := numel(op, "Loss", a.Loss, n, "N"); err != nil {
			return err
		}
		if loss, err = f32only(op, "Loss", a.Loss); err != nil {
			return err
		}
	}
	if !a.LogProb.IsNil() {
		if err := numel(op, "LogProb", a.LogProb, n, "N"); err != nil {
			return err
		}
		if logp, err = f32only(op, "LogProb", a.LogProb); err != nil {
			return err
		}
	}
	var tscale []float32
	if !a.TokenScale.IsNil() {
		if err := numel(op, "TokenScale", a.TokenScale, n, "N"); err != nil {
			return err
		}
		if tscale, err = f32only(op, "TokenScale", a.TokenScale); err != nil {
			return err
		}
	}
	hs, err := b.in(op, "Hidden", a.Hidden)
	if err != nil {
		return err
	}
	ws, err := b.in(op, "Weight", a.Weight)
	if err != nil {
		return err
	}
	var dh, dw []float32
	flushH, flushW := func() {}, func() {}
	if !a.DHidden.IsNil() {
		if err := numel(op, "DHidden", a.DHidden, n*c, "N*C"); err != nil {
			return err
		}
		if err := overlapErr(op, "DHidden", a.DHidden, "Hidden", a.Hidden); err != nil {
			return err
		}
		if dh, flushH, err = b.out(op, "DHidden", a.DHidden, false); err != nil {
			return err
		}
	}
	if !a.DWeight.IsNil() {
		if err := numel(op, "DWeight", a.DWeight, v*c, "V*C"); err != nil {
			return err
		}
		if dw, flushW, err = b.out(op, "DWeight", a.DWeight, true); err != nil {
			return err
		}
	}
	chunk := a.ChunkRows
	if chunk <= 0 {
		chunk = max(1, ceLogitBudget/max(v, 1))
	}
	chunk = min(chunk, max(n, 1))
	lb := getScratch(chunk * v)
	defer putScratch(lb)
	logits := *lb
	for lo := 0; lo < n; lo += chunk {
		hi := min(lo+chunk, n)
		m := hi - lo
		lg := logits[:m*v]
		b.sgemm(false, true, m, v, c, 1, hs[lo*c:hi*c], c, ws, c, 0, lg, v)
		b.pool.rows(m, 4, func(rlo, rhi int) {
			var capBuf *[]float32
			if a.Softcap > 0 {
				capBuf = getScratch(v)
				defer putScratch(capBuf)
			}
			for r := rlo; r < rhi; r++ {
				row := lg[r*v : (r+1)*v]
				t := tg[lo+r]
				if t == backend.IgnoreIndex {
					if loss != nil {
						loss[lo+r] = 0
					}
					if logp != nil {
						logp[lo+r] = 0
					}
					if dh != nil || dw != nil {
						clear(row)
					}
					continue
				}
				// The cap's derivative 1 - tanh^2 per logit, kept for the backward.
				var capD []float32
				if a.Softcap > 0 {
					capD = *capBuf
					softcapRow(row, capD, a.Softcap)
				}
				mx := float32(math.Inf(-1))
				for _, x := range row {
					mx = max(mx, x)
				}
				xt := row[t]
				for j := range row {
					row[j] -= mx
				}
				expVec(row, row)
				var s float64
				for _, e := range row {
					s += float64(e)
				}
				lse := float64(mx) + math.Log(s)
				lp := float32(float64(xt) - lse)
				if loss != nil {
					loss[lo+r] = -lp
				}
				if logp != nil {
					logp[lo+r] = lp
				}
				if dh != nil || dw != nil {
					g := a.GradScale
					if tscale != nil {
						g *= tscale[lo+r]
					}
					k := g / float32(s)
					for j := range row {
						row[j] *= k
					}
					row[t] -= g
					for j, d := range capD {
						row[j] *= d
					}
				}
			}
		})
		if dh != nil {
			b.sgemm(false, false, m, c, v, 1, lg, v, ws, c, 0, dh[lo*c:hi*c], c)
		}
		if dw != nil {
			b.sgemm(true, false, v, c, m, 1, lg, v, hs[lo*c:hi*c], c, 1, dw, c)
		}
	}
	flushH()
	flushW()
	return nil
}

// softcapRow caps one row of logits in place, x = c * tanh(x / c) (in float64, rounded once),
// and writes d[j] = 1 - tanh^2, the derivative of the cap at each logit.
func softcapRow(row, d []float32, c float32) {
	cf := float64(c)
	for j, x := range row {
		t := math.Tanh(float64(x) / cf)
		row[j] = float32(cf * t)
		d[j] = float32(1 - t*t)
	}
}
