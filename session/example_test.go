package session_test

import (
	"context"
	"fmt"
	"log"

	"github.com/halo-shell/halo-shell/session"
)

// A front-end attaches to the default session (starting it when none runs), loads a config,
// watches events while stepping, and profiles.
func Example() {
	ctx := context.Background()
	c, err := session.DialOrStart(ctx, session.DefaultName, session.Options{ClientName: "repl"}, session.StartOptions{})
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()

	events, streamErr, err := c.Events(ctx, 0)
	if err != nil {
		log.Fatal(err)
	}
	go func() {
		for ev := range events {
			if m := ev.GetMetrics(); m != nil {
				fmt.Printf("step %d loss %.4f\n", m.Step, m.Loss)
			}
			if d := ev.GetDropped(); d != nil {
				fmt.Printf("(%d events dropped)\n", d.Count)
			}
		}
		if err := streamErr(); err != nil {
			log.Print(err)
		}
	}()

	if _, err := c.Load(ctx, "examples/quickstart.yaml", "sft"); err != nil {
		log.Fatal(err)
	}
	if _, err := c.Step(ctx, 5); session.IsNotController(err) {
		// Another client controls the session: observe, or take over.
		if _, err := c.TakeOver(ctx); err != nil {
			log.Fatal(err)
		}
	}
	if _, err := c.SetLR(ctx, 1e-3); err != nil {
		log.Fatal(err)
	}
	p, err := c.Profile(ctx, 3, false)
	if err != nil {
		log.Fatal(err)
	}
	for _, s := range p.Steps {
		fmt.Printf("step %d: %.1f ms, matmul %.1f ms, host %.1f ms\n", s.Step, 1e3*s.StepS, 1e3*s.ComputeS["matmul"], 1e3*s.HostS)
	}
}
