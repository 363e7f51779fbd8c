package cpu

import (
	"fmt"
	"math"

	"github.com/halo-shell/halo-shell/engine/backend"
)

// DeepSeek-V4's window pooling (the compressors) and the lightning indexer's scores:
// backend.DSV4Ops.WindowPool, WindowPoolBackward and IndexScores (engine/backend/dsv4.go states
// the contract; nn.HostTape.WindowPool and DSV4.index are the arithmetic). The CPU backend is
// the reference the device kernels are tested against, so each output sums in float64 and is
// rounded once.

func init() {
	dsv4Fills = append(dsv4Fills, func(b *Backend, o *backend.DSV4Ops) {
		o.WindowPool = b.WindowPool
		o.WindowPoolBackward = b.WindowPoolBackward
		o.IndexScores = b.IndexScores
	})
}

// poolCells is the number of (window, channel) cells per parallel chunk.
const poolCells = 256

// poolSlots lists the elements of KV and Gate ([N,W] row-major) that cell (w, d) pools, in
// slot order, into el, and the APE element ([Rate,W]) of each into ape; it returns the count.
// Without overlap the slots are the window's own rows at column d; with overlap, column d of
// the previous window's rows (none for window 0), then column D+d of its own. A slot's APE
// entry is row (row % Rate) at the slot's column.
func poolSlots(w, d, m, W, D int, overlap bool, el, ape []int) int {
	k := 0
	add := func(row, col int) {
		el[k], ape[k] = row*W+col, (row%m)*W+col
		k++
	}
	if !overlap {
		for i := 0; i < m; i++ {
			add(w*m+i, d)
		}
		return k
	}
	if w > 0 {
		for i := 0; i < m; i++ {
			add((w-1)*m+i, d)
		}
	}
	for i := 0; i < m; i++ {
		add(w*m+i, D+d)
	}
	return k
}

// poolSoftmax writes into p the softmax over the k slots of gate + ape and returns the pooled
// value Σ p·kv.
func poolSoftmax(kv, gate, ape []float32, el, ae []int, k int, p []float64) float64 {
	mx := math.Inf(-1)
	for j := 0; j < k; j++ {
		p[j] = float64(gate[el[j]]) + float64(ape[ae[j]])
		mx = math.Max(mx, p[j])
	}
	var sum float64
	for j := 0; j < k; j++ {
		p[j] = math.Exp(p[j] - mx)
		sum += p[j]
	}
	var v float64
	for j := 0; j < k; j++ {
		p[j] /= sum
		v += p[j] * float64(kv[el[j]])
	}
	return v
}

// poolInputs reads KV, Gate and APE as float32.
func (b *Backend) poolInputs(op string, a backend.WindowPoolArgs) (kv, gate, ape []float32, err error) {
	if kv, err = b.in(op, "KV", a.KV); err != nil {
		return
	}
	if gate, err = b.in(op, "Gate", a.Gate); err != nil {
		return
	}
	ape, err = b.in(op, "APE", a.APE)
	return
}

// WindowPool implements backend.DSV4Ops.WindowPool: windows are shared out to the workers,
// each cell's softmax taken in float64.
func (b *Backend) WindowPool(a backend.WindowPoolArgs) error {
	const op = "window-pool"
	d, err := a.Validate()
	if err != nil {
		return fmt.Errorf("cpu: %w", err)
	}
	kv, gate, ape, err := b.poolInputs(op, a)
	if err != nil {
		return err
	}
	out, flush, err := b.out(op, "Out", a.Out, false)
	if err != nil {
		return err
	}
	m, W, D := a.Rate, d.W, d.D
	b.pool.rows(d.Windows*D, poolCells, func(lo, hi int) {
		el, ae, p := make([]int, 2*m), make([]int, 2*m), make([]float64, 2*m)
		for c := lo; c < hi; c++ {
			k := poolSlots(c/D, c%D, m, W, D, a.Overlap, el, ae)
			out[c] = float32(poolSoftmax(kv, gate, ape, el, ae, k, p))
		}
	})
	flush()
	return nil
}

// WindowPoolBackward implements backend.DSV4Ops.WindowPoolBackward. Each element of KV and
// Gate is a slot of at most one cell, so the cells write DKV and DGate without sharing; the
// logit gradients are kept per element so that GAPE sums them over the windows in order.
// Out is not read: each cell's value is recomputed with its softmax, so a BF16 Out does not
// round the gradients.
func (b *Backend) WindowPoolBackward(a backend.WindowPoolBackwardArgs) error {
	const op = "window-pool-backward"
	d, err := a.Validate()
	if err != nil {
		return fmt.Errorf("cpu: %w", err)
	}
	kv, gate, ape, err := b.poolInputs(op, a.WindowPoolArgs)
	if err != nil {
		return err
	}
	dout, err := b.in(op, "DOut", a.DOut)
	if err != nil {
		return err
	}
	var dkv, dgate []float32
	flushKV, flushGate := func() {}, func() {}
	if !a.DKV.IsNil() {
		if dkv, flushKV, err = b.out(op, "DKV", a.DKV, true); err != nil {
			return err
		}
	}
	if !a.DGate.IsNil() {
		if dgate, flushGate, err = b.out(op, "DGate", a.DGate, true); err != nil {
			return err
		}
	}
	var dl []float64 // the logit gradient of each KV element, for GAPE
	if !a.GAPE.IsNil() {
		dl = make([]float64, d.N*d.W)
	}
	m, W, D := a.Rate, d.W, d.D
	b.pool.rows(d.Windows*D, poolCells, func(lo, hi int) {
		el, ae, p := make([]int, 2*m), make([]int, 2*m), make([]float64, 2*m)
		for c := lo; c < hi; c++ {
			g := float64(dout[c])
			if g == 0 {
				continue
			}
			k := poolSlots(c/D, c%D, m, W, D, a.Overlap, el, ae)
			v := poolSoftmax(kv, gate, ape, el, ae, k, p)
			for j := 0; j < k; j++ {
				e := el[j]
				if dkv != nil {
					dkv[e] += float32(g * p[j])
				}
				l := g * p[j] * (float64(kv[e]) - v)
				if dgate != nil {
					dgate[e] += float32(l)
				}
				if dl != nil {
					dl[e] = l
				}
			}
		}
	})
	flushKV()
	flushGate()
	if dl == nil {
		return nil
	}
	gape := make([]float64, m*W)
	b.pool.rows(W, 64, func(lo, hi int) {
		for r := 0; r < d.N; r++ {
			for c := lo; c < hi; c++ {
				gape[(r%m)*W+c] += dl[r*W+c]
			}
		}
	})
	return b.addGrads(op, gradSum{"GAPE", a.GAPE, gape})
}

// IndexScores implements backend.DSV4Ops.IndexScores: rows are shared out to the workers;
// each score sums its heads in float64 (DSV4.index's loop), entries a query may not see get
// -Inf.
func (b *Backend) IndexScores(a backend.IndexScoresArgs) error {
	const op = "index-scores"
	N, n, Hi, Di, err := a.Validate()
	if err != nil {
		return fmt.Errorf("cpu: %w", err)
	}
	q, err := b.in(op, "Q", a.Q)
	if err != nil {
		return err
	}
	keys, err := b.in(op, "Keys", a.Keys)
	if err != nil {
		return err
	}
	wts, err := b.in(op, "Weights", a.Weights)
	if err != nil {
		return err
	}
	out, err := f32only(op, "Out", a.Out)
	if err != nil {
		return err
	}
	sd, sh := math.Sqrt(float64(Di)), math.Sqrt(float64(Hi))
	ninf := float32(math.Inf(-1))
	b.pool.rows(N, max(1, convChunk/max(1, n*Hi*Di)), func(lo, hi int) {
		for t := lo; t < hi; t++ {
			limit := min((t+1)/a.Rate, n)
			row := out[t*n : (t+1)*n]
			for w := 0; w < limit; w++ {
				k := keys[w*Di : (w+1)*Di]
				var s float64
				for h := 0; h < Hi; h++ {
					qh := q[t*Hi*Di+h*Di : t*Hi*Di+(h+1)*Di]
					var dot float64
					for j, kj := range k {
						dot += float64(qh[j]) * float64(kj)
					}
					s += math.Max(dot, 0) / sd * float64(wts[t*Hi+h]) / sh
				}
				row[w] = float32(s)
			}
			for w := limit; w < n; w++ {
				row[w] = ninf
			}
		}
	})
	return nil
}
