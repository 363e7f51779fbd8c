package profile

import (
	"time"

	"github.com/halo-shell/halo-shell/engine/backend"
	"github.com/halo-shell/halo-shell/engine/tensor"
	"github.com/halo-shell/halo-shell/internal/profilekeys"
)

type T = tensor.Tensor

// Backend is a backend.Backend that forwards every call to an inner backend and, while its
// Recorder is on, records a span per op: by default the host clock after a Sync of each op; with
// Recorder.TimeOnDevice, the device time between marks taken before and after the op, read at
// the end of the step (no op waits). It is used from the inner backend's goroutine, like any
// backend.
//
// Its Optional has every capability of the inner backend's: the fused ops (AddRMSNorm, AdamW, GroupedGEMM)
// wrapped so that they are recorded like the required ones, the Timer forwarded as it is (marks
// are not ops). It always implements engine/train's OpTimer (OpTimes, ResetOpTimes).
type Backend struct {
	in  backend.Backend
	rec *Recorder
	opt backend.Optional // built once by Wrap from in.Optional()
}

var _ backend.Backend = (*Backend)(nil)

// Wrap returns in wrapped with recording into rec (a new, disabled Recorder when rec is nil).
func Wrap(in backend.Backend, rec *Recorder) *Backend {
	if rec == nil {
		rec = NewRecorder()
	}
	b := &Backend{in: in, rec: rec}
	b.opt = b.wrapOptional(in.Optional())
	if c := b.opt.Syncs; c != nil && rec.syncs.Load() == nil {
		rec.CountSyncs(c)
	}
	return b
}

// Unwrap returns the recorder and the inner backend of a backend returned by Wrap; ok is false
// for any other backend.
func Unwrap(b backend.Backend) (rec *Recorder, inner backend.Backend, ok bool) {
	p, ok := b.(*Backend)
	if !ok {
		return nil, nil, false
	}
	return p.rec, p.in, true
}

// Recorder is the wrapper's recorder.
func (b *Backend) Recorder() *Recorder { return b.rec }

// Inner is the wrapped backend.
func (b *Backend) Inner() backend.Backend { return b.in }

// OpTimes implements engine/train's OpTimer.
func (b *Backend) OpTimes() map[string]time.Duration { return b.rec.OpTimes() }

// ResetOpTimes implements engine/train's OpTimer.
func (b *Backend) ResetOpTimes() { b.rec.ResetOpTimes() }

// opStart is where an op began: the host clock, and a device mark when the recorder times ops
// on the device (Recorder.TimeOnDevice).
type opStart struct {
	t    time.Time
	mark backend.TimeMark
}

// begin starts timing an op.
func (b *Backend) begin() opStart {
	s := opStart{t: time.Now()}
	if t := b.rec.deviceTimer(); t != nil {
		if m, err := t.Mark(); err == nil {
			s.mark = m
		}
	}
	return s
}

// end finishes an op that started at s: while recording, it records the span, timed on the device
// between two marks when s has one (no wait), else by the host clock after a Sync; while
// capturing activations, it summarises out (the output of a forward op; zero for others).
// CrossEntropy, the end of the forward pass, stops the capture.
func (b *Backend) end(s opStart, err error, name string, c backend.Cost, out T) error {
	mode := b.rec.mode.Load()
	if mode&modeRecord != 0 {
		sp := Span{Name: name, Class: c.Class, Bytes: c.Bytes, FLOPs: c.FLOPs}
		if s.mark == 0 || err != nil || !b.rec.recordMarked(sp, s.mark) {
			b.rec.release(s.mark)
			if err == nil {
				err = b.in.Sync()
			}
			sp.Dur = time.Since(s.t)
			b.rec.Record(sp, s.t)
		}
	} else {
		b.rec.release(s.mark)
	}
	if mode&modeCapture != 0 && err == nil {
		switch {
		case c.Class == ClassLoss:
			b.rec.stopCapture()
		case !out.IsNil():
			if v, derr := backend.ToFloat32(b.in, out); derr == nil {
				b.rec.addActivation(name, c.Class, out.Shape(), v)
			}
		}
	}
	return err
}

// ---- backend.Backend and Memory: forwarded; transfers are spans of class other ----

func (b *Backend) Name() string { return b.in.Name() }
func (b *Backend) Sync() error  { b.rec.noteWait(); return b.in.Sync() }
func (b *Backend) Close() error { return b.in.Close() }

func (b *Backend) Alloc(dt tensor.DType, shape ...int) (T, error) { return b.in.Alloc(dt, shape...) }
func (b *Backend) Empty(dt tensor.DType, shape ...int) (T, error) { return b.in.Empty(dt, shape...) }
func (b *Backend) Free(t T) error                                 { return b.in.Free(t) }
func (b *Backend) MemStats() backend.MemStats                     { return b.in.MemStats() }
func (b *Backend) ResetPeak()                                     { b.in.ResetPeak() }

func (b *Backend) Upload(dst T, src []byte) error {
	if b.rec.mode.Load() == 0 {
		return b.in.Upload(dst, src)
	}
	s := b.begin()
	return b.end(s, b.in.Upload(dst, src), "Upload", backend.TransferCost(len(src)), T{})
}

func (b *Backend) Download(dst []byte, src T) error {
	if b.rec.mode.Load() == 0 {
		return b.in.Download(dst, src)
	}
	b.rec.noteWait()
	s := b.begin()
	return b.end(s, b.in.Download(dst, src), "Download", backend.TransferCost(len(dst)), T{})
}

func (b *Backend) Copy(dst, src T) error {
	if b.rec.mode.Load() == 0 {
		return b.in.Copy(dst, src)
	}
	s := b.begin()
	return b.end(s, b.in.Copy(dst, src), "Copy", backend.CopyCost(dst, src), T{})
}

// ---- Ops ----

func (b *Backend) Fill(t T, v float32) error {
	if b.rec.mode.Load() == 0 {
		return b.in.Fill(t, v)
	}
	s := b.begin()
	return b.end(s, b.in.Fill(t, v), "Fill", backend.FillCost(t), T{})
}

func (b *Backend) Add(out, x, y T) error {
	if b.rec.mode.Load() == 0 {
		return b.in.Add(out, x, y)
	}
	s := b.begin()
	return b.end(s, b.in.Add(out, x, y), "Add", backend.AddCost(out, x, y), out)
}

func (b *Backend) Axpy(y T, alpha float32, x T) error {
	if b.rec.mode.Load() == 0 {
		return b.in.Axpy(y, alpha, x)
	}
	s := b.begin()
	return b.end(s, b.in.Axpy(y, alpha, x), "Axpy", backend.AxpyCost(y, x), T{})
}

func (b *Backend) Scale(t T, alpha float32) error {
	if b.rec.mode.Load() == 0 {
		return b.in.Scale(t, alpha)
	}
	s := b.begin()
	return b.end(s, b.in.Scale(t, alpha), "Scale", backend.ScaleCost(t), T{})
}

// ScaleRows weights expert output rows: class other.
func (b *Backend) ScaleRows(t, w T) error {
	if b.rec.mode.Load() == 0 {
		return b.in.ScaleRows(t, w)
	}
	s := b.begin()
	return b.end(s, b.in.ScaleRows(t, w), "ScaleRows", backend.ScaleRowsCost(t, w), T{})
}

// RowDot is the routing-weight gradient of expert rows: class other.
func (b *Backend) RowDot(out, x, y T) error {
	if b.rec.mode.Load() == 0 {
		return b.in.RowDot(out, x, y)
	}
	s := b.begin()
	return b.end(s, b.in.RowDot(out, x, y), "RowDot", backend.RowDotCost(out, x, y), out)
}

// SumSquares is the gradient-norm reduction: class optimizer.
func (b *Backend) SumSquares(ts []T) ([]float64, error) {
	if b.rec.mode.Load() == 0 {
		return b.in.SumSquares(ts)
	}
	s := b.begin()
	r, err := b.in.SumSquares(ts)
	return r, b.end(s, err, "SumSquares", backend.SumSquaresCost(ts), T{})
}

func (b *Backend) Embedding(out, weight, ids T) error {
	if b.rec.mode.Load() == 0 {
		return b.in.Embedding(out, weight, ids)
	}
	s := b.begin()
	return b.end(s, b.in.Embedding(out, weight, ids), "Embedding", backend.EmbeddingCost(out, weight, ids), out)
}

func (b *Backend) EmbeddingBackward(dWeight, dOut, ids T) error {
	if b.rec.mode.Load() == 0 {
		return b.in.EmbeddingBackward(dWeight, dOut, ids)
	}
	s := b.begin()
	return b.end(s, b.in.EmbeddingBackward(dWeight, dOut, ids), "EmbeddingBackward", backend.EmbeddingBackwardCost(dWeight, dOut, ids), T{})
}

func (b *Backend) GEMM(a backend.GEMMArgs) error {
	if b.rec.mode.Load() == 0 {
		return b.in.GEMM(a)
	}
	s := b.begin()
	return b.end(s, b.in.GEMM(a), "GEMM", backend.GEMMCost(a), T{})
}

func (b *Backend) Linear(out, x, w, bias T) error {
	if b.rec.mode.Load() == 0 {
		return b.in.Linear(out, x, w, bias)
	}
	s := b.begin()
	return b.end(s, b.in.Linear(out, x, w, bias), "Linear", backend.LinearCost(out, x, w, bias), out)
}

func (b *Backend) LinearBackward(a backend.LinearBackwardArgs) error {
	if b.rec.mode.Load() == 0 {
		return b.in.LinearBackward(a)
	}
	s := b.begin()
	return b.end(s, b.in.LinearBackward(a), "LinearBackward", backend.LinearBackwardCost(a), T{})
}

func (b *Backend) RMSNorm(out, rstd, x, w T, eps float32) error {
	if b.rec.mode.Load() == 0 {
		return b.in.RMSNorm(out, rstd, x, w, eps)
	}
	s := b.begin()
	return b.end(s, b.in.RMSNorm(out, rstd, x, w, eps), "RMSNorm", backend.RMSNormCost(out, rstd, x, w), out)
}

func (b *Backend) RMSNormBackward(a backend.RMSNormBackwardArgs) error {
	if b.rec.mode.Load() == 0 {
		return b.in.RMSNormBackward(a)
	}
	s := b.begin()
	return b.end(s, b.in.RMSNormBackward(a), "RMSNormBackward", backend.RMSNormBackwardCost(a), T{})
}

func (b *Backend) RoPE(out, x T, a backend.RoPEArgs) error {
	if b.rec.mode.Load() == 0 {
		return b.in.RoPE(out, x, a)
	}
	s := b.begin()
	return b.end(s, b.in.RoPE(out, x, a), "RoPE", backend.RoPECost(out, x, a), out)
}

func (b *Backend) RoPEBackward(dX, dY T, a backend.RoPEArgs) error {
	if b.rec.mode.Load() == 0 {
		return b.in.RoPEBackward(dX, dY, a)
	}
	s := b.begin()
	return b.end(s, b.in.RoPEBackward(dX, dY, a), "RoPEBackward", backend.RoPEBackwardCost(dX, dY, a), T{})
}

// Attention FLOPs are not counted: they depend on the document lengths, which live on the
// device (backend.AttentionCost with no pairs).
func (b *Backend) Attention(a backend.AttentionArgs) error {
	if b.rec.mode.Load() == 0 {
		return b.in.Attention(a)
	}
	s := b.begin()
	return b.end(s, b.in.Attention(a), "Attention", backend.AttentionCost(a, 0), a.Out)
}

func (b *Backend) AttentionBackward(a backend.AttentionBackwardArgs) error {
	if b.rec.mode.Load() == 0 {
		return b.in.AttentionBackward(a)
	}
	s := b.begin()
	return b.end(s, b.in.AttentionBackward(a), "AttentionBackward", backend.AttentionBackwardCost(a, 0), T{})
}

func (b *Backend) SwiGLU(out, gate, up T) error {
	if b.rec.mode.Load() == 0 {
		return b.in.SwiGLU(out, gate, up)
	}
	s := b.begin()
	return b.end(s, b.in.SwiGLU(out, gate, up), "SwiGLU", backend.SwiGLUCost(out, gate, up), out)
}

func (b *Backend) SwiGLUBackward(dGate, dUp, dOut, gate, up T) error {
	if b.rec.mode.Load() == 0 {
		return b.in.SwiGLUBackward(dGate, dUp, dOut, gate, up)
	}
	s := b.begin()
	return b.end(s, b.in.SwiGLUBackward(dGate, dUp, dOut, gate, up), "SwiGLUBackward", backend.SwiGLUBackwardCost(dGate, dUp, dOut, gate, up), T{})
}

func (b *Backend) CopyColumns(a backend.ColumnCopyArgs) error {
	if b.rec.mode.Load() == 0 {
		return b.in.CopyColumns(a)
	}
	s := b.begin()
	return b.end(s, b.in.CopyColumns(a), "CopyColumns", backend.CopyColumnsCost(a), a.Dst)
}

func (b *Backend) AttentionSinks(out, lse, sinks T) error {
	if b.rec.mode.Load() == 0 {
		return b.in.AttentionSinks(out, lse, sinks)
	}
	s := b.begin()
	return b.end(s, b.in.AttentionSinks(out, lse, sinks), "AttentionSinks", backend.AttentionSinksCost(out, lse, sinks), out)
}

func (b *Backend) AttentionSinksBackward(dSinks, dOut, out, lse, sinks T) error {
	if b.rec.mode.Load() == 0 {
		return b.in.AttentionSinksBackward(dSinks, dOut, out, lse, sinks)
	}
	s := b.begin()
	return b.end(s, b.in.AttentionSinksBackward(dSinks, dOut, out, lse, sinks), "AttentionSinksBackward", backend.AttentionSinksBackwardCost(dSinks, dOut, out, lse), T{})
}

func (b *Backend) SwiGLUClamped(out, gateUp T, alpha, limit float32) error {
	if b.rec.mode.Load() == 0 {
		return b.in.SwiGLUClamped(out, gateUp, alpha, limit)
	}
	s := b.begin()
	return b.end(s, b.in.SwiGLUClamped(out, gateUp, alpha, limit), "SwiGLUClamped", backend.SwiGLUClampedCost(out, gateUp), out)
}

func (b *Backend) SwiGLUClampedBackward(dGateUp, dOut, gateUp T, alpha, limit float32) error {
	if b.rec.mode.Load() == 0 {
		return b.in.SwiGLUClampedBackward(dGateUp, dOut, gateUp, alpha, limit)
	}
	s := b.begin()
	return b.end(s, b.in.SwiGLUClampedBackward(dGateUp, dOut, gateUp, alpha, limit), "SwiGLUClampedBackward", backend.SwiGLUClampedBackwardCost(dGateUp, dOut, gateUp), T{})
}

func (b *Backend) GeGLU(out, gate, up T) error {
	if b.rec.mode.Load() == 0 {
		return b.in.GeGLU(out, gate, up)
	}
	s := b.begin()
	return b.end(s, b.in.GeGLU(out, gate, up), "GeGLU", backend.GeGLUCost(out, gate, up), out)
}

func (b *Backend) GeGLUBackward(dGate, dUp, dOut, gate, up T) error {
	if b.rec.mode.Load() == 0 {
		return b.in.GeGLUBackward(dGate, dUp, dOut, gate, up)
	}
	s := b.begin()
	return b.end(s, b.in.GeGLUBackward(dGate, dUp, dOut, gate, up), "GeGLUBackward", backend.GeGLUBackwardCost(dGate, dUp, dOut, gate, up), T{})
}

// CrossEntropy is the fused LM head and loss: class loss (its GEMMs included).
func (b *Backend) CrossEntropy(a backend.CrossEntropyArgs) error {
	if b.rec.mode.Load() == 0 {
		return b.in.CrossEntropy(a)
	}
	s := b.begin()
	return b.end(s, b.in.CrossEntropy(a), "CrossEntropy", backend.CrossEntropyCost(a), T{})
}

// ---- optional capabilities ----

// Optional implements backend.Backend.
func (b *Backend) Optional() backend.Optional { return b.opt }

// wrapOptional decides for each of the inner backend's optional capabilities: the fused ops are
// recorded as spans (the grouped expert products as class expert_gemm, 2*S*N_*K_ FLOPs, NF4
// dequantisation, dropout and the decoding sampler as class other, the decoding attention as
// class attention; DeepSeek-V4's ops as wrapDSV4 says), the timer is forwarded.
func (b *Backend) wrapOptional(in backend.Optional) backend.Optional {
	out := backend.Optional{Timer: in.Timer, Syncs: in.Syncs}
	if f := in.AdamW; f != nil {
		out.AdamW = func(a backend.AdamWArgs) error {
			if b.rec.mode.Load() == 0 {
				return f(a)
			}
			s := b.begin()
			return b.end(s, f(a), "AdamW", backend.AdamWCost(a), T{})
		}
	}
	if f := in.AddRMSNorm; f != nil {
		out.AddRMSNorm = func(residualOut, out, rstd, x, residual, w T, eps float32) error {
			if b.rec.mode.Load() == 0 {
				return f(residualOut, out, rstd, x, residual, w, eps)
			}
			s := b.begin()
			return b.end(s, f(residualOut, out, rstd, x, residual, w, eps), "AddRMSNorm", backend.AddRMSNormCost(residualOut, out, rstd, x, residual, w), out)
		}
	}
	if f := in.GroupedGEMM; f != nil {
		out.GroupedGEMM = func(a backend.GroupedGEMMArgs) error {
			if b.rec.mode.Load() == 0 {
				return f(a)
			}
			s := b.begin()
			err := f(a)
			var act T
			if a.Kind == backend.GroupedForward {
				act = a.Out
			}
			return b.end(s, err, "GroupedGEMM."+a.Kind.String(), backend.GroupedGEMMCost(a), act)
		}
	}
	if f := in.DequantNF4; f != nil {
		out.DequantNF4 = func(a backend.DequantNF4Args) error {
			if b.rec.mode.Load() == 0 {
				return f(a)
			}
			s := b.begin()
			return b.end(s, f(a), "DequantNF4", backend.DequantNF4Cost(a), a.Out)
		}
	}
	if f := in.Dropout; f != nil {
		out.Dropout = func(a backend.DropoutArgs) error {
			if b.rec.mode.Load() == 0 {
				return f(a)
			}
			s := b.begin()
			return b.end(s, f(a), "Dropout", backend.DropoutCost(a), a.Out)
		}
	}
	if f := in.ShortConv; f != nil {
		out.ShortConv = func(a backend.ShortConvArgs) error {
			if b.rec.mode.Load() == 0 {
				return f(a)
			}
			s := b.begin()
			return b.end(s, f(a), "ShortConv", backend.ShortConvCost(a), a.Gated)
		}
	}
	if f := in.ShortConvBackward; f != nil {
		out.ShortConvBackward = func(a backend.ShortConvBackwardArgs) error {
			if b.rec.mode.Load() == 0 {
				return f(a)
			}
			s := b.begin()
			return b.end(s, f(a), "ShortConvBackward", backend.ShortConvBackwardCost(a), a.DBCX)
		}
	}
	if f := in.GatedDelta; f != nil {
		out.GatedDelta = func(a backend.GatedDeltaArgs) error {
			if b.rec.mode.Load() == 0 {
				return f(a)
			}
			s := b.begin()
			return b.end(s, f(a), "GatedDelta", backend.GatedDeltaCost(a), a.Out)
		}
	}
	if f := in.GatedDeltaBackward; f != nil {
		out.GatedDeltaBackward = func(a backend.GatedDeltaBackwardArgs) error {
			if b.rec.mode.Load() == 0 {
				return f(a)
			}
			s := b.begin()
			return b.end(s, f(a), "GatedDeltaBackward", backend.GatedDeltaBackwardCost(a), a.DV)
		}
	}
	if f := in.GatedDeltaPrep; f != nil {
		out.GatedDeltaPrep = func(a backend.GatedDeltaPrepArgs) error {
			if b.rec.mode.Load() == 0 {
				return f(a)
			}
			s := b.begin()
			return b.end(s, f(a), "GatedDeltaPrep", backend.GatedDeltaPrepCost(a), a.V)
		}
	}
	if f := in.GatedDeltaPrepBackward; f != nil {
		out.GatedDeltaPrepBackward = func(a backend.GatedDeltaPrepBackwardArgs) error {
			if b.rec.mode.Load() == 0 {
				return f(a)
			}
			s := b.begin()
			return b.end(s, f(a), "GatedDeltaPrepBackward", backend.GatedDeltaPrepBackwardCost(a), a.DMixed)
		}
	}
	if f := in.GatedRMSNorm; f != nil {
		out.GatedRMSNorm = func(a backend.GatedRMSNormArgs) error {
			if b.rec.mode.Load() == 0 {
				return f(a)
			}
			s := b.begin()
			return b.end(s, f(a), "GatedRMSNorm", backend.GatedRMSNormCost(a), a.Out)
		}
	}
	if f := in.GatedRMSNormBackward; f != nil {
		out.GatedRMSNormBackward = func(a backend.GatedRMSNormBackwardArgs) error {
			if b.rec.mode.Load() == 0 {
				return f(a)
			}
			s := b.begin()
			return b.end(s, f(a), "GatedRMSNormBackward", backend.GatedRMSNormBackwardCost(a), a.DX)
		}
	}
	if f := in.DecodeAttention; f != nil {
		out.DecodeAttention = func(a backend.DecodeAttentionArgs) error {
			if b.rec.mode.Load() == 0 {
				return f(a)
			}
			s := b.begin()
			return b.end(s, f(a), "DecodeAttention", backend.DecodeAttentionCost(a, 0), a.Out)
		}
	}
	if f := in.SampleTokens; f != nil {
		out.SampleTokens = func(a backend.SampleArgs) error {
			if b.rec.mode.Load() == 0 {
				return f(a)
			}
			s := b.begin()
			return b.end(s, f(a), "SampleTokens", backend.SampleTokensCost(a), T{})
		}
	}
	b.wrapMoE(in, &out)
	out.DSV4 = b.wrapDSV4(in.DSV4)
	return out
}

// spanOf wraps an op of one argument struct in a span of the class, its FLOPs not counted.
func spanOf[A any](b *Backend, name, class string, f func(A) error) func(A) error {
	return func(a A) error {
		if b.rec.mode.Load() == 0 {
			return f(a)
		}
		s := b.begin()
		return b.end(s, f(a), name, backend.Cost{Class: class}, T{})
	}
}

// wrapDSV4 records each of DeepSeek-V4's ops as a span (sink attention as class attention,
// the router's activation as router, the rest as other; FLOPs not counted).
func (b *Backend) wrapDSV4(in *backend.DSV4Ops) *backend.DSV4Ops {
	if in == nil {
		return nil
	}
	other, att, router := profilekeys.ClassOther, profilekeys.ClassAttention, profilekeys.ClassRouter
	span := func(name, class string, run func() error) error {
		if b.rec.mode.Load() == 0 {
			return run()
		}
		s := b.begin()
		return b.end(s, run(), name, backend.Cost{Class: class}, T{})
	}
	return &backend.DSV4Ops{
		HyperWeights:         spanOf(b, "HyperWeights", other, in.HyperWeights),
		HyperWeightsBackward: spanOf(b, "HyperWeightsBackward", other, in.HyperWeightsBackward),
		StreamCollapse: func(out, w, x T) error {
			return span("StreamCollapse", other, func() error { return in.StreamCollapse(out, w, x) })
		},
		StreamCollapseBackward: func(dW, dX, dOut, w, x T) error {
			return span("StreamCollapseBackward", other, func() error { return in.StreamCollapseBackward(dW, dX, dOut, w, x) })
		},
		StreamExpand:          spanOf(b, "StreamExpand", other, in.StreamExpand),
		StreamExpandBackward:  spanOf(b, "StreamExpandBackward", other, in.StreamExpandBackward),
		SinkAttention:         spanOf(b, "SinkAttention", att, in.SinkAttention),
		SinkAttentionBackward: spanOf(b, "SinkAttentionBackward", att, in.SinkAttentionBackward),
		SinkSoftmax:           spanOf(b, "SinkSoftmax", att, in.SinkSoftmax),
		SinkSoftmaxBackward:   spanOf(b, "SinkSoftmaxBackward", att, in.SinkSoftmaxBackward),
		WindowPool:            spanOf(b, "WindowPool", other, in.WindowPool),
		WindowPoolBackward:    spanOf(b, "WindowPoolBackward", other, in.WindowPoolBackward),
		IndexScores:           spanOf(b, "IndexScores", att, in.IndexScores),
		SqrtSoftplus: func(out, x T) error {
			return span("SqrtSoftplus", router, func() error { return in.SqrtSoftplus(out, x) })
		},
		SqrtSoftplusBackward: func(dX, dOut, x, out T) error {
			return span("SqrtSoftplusBackward", router, func() error { return in.SqrtSoftplusBackward(dX, dOut, x, out) })
		},
		SwiGLUClampedSplit: func(out, gate, up T, limit float32) error {
			return span("SwiGLUClampedSplit", profilekeys.ClassMLPActivation, func() error { return in.SwiGLUClampedSplit(out, gate, up, limit) })
		},
		SwiGLUClampedSplitBackward: func(dGate, dUp, dOut, gate, up T, limit float32) error {
			return span("SwiGLUClampedSplitBackward", profilekeys.ClassMLPActivation, func() error {
				return in.SwiGLUClampedSplitBackward(dGate, dUp, dOut, gate, up, limit)
			})
		},
	}
}

// wrapMoE records the mixture-of-experts routing ops as spans of the classes router, permute
// and combine, and the packed SwiGLU as mlp_activation.
func (b *Backend) wrapMoE(in backend.Optional, out *backend.Optional) {
	if f := in.MoERoute; f != nil {
		out.MoERoute = func(a backend.MoERouteArgs) error {
			if b.rec.mode.Load() == 0 {
				return f(a)
			}
			s := b.begin()
			return b.end(s, f(a), "MoERoute", backend.MoERouteCost(a), T{})
		}
	}
	if f := in.MoERouteBackward; f != nil {
		out.MoERouteBackward = func(a backend.MoERouteBackwardArgs) error {
			if b.rec.mode.Load() == 0 {
				return f(a)
			}
			s := b.begin()
			return b.end(s, f(a), "MoERouteBackward", backend.MoERouteBackwardCost(a), T{})
		}
	}
	if f := in.MoEPermute; f != nil {
		out.MoEPermute = func(a backend.MoEPermuteArgs) error {
			if b.rec.mode.Load() == 0 {
				return f(a)
			}
			s := b.begin()
			return b.end(s, f(a), "MoEPermute", backend.MoEPermuteCost(a), a.Xs)
		}
	}
	if f := in.MoEPermuteBackward; f != nil {
		out.MoEPermuteBackward = func(a backend.MoEPermuteBackwardArgs) error {
			if b.rec.mode.Load() == 0 {
				return f(a)
			}
			s := b.begin()
			return b.end(s, f(a), "MoEPermuteBackward", backend.MoEPermuteBackwardCost(a), T{})
		}
	}
	if f := in.MoECombine; f != nil {
		out.MoECombine = func(a backend.MoECombineArgs) error {
			if b.rec.mode.Load() == 0 {
				return f(a)
			}
			s := b.begin()
			return b.end(s, f(a), "MoECombine", backend.MoECombineCost(a), a.Out)
		}
	}
	if f := in.MoECombineBackward; f != nil {
		out.MoECombineBackward = func(a backend.MoECombineBackwardArgs) error {
			if b.rec.mode.Load() == 0 {
				return f(a)
			}
			s := b.begin()
			return b.end(s, f(a), "MoECombineBackward", backend.MoECombineBackwardCost(a), T{})
		}
	}
	if f := in.SwiGLUPacked; f != nil {
		out.SwiGLUPacked = func(o, gateUp T) error {
			if b.rec.mode.Load() == 0 {
				return f(o, gateUp)
			}
			s := b.begin()
			return b.end(s, f(o, gateUp), "SwiGLUPacked", backend.SwiGLUPackedCost(o, gateUp), o)
		}
	}
	if f := in.SwiGLUPackedBackward; f != nil {
		out.SwiGLUPackedBackward = func(dGateUp, dOut, gateUp T) error {
			if b.rec.mode.Load() == 0 {
				return f(dGateUp, dOut, gateUp)
			}
			s := b.begin()
			return b.end(s, f(dGateUp, dOut, gateUp), "SwiGLUPackedBackward", backend.SwiGLUPackedBackwardCost(dGateUp, dOut, gateUp), T{})
		}
	}
	if f := in.GeGLUPacked; f != nil {
		out.GeGLUPacked = func(o, gateUp T) error {
			if b.rec.mode.Load() == 0 {
				return f(o, gateUp)
			}
			s := b.begin()
			return b.end(s, f(o, gateUp), "GeGLUPacked", backend.GeGLUPackedCost(o, gateUp), o)
		}
	}
	if f := in.GeGLUPackedBackward; f != nil {
		out.GeGLUPackedBackward = func(dGateUp, dOut, gateUp T) error {
			if b.rec.mode.Load() == 0 {
				return f(dGateUp, dOut, gateUp)
			}
			s := b.begin()
			return b.end(s, f(dGateUp, dOut, gateUp), "GeGLUPackedBackward", backend.GeGLUPackedBackwardCost(dGateUp, dOut, gateUp), T{})
		}
	}
}
