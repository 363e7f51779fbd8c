package cell

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestLoRAAPI reads adapter norms and generates with the adapters off from a cell.
func TestLoRAAPI(t *testing.T) {
	sock := startSession(t)
	it, err := New(Options{Session: sock, ClientName: "cell-test"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { it.Close() })
	raw, err := os.ReadFile("testdata/tiny.yaml")
	if err != nil {
		t.Fatal(err)
	}
	cfg := filepath.Join(t.TempDir(), "lora.yaml")
	if err := os.WriteFile(cfg, append(raw, []byte("\nuse_peft: true\nlora_r: 2\nlora_target_modules: [q_proj, down_proj]\n")...), 0o644); err != nil {
		t.Fatal(err)
	}
	evalT(t, it, ":load "+cfg)
	evalT(t, it, ":step 3")
	r := evalT(t, it, "a := halo.Adapters()\nlen(a.Modules)")
	if plain(r.Value) != "4" {
		t.Fatalf("len(halo.Adapters().Modules) = %q, want 4 (q_proj and down_proj of 2 layers)", plain(r.Value))
	}
	r = evalT(t, it, "a.Modules[1].Module + \" \" + a.Table().Title")
	if got := plain(r.Value); !strings.Contains(got, "model.layers.0.mlp.down_proj") || !strings.Contains(got, "step 3") {
		t.Fatalf("adapter table: %q", got)
	}
	r = evalT(t, it, `a.Modules[0].Delta > 0 && len(halo.GenerateBase("What is 1+1?", 3)) >= 0`)
	if plain(r.Value) != "true" {
		t.Fatalf("trained adapter norms / GenerateBase: %q", plain(r.Value))
	}
}
