package server

import (
	"testing"

	"connectrpc.com/connect/v2"

	"github.com/halo-shell/halo-shell/session"
)

// TestLoRASession trains adapters in a session, reads their norms and generates with the
// adapters on and off.
func TestLoRASession(t *testing.T) {
	_, c := loaded(t, "--use_peft=true", "--lora_target_modules=all-linear", "--lora_r=4", "--learning_rate=5e-2")
	ctx := ctxT(t)
	r, err := c.Inspect(ctx, &session.InspectRequest{Kind: "adapter"})
	if err != nil {
		t.Fatal(err)
	}
	// 2 layers x (q, k, v, o, gate, up, down).
	if len(r.Adapters) != 14 || r.Adapters[0].Module != "model.layers.0.self_attn.q_proj" || r.Adapters[0].Layer != 0 {
		t.Fatalf("adapters %v", r.Adapters)
	}
	for _, a := range r.Adapters {
		if a.ANorm <= 0 || a.BNorm != 0 || a.DeltaNorm != 0 {
			t.Fatalf("fresh adapter %v: want A drawn, B and the update zero", a)
		}
	}
	gen := func(off bool) string {
		s, err := c.Generate(ctx, &session.GenerateRequest{Prompt: "What is 2+3?", Chat: true, MaxNewTokens: 8, WithoutAdapter: off}, nil)
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	base := gen(true)
	if on := gen(false); on != base {
		t.Fatalf("zero adapters changed generation: %q vs base %q", on, base)
	}
	if _, err := c.Step(ctx, 8); err != nil {
		t.Fatal(err)
	}
	r, err = c.Inspect(ctx, &session.InspectRequest{Kind: "adapter"})
	if err != nil {
		t.Fatal(err)
	}
	if r.Step != 8 || !(r.Adapters[0].BNorm > 0 && r.Adapters[0].DeltaNorm > 0) {
		t.Fatalf("after 8 steps: step %d, adapter %v", r.Step, r.Adapters[0])
	}
	if got := gen(true); got != base {
		t.Fatalf("generation with the adapters off changed after training them: %q vs %q (the base is frozen)", got, base)
	}
	if _, err := c.Inspect(ctx, &session.InspectRequest{Kind: "lora"}); connect.CodeOf(err) != connect.CodeInvalidArgument {
		t.Fatalf("kind lora: %v", err)
	}
}

func TestLoRASessionRefusesWithoutAdapters(t *testing.T) {
	_, c := loaded(t)
	ctx := ctxT(t)
	_, err := c.Inspect(ctx, &session.InspectRequest{Kind: "adapter"})
	mustContain(t, err, "no LoRA adapters", "use_peft")
	_, err = c.Generate(ctx, &session.GenerateRequest{Prompt: "x", MaxNewTokens: 2, WithoutAdapter: true}, nil)
	mustContain(t, err, "without_adapter", "no LoRA adapters")
}
