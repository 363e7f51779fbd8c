package cpu

import (
	"fmt"
	"math"

	"github.com/halo-shell/halo-shell/engine/backend"
)

// gatedDeltaIn are the inputs of both directions of the gated delta rule, as float32 slices.
type gatedDeltaIn struct {
	q, k, v, beta, g []float32
	cu               []int32
}

func (b *Backend) gatedDeltaInputs(op string, d backend.GatedDeltaDims, q, k, v, beta, g, cu T) (gatedDeltaIn, error) {
	var in gatedDeltaIn
	var err error
	for _, x := range []struct {
		name string
		t    T
		dst  *[]float32
	}{{"Q", q, &in.q}, {"K", k, &in.k}, {"V", v, &in.v}, {"Beta", beta, &in.beta}, {"G", g, &in.g}} {
		if *x.dst, err = b.in(op, x.name, x.t); err != nil {
			return in, err
		}
	}
	if in.cu, err = docBounds(op, cu, d.Docs, d.N); err != nil {
		return in, err
	}
	return in, nil
}

// gatedDeltaStep advances value head h's state S [KD,VD] over token t (float64) and returns
// nothing; S = e^g·S + k·δᵀ.
func gatedDeltaStep(d backend.GatedDeltaDims, in gatedDeltaIn, S []float64, t, h int) {
	kh := h / (d.VH / d.KH)
	k := in.k[(t*d.KH+kh)*d.KD:]
	v := in.v[(t*d.VH+h)*d.VD:]
	decay := math.Exp(float64(in.g[t*d.VH+h]))
	beta := float64(in.beta[t*d.VH+h])
	for i := range S {
		S[i] *= decay
	}
	for j := 0; j < d.VD; j++ {
		mem := 0.0
		for i := 0; i < d.KD; i++ {
			mem += S[i*d.VD+j] * float64(k[i])
		}
		delta := (float64(v[j]) - mem) * beta
		for i := 0; i < d.KD; i++ {
			S[i*d.VD+j] += float64(k[i]) * delta
		}
	}
}

// GatedDelta implements backend.Optional.GatedDelta: the reference of the device kernel, the
// recurrence in float64 per document and value head (value heads on the workers).
func (b *Backend) GatedDelta(a backend.GatedDeltaArgs) error {
	const op = "gated delta"
	d, err := a.Validate()
	if err != nil {
		return fmt.Errorf("cpu: %w", err)
	}
	in, err := b.gatedDeltaInputs(op, d, a.Q, a.K, a.V, a.Beta, a.G, a.CuSeqlens)
	if err != nil {
		return err
	}
	out, flush, err := b.out(op, "Out", a.Out, false)
	if err != nil {
		return err
	}
	var states []float32
	if !a.States.IsNil() {
		if states, err = f32only(op, "States", a.States); err != nil {
			return err
		}
	}
	size := d.KD * d.VD
	b.pool.rows(d.VH, 1, func(lo, hi int) {
		S := make([]float64, size)
		for h := lo; h < hi; h++ {
			kh := h / (d.VH / d.KH)
			for doc := 0; doc < d.Docs; doc++ {
				clear(S)
				for t := int(in.cu[doc]); t < int(in.cu[doc+1]); t++ {
					if states != nil && t%d.Chunk == 0 {
						dst := states[((t/d.Chunk)*d.VH+h)*size:]
						for i, x := range S {
							dst[i] = float32(x)
						}
					}
					gatedDeltaStep(d, in, S, t, h)
					q := in.q[(t*d.KH+kh)*d.KD:]
					o := out[(t*d.VH+h)*d.VD:]
					for j := 0; j < d.VD; j++ {
						s := 0.0
						for i := 0; i < d.KD; i++ {
							s += S[i*d.VD+j] * float64(q[i])
						}
						o[j] = float32(s)
					}
				}
			}
		}
	})
	flush()
	return nil
}

// GatedDeltaBackward implements backend.Optional.GatedDeltaBackward: the reference of the
// device kernel. Each document is walked backwards a stretch at a time (the tokens of one
// Chunk), from the stretch's kept state (States) or zero at the document's start, its states
// recomputed forward in float64 and the steps differentiated in reverse.
func (b *Backend) GatedDeltaBackward(a backend.GatedDeltaBackwardArgs) error {
	const op = "gated delta backward"
	d, err := a.Validate()
	if err != nil {
		return fmt.Errorf("cpu: %w", err)
	}
	in, err := b.gatedDeltaInputs(op, d, a.Q, a.K, a.V, a.Beta, a.G, a.CuSeqlens)
	if err != nil {
		return err
	}
	states, err := f32only(op, "States", a.States)
	if err != nil {
		return err
	}
	dO, err := b.in(op, "DOut", a.DOut)
	if err != nil {
		return err
	}
	outs := map[string][]float32{}
	for _, n := range []struct {
		name string
		t    T
	}{{"DQ", a.DQ}, {"DK", a.DK}, {"DBeta", a.DBeta}, {"DG", a.DG}} {
		if outs[n.name], err = f32only(op, n.name, n.t); err != nil {
			return err
		}
	}
	dv, flush, err := b.out(op, "DV", a.DV, false)
	if err != nil {
		return err
	}
	dq, dk, dbeta, dg := outs["DQ"], outs["DK"], outs["DBeta"], outs["DG"]
	r, size := d.VH/d.KH, d.KD*d.VD
	// Key-head groups on the workers: a group's value heads add into the same DQ and DK rows.
	b.pool.rows(d.KH, 1, func(lo, hi int) {
		dS := make([]float64, size)
		ddelta, dkv := make([]float64, d.VD), make([]float64, d.VD)
		for kh := lo; kh < hi; kh++ {
			for h := kh * r; h < (kh+1)*r; h++ {
				for doc := 0; doc < d.Docs; doc++ {
					first, end := int(in.cu[doc]), int(in.cu[doc+1])
					if first == end {
						continue
					}
					clear(dS)
					for c := (end - 1) / d.Chunk; c >= first/d.Chunk; c-- {
						s0, s1 := max(first, c*d.Chunk), min(end, (c+1)*d.Chunk)
						hist := make([][]float64, s1-s0+1)
						hist[0] = make([]float64, size)
						if s0 != first {
							for i, x := range states[(c*d.VH+h)*size : (c*d.VH+h+1)*size] {
								hist[0][i] = float64(x)
							}
						}
						for t := s0; t < s1; t++ {
							hist[t-s0+1] = append([]float64(nil), hist[t-s0]...)
							gatedDeltaStep(d, in, hist[t-s0+1], t, h)
						}
						for t := s1 - 1; t >= s0; t-- {
							prev, cur := hist[t-s0], hist[t-s0+1]
							q := in.q[(t*d.KH+kh)*d.KD : (t*d.KH+kh+1)*d.KD]
							k := in.k[(t*d.KH+kh)*d.KD : (t*d.KH+kh+1)*d.KD]
							v := in.v[(t*d.VH+h)*d.VD : (t*d.VH+h+1)*d.VD]
							do := dO[(t*d.VH+h)*d.VD : (t*d.VH+h+1)*d.VD]
							beta, decay := float64(in.beta[t*d.VH+h]), math.Exp(float64(in.g[t*d.VH+h]))
							for i := 0; i < d.KD; i++ {
								s := 0.0
								for j := 0; j < d.VD; j++ {
									s += cur[i*d.VD+j] * float64(do[j])
									dS[i*d.VD+j] += float64(q[i]) * float64(do[j])
								}
								dq[(t*d.KH+kh)*d.KD+i] += float32(s)
							}
							for j := 0; j < d.VD; j++ {
								s := 0.0
								for i := 0; i < d.KD; i++ {
									s += dS[i*d.VD+j] * float64(k[i])
								}
								ddelta[j] = s
							}
							dbt := 0.0
							for j := 0; j < d.VD; j++ {
								mem := 0.0
								for i := 0; i < d.KD; i++ {
									mem += decay * prev[i*d.VD+j] * float64(k[i])
								}
								delta := beta * (float64(v[j]) - mem)
								for i := 0; i < d.KD; i++ {
									dk[(t*d.KH+kh)*d.KD+i] += float32(dS[i*d.VD+j] * delta)
								}
								dv[(t*d.VH+h)*d.VD+j] = float32(beta * ddelta[j])
								dbt += ddelta[j] * (float64(v[j]) - mem)
								dkv[j] = -beta * ddelta[j]
							}
							dbeta[t*d.VH+h] += float32(dbt)
							dgt := 0.0
							for i := 0; i < d.KD; i++ {
								s := 0.0
								for j := 0; j < d.VD; j++ {
									sh := decay * prev[i*d.VD+j]
									s += sh * dkv[j]
									dsh := dS[i*d.VD+j] + float64(k[i])*dkv[j]
									dgt += sh * dsh
									dS[i*d.VD+j] = decay * dsh
								}
								dk[(t*d.KH+kh)*d.KD+i] += float32(s)
							}
							dg[t*d.VH+h] += float32(dgt)
						}
					}
				}
			}
		}
	})
	flush()
	return nil
}
