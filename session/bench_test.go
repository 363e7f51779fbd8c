package session

import (
	"context"
	"io"
	"log/slog"
	"path/filepath"
	"sync"
	"testing"

	"github.com/halo-shell/halo-shell/engine/backend"
	"github.com/halo-shell/halo-shell/engine/backend/cpu"
	"github.com/halo-shell/halo-shell/engine/profile"
	"github.com/halo-shell/halo-shell/engine/train"
)

// quickstartTrainer builds the quickstart model (hidden 128, 3 layers, 16x32 tokens a step) on
// the CPU, with the cpu device registered by register.
func quickstartTrainer(b *testing.B, register backend.Factory) *train.Trainer {
	b.Helper()
	backend.Register("cpu", register)
	defer func() {
		profilingOnce = sync.Once{}
		EnableProfiling()
	}()
	cfg, err := train.LoadConfig("../examples/quickstart.yaml", "sft", []string{"--device=cpu", "--tokenizer_name_or_path=../examples/quickstart/tokenizer",
		"--output_dir=" + filepath.Join(b.TempDir(), "out"), "--dataset.synthetic.train=512", "--dataset.synthetic.eval=8"})
	if err != nil {
		b.Fatal(err)
	}
	t, err := train.New(cfg)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { t.Close() })
	return t
}

// BenchmarkTrainerStep compares an optimizer step on the plain CPU backend with the profiling
// wrapper off (the normal path) and on (a Sync after every op).
func BenchmarkTrainerStep(b *testing.B) {
	plain := func(i int) (backend.Backend, error) { return cpu.New(cpu.Options{}), nil }
	wrapped := func(i int) (backend.Backend, error) { return profile.Wrap(cpu.New(cpu.Options{}), nil), nil }
	for _, bc := range []struct {
		name    string
		factory backend.Factory
		record  bool
	}{{"plain", plain, false}, {"wrapped-off", wrapped, false}, {"wrapped-recording", wrapped, true}} {
		b.Run(bc.name, func(b *testing.B) {
			t := quickstartTrainer(b, bc.factory)
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
	s, err := NewServer(ServerOptions{Name: "bench", Socket: filepath.Join(b.TempDir(), "b.sock"), Logger: discardLogger()})
	if err != nil {
		b.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Serve(ctx) }()
	defer func() { cancel(); <-done }()
	c, err := Dial(s.Socket(), Options{})
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
