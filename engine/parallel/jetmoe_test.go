package parallel

import (
	"fmt"
	"math"
	"strings"
	"testing"

	"github.com/halo-shell/halo-shell/engine/mesh"
	"github.com/halo-shell/halo-shell/engine/models"
	"github.com/halo-shell/halo-shell/engine/optim"
)

// A tiny jetmoe: the mixture of attention heads over 2 key/value heads of 4 (4 experts, top
// 2), GLU experts with the output bias.
func init() {
	tinyConfigs["jetmoe"] = `{"model_type": "jetmoe", "vocab_size": 41, "hidden_size": 16, "num_hidden_layers": 2,
		"num_key_value_heads": 2, "kv_channels": 4, "intermediate_size": 12, "num_local_experts": 4,
		"num_experts_per_tok": 2, "max_position_embeddings": 64, "initializer_range": 0.2,
		"tie_word_embeddings": false, "bos_token_id": null, "eos_token_id": null}`
}

// TestJetMoeLayoutsMatchSingleDevice: jetmoe under data parallelism and FSDP gives the single
// device's loss and gradients; tensor, context and expert parallelism are refused by rule moa.
func TestJetMoeLayoutsMatchSingleDevice(t *testing.T) {
	src := tinyModel(t, "jetmoe", 3)
	checkWholeLayouts(t, src, mesh.RuleMoA)
}

// checkWholeLayouts runs src (a family whose parameters stay whole on every rank, without an
// aux loss) under data parallelism and FSDP on 2 and 4 simulated devices against the single
// device's loss and every gradient, and checks that tensor, context and expert parallelism are
// refused naming rule.
func checkWholeLayouts(t *testing.T, src *models.Model, rule string) {
	t.Helper()
	rows := tinyRows(4, 16, 41, 4)
	wantLoss, wantGrads, _ := referenceAux(t, src, rows)
	for _, tc := range []struct {
		n      int
		layout string
	}{{2, ""}, {2, "fsdp"}, {4, "fsdp"}} {
		t.Run(fmt.Sprintf("%d/%s", tc.n, tc.layout), func(t *testing.T) {
			p := newPlan(t, src, tc.n, tc.layout, optim.Config{})
			loss, _, err := p.ForwardBackward(rows)
			if err != nil {
				t.Fatal(err)
			}
			if math.Abs(loss-wantLoss) > 1e-6*math.Abs(wantLoss) {
				t.Errorf("loss %.9g, single device %.9g", loss, wantLoss)
			}
			grads, err := p.Grads()
			if err != nil {
				t.Fatal(err)
			}
			for _, s := range src.Specs {
				if err := closeTo(grads[s.Name], wantGrads[s.Name], 1e-5); err != nil {
					t.Errorf("gradient %s (%s): %v", s.Name, p.Placement(s.Name), err)
				}
			}
		})
	}
	for _, layout := range []string{"tp=2", "cp=2", "ep=2"} {
		l, err := mesh.ParseLayout(layout)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := New(src, cpuDevices(2), l, Options{}); err == nil || !strings.Contains(err.Error(), rule) {
			t.Errorf("%s: %v, want a refusal naming rule %s", layout, err, rule)
		}
	}
}
