package server

import (
	"context"
	"io"
	"log/slog"
	"path/filepath"
	"testing"

	"github.com/halo-shell/halo-shell/engine/backend"
	"github.com/halo-shell/halo-shell/engine/train"
	"github.com/halo-shell/halo-shell/session"
)

// quickstartTrainer builds the quickstart model (hidden 128, 3 layers, 16x32 tokens a step) on
// the CPU, its device passed through wrap (nil: the plain device).
func quickstartTrainer(b *testing.B, wrap func(backend.Backend) backend.Backend) *train.Trainer {
	b.Helper()
	cfg, err := train.LoadConfig("../../examples/quickstart.yaml", "sft", []string{"--device=cpu", "--tokenizer_name_or_path=../../examples/quickstart/tokenizer",
		"--output_dir=" + filepath.Join(b.TempDir(), "out"), "--dataset.synthetic.train=512", "--dataset.synthetic.eval=8"})
	if err != nil {
		b.Fatal(err)
	}
	t, err := train.NewWrapped(cfg, wrap)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { t.Close() })
	return t
}

// BenchmarkTrainerStep compares an optimizer step on the plain CPU backend with the profiling
// wrapper off (the normal path) and on (a Sync after every op).
func BenchmarkTrainerStep(b *testing.B) {
	for _, bc := range []struct {
		name   string
		wrap   func(backend.Backend) backend.Backend
		record bool
	}{{"plain", nil, false}, {"wrapped-off", Profiled, false}, {"wrapped-recording", Profiled, true}} {
		b.Run(bc.name, func(b *testing.B) {
			t := quickstartTrainer(b, bc.wrap)
			rec := recorderOf(t.Backend())
			if bc.record {
				rec.Enable(true, false)
			}
			ctx := context.Background()
			for b.Loop() {
				if rec != nil && bc.record {
					rec.BeginStep(0)
				}
				if _, err := t.Step(ctx); err != nil {
					b.Fatal(err)
				}
				if rec != nil && bc.record {
					if st, ok := rec.EndStep(); ok {
						b.ReportMetric(float64(st.Ops), "ops/step")
						b.ReportMetric(100*st.Host.Seconds()/st.Wall.Seconds(), "host%")
					}
					rec.Steps()
				}
			}
		})
	}
}

// BenchmarkStatusRPC is the round trip of a read-only call over the unix socket.
func BenchmarkStatusRPC(b *testing.B) {
	s, err := New(Options{Name: "bench", Socket: filepath.Join(b.TempDir(), "b.sock"), Logger: discardLogger()})
	if err != nil {
		b.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Serve(ctx) }()
	defer func() { cancel(); <-done }()
	c, err := session.Dial(s.Socket(), session.Options{})
	if err != nil {
		b.Fatal(err)
	}
	defer c.Close()
	for b.Loop() {
		if _, err := c.Status(ctx); err != nil {
			b.Fatal(err)
		}
	}
}

func discardLogger() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }
