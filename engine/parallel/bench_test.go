package parallel

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/halo-shell/halo-shell/engine/backend/cpu"
	"github.com/halo-shell/halo-shell/engine/comm"
	"github.com/halo-shell/halo-shell/engine/hf/config"
	"github.com/halo-shell/halo-shell/engine/mesh"
	"github.com/halo-shell/halo-shell/engine/models"
	"github.com/halo-shell/halo-shell/engine/optim"
)

// BenchmarkStep reports a full optimizer step (forward, backward, gradient reduction, AdamW)
// of a small Llama-shaped model on 4 simulated devices per layout, with tokens/s and the share
// of the step each rank spends inside collectives.
func BenchmarkStep(b *testing.B) {
	cfg, err := config.Parse([]byte(`{"model_type": "llama", "vocab_size": 512, "hidden_size": 128, "intermediate_size": 384,
		"num_hidden_layers": 4, "num_attention_heads": 8, "num_key_value_heads": 4, "head_dim": 16,
		"max_position_embeddings": 512, "rms_norm_eps": 1e-6}`), "bench.json")
	if err != nil {
		b.Fatal(err)
	}
	src, err := models.New(cfg, cpu.New(cpu.Options{Workers: 1}), models.Options{})
	if err != nil {
		b.Fatal(err)
	}
	defer src.Close()
	if err := src.InitRandom(1); err != nil {
		b.Fatal(err)
	}
	rows := tinyRows(4, 256, 512, 1)
	tokens := 4 * 256
	for _, layout := range []string{"", "fsdp", "tp=2", "tp=4", "cp=2", "cp=4", "tp=2 cp=2 fsdp"} {
		b.Run(strings.ReplaceAll(fmt.Sprintf("n4/%s", layout), " ", ","), func(b *testing.B) {
			l, _ := mesh.ParseLayout(layout)
			p, err := New(src, cpuDevices(4), l, Options{Optimizer: optim.Config{}})
			if err != nil {
				b.Fatal(err)
			}
			defer p.Close()
			start := time.Now()
			for b.Loop() {
				if _, _, err := p.ForwardBackward(rows); err != nil {
					b.Fatal(err)
				}
				if _, err := p.Step(1e-3, 1); err != nil {
					b.Fatal(err)
				}
			}
			wall := time.Since(start)
			var commT time.Duration
			for _, s := range p.CommStats() {
				t := s.Total().Time - s[comm.KindBarrier].Time
				commT += t
			}
			b.ReportMetric(float64(tokens*b.N)/wall.Seconds(), "tok/s")
			b.ReportMetric(100*commT.Seconds()/float64(len(p.ranks))/wall.Seconds(), "%comm")
		})
	}
}

// BenchmarkExpertStep reports a full optimizer step of a small Qwen3-MoE-shaped model (8
// experts, top 2) on 4 simulated devices per expert layout, with tokens/s, the share of the
// step each rank spends inside collectives, and the share inside the dispatch and combine
// all-to-alls.
func BenchmarkExpertStep(b *testing.B) {
	cfg, err := config.Parse([]byte(`{"model_type": "qwen3_moe", "vocab_size": 512, "hidden_size": 128, "intermediate_size": 384,
		"moe_intermediate_size": 128, "num_experts": 8, "num_experts_per_tok": 2, "norm_topk_prob": true,
		"output_router_logits": true, "router_aux_loss_coef": 0.01,
		"num_hidden_layers": 4, "num_attention_heads": 8, "num_key_value_heads": 4, "head_dim": 16,
		"max_position_embeddings": 512, "rms_norm_eps": 1e-6}`), "bench.json")
	if err != nil {
		b.Fatal(err)
	}
	src, err := models.New(cfg, cpu.New(cpu.Options{Workers: 1}), models.Options{})
	if err != nil {
		b.Fatal(err)
	}
	defer src.Close()
	if err := src.InitRandom(1); err != nil {
		b.Fatal(err)
	}
	rows := tinyRows(4, 256, 512, 1)
	tokens := 4 * 256
	for _, layout := range []string{"", "ep=2", "ep=4", "ep=4 fsdp", "tp=2 etp=2", "ep=2 tp=2 etp=2"} {
		b.Run(strings.ReplaceAll(fmt.Sprintf("n4/%s", layout), " ", ","), func(b *testing.B) {
			l, _ := mesh.ParseLayout(layout)
			p, err := New(src, cpuDevices(4), l, Options{Optimizer: optim.Config{}})
			if err != nil {
				b.Fatal(err)
			}
			defer p.Close()
			start := time.Now()
			for b.Loop() {
				if _, _, err := p.ForwardBackward(rows); err != nil {
					b.Fatal(err)
				}
				if _, err := p.Step(1e-3, 1); err != nil {
					b.Fatal(err)
				}
			}
			wall := time.Since(start)
			var commT, a2a time.Duration
			for _, s := range p.CommStats() {
				commT += s.Total().Time - s[comm.KindBarrier].Time
				a2a += s[comm.KindAllToAllDispatch].Time + s[comm.KindAllToAllCombine].Time
			}
			ranks := float64(len(p.ranks)) * wall.Seconds()
			b.ReportMetric(float64(tokens*b.N)/wall.Seconds(), "tok/s")
			b.ReportMetric(100*commT.Seconds()/ranks, "%comm")
			b.ReportMetric(100*a2a.Seconds()/ranks, "%a2a")
		})
	}
}
