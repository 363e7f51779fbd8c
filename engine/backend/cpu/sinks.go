package cpu

import (
	"fmt"
	"math"
)

// sinkShape checks the operands of the sink ops and returns N, NH and HD.
func sinkShape(op string, out, lse, sinks T) (n, nh, hd int, err error) {
	nh = sinks.Numel()
	if nh <= 0 || lse.Numel()%nh != 0 {
		return 0, 0, 0, fmt.Errorf("cpu: %s: LSE %v is not [N, NH] for %d sinks", op, lse, nh)
	}
	n = lse.Numel() / nh
	if n == 0 || out.Numel()%(n*nh) != 0 {
		return n, nh, 0, fmt.Errorf("cpu: %s: Out %v is not [N, NH*HD] for N=%d, NH=%d", op, out, n, nh)
	}
	return n, nh, out.Numel() / (n * nh), nil
}

// AttentionSinks folds the sink logits into Out and LSE; see backend.Ops.
func (b *Backend) AttentionSinks(out, lse, sinks T) error {
	const op = "attention-sinks"
	n, nh, hd, err := sinkShape(op, out, lse, sinks)
	if err != nil || n == 0 {
		return err
	}
	ls, err := f32only(op, "LSE", lse)
	if err != nil {
		return err
	}
	sk, err := b.in(op, "sinks", sinks)
	if err != nil {
		return err
	}
	os, flush, err := b.out(op, "Out", out, true)
	if err != nil {
		return err
	}
	b.pool.rows(n, 16, func(lo, hi int) {
		for i := lo; i < hi; i++ {
			for h := 0; h < nh; h++ {
				l, s := float64(ls[i*nh+h]), float64(sk[h])
				m := math.Max(l, s)
				nl := m + math.Log(math.Exp(l-m)+math.Exp(s-m))
				f := float32(math.Exp(l - nl))
				row := os[(i*nh+h)*hd : (i*nh+h+1)*hd]
				for d := range row {
					row[d] *= f
				}
				ls[i*nh+h] = float32(nl)
			}
		}
	})
	flush()
	return nil
}

// AttentionSinksBackward accumulates the sinks' gradient; see backend.Ops.
func (b *Backend) AttentionSinksBackward(dSinks, dOut, out, lse, sinks T) error {
	const op = "attention-sinks-backward"
	n, nh, hd, err := sinkShape(op, out, lse, sinks)
	if err != nil || n == 0 {
		return err
	}
	if err := numel(op, "dOut", dOut, out.Numel(), "numel(Out)"); err != nil {
		return err
	}
	if err := numel(op, "dSinks", dSinks, nh, "NH"); err != nil {
		return err
	}
	ls, err := f32only(op, "LSE", lse)
	if err != nil {
		return err
	}
	sk, err := b.in(op, "sinks", sinks)
	if err != nil {
		return err
	}
	os, err := b.in(op, "Out", out)
	if err != nil {
		return err
	}
	ds, err := b.in(op, "dOut", dOut)
	if err != nil {
		return err
	}
	g, flush, err := b.out(op, "dSinks", dSinks, true)
	if err != nil {
		return err
	}
	// Per head, in increasing token order: the result does not depend on the worker count.
	b.pool.rows(nh, 1, func(lo, hi int) {
		for h := lo; h < hi; h++ {
			acc := 0.0
			for i := 0; i < n; i++ {
				r := (i*nh + h) * hd
				dd := 0.0
				for d := 0; d < hd; d++ {
					dd += float64(ds[r+d]) * float64(os[r+d])
				}
				acc -= math.Exp(float64(sk[h])-float64(ls[i*nh+h])) * dd
			}
			g[h] += float32(acc)
		}
	})
	flush()
	return nil
}
