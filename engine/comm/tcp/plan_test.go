package tcp

import (
	"fmt"
	"math"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/halo-shell/halo-shell/engine/backend"
	"github.com/halo-shell/halo-shell/engine/backend/cpu"
	"github.com/halo-shell/halo-shell/engine/comm"
	"github.com/halo-shell/halo-shell/engine/hf/config"
	"github.com/halo-shell/halo-shell/engine/mesh"
	"github.com/halo-shell/halo-shell/engine/models"
	"github.com/halo-shell/halo-shell/engine/optim"
	"github.com/halo-shell/halo-shell/engine/parallel"
)

// processesFabric presents the ranks of several simulated processes (each a tcp World of this
// test process, talking to the others over localhost TCP) as one comm.Fabric, so that a
// parallel plan, which drives every rank from one process, runs its collectives over TCP.
type processesFabric struct {
	ws    []*World
	local [][2]int // global rank -> (process, local rank)
}

func newProcessesFabric(devs []backend.Backend, ranks []int) (*processesFabric, error) {
	var bs [][]backend.Backend
	f := &processesFabric{}
	next := 0
	for p, n := range ranks {
		bs = append(bs, devs[next:next+n])
		for i := range n {
			f.local = append(f.local, [2]int{p, i})
		}
		next += n
	}
	if next != len(devs) {
		return nil, fmt.Errorf("layout %v has %d ranks, the plan %d", ranks, next, len(devs))
	}
	ws, err := joinBackends(bs, 60*time.Second)
	f.ws = ws
	return f, err
}

func (f *processesFabric) Size() int { return len(f.local) }

func (f *processesFabric) Comm(i int) comm.Communicator {
	pl := f.local[i]
	return f.ws[pl[0]].Comm(pl[1])
}

func (f *processesFabric) Split(name string, groups [][]int) ([]comm.Communicator, error) {
	out := make([]comm.Communicator, len(f.local))
	for _, w := range f.ws {
		cs, err := w.Split(name, groups)
		if err != nil {
			return nil, err
		}
		for i, c := range cs {
			out[w.FirstRank()+i] = c
		}
	}
	return out, nil
}

func (f *processesFabric) Abort(err error) {
	for _, w := range f.ws {
		w.Abort(err)
	}
}

func (f *processesFabric) Close() error { return closeAll(f.ws) }

const tinyLlama = `{"model_type": "llama", "vocab_size": 41, "hidden_size": 16, "intermediate_size": 24,
	"num_hidden_layers": 2, "num_attention_heads": 8, "num_key_value_heads": 4, "head_dim": 4,
	"max_position_embeddings": 64, "rms_norm_eps": 1e-6, "attention_bias": true, "initializer_range": 0.2}`

const tinyMoE = `{"model_type": "qwen3_moe", "vocab_size": 41, "hidden_size": 16, "intermediate_size": 24,
	"moe_intermediate_size": 8, "num_experts": 4, "num_experts_per_tok": 2, "norm_topk_prob": true,
	"mlp_only_layers": [0], "output_router_logits": true, "router_aux_loss_coef": 0.05,
	"num_hidden_layers": 2, "num_attention_heads": 8, "num_key_value_heads": 4, "head_dim": 4,
	"max_position_embeddings": 64, "rms_norm_eps": 1e-6, "initializer_range": 0.2}`

// rows makes packed rows of 16 tokens with documents of uneven length.
func rows(seed uint64) []models.Batch {
	rng := rand.New(rand.NewPCG(seed, 11))
	out := make([]models.Batch, 8)
	for r := range out {
		b := models.Batch{Tokens: make([]int32, 16), Targets: make([]int32, 16), DocStarts: []int32{0}}
		for i := range b.Tokens {
			b.Tokens[i] = int32(rng.IntN(41))
		}
		for pos := 0; pos < 16; {
			pos = min(pos+1+rng.IntN(12), 16)
			b.DocStarts = append(b.DocStarts, int32(pos))
		}
		for d := 0; d+1 < len(b.DocStarts); d++ {
			for i := b.DocStarts[d]; i < b.DocStarts[d+1]; i++ {
				b.Targets[i] = backend.IgnoreIndex
				if i+1 < b.DocStarts[d+1] {
					b.Targets[i] = b.Tokens[i+1]
				}
			}
		}
		out[r] = b
	}
	return out
}

// train runs three steps of a plan and returns losses, gradient norms and final weights.
func train(t *testing.T, p *parallel.Plan) ([]float64, []float64, map[string][]float32) {
	t.Helper()
	var losses, norms []float64
	for step := range 3 {
		l, _, err := p.ForwardBackward(rows(uint64(100 + step)))
		if err != nil {
			t.Fatal(err)
		}
		n, err := p.Step(1e-2, 0.5)
		if err != nil {
			t.Fatal(err)
		}
		losses, norms = append(losses, l), append(norms, n)
	}
	params, err := p.Params()
	if err != nil {
		t.Fatal(err)
	}
	return losses, norms, params
}

// A parallel plan whose ranks talk over TCP between (simulated) processes trains exactly as
// with the in-process communicator: the same losses, gradient norms and weights, bit for bit.
func TestPlanOverProcessesIsBitIdenticalToInProcess(t *testing.T) {
	for _, c := range []struct {
		model, layout string
		ranks         []int
	}{
		{tinyLlama, "tp=2 fsdp", []int{2, 2}},
		{tinyMoE, "ep=2 fsdp", []int{1, 1, 1, 1}},
	} {
		t.Run(fmt.Sprint(c.layout, c.ranks), func(t *testing.T) {
			cfg, err := config.Parse([]byte(c.model), "config.json")
			if err != nil {
				t.Fatal(err)
			}
			src, err := models.New(cfg, cpu.New(cpu.Options{Workers: 1}), models.Options{})
			if err != nil {
				t.Fatal(err)
			}
			defer src.Close()
			if err := src.InitRandom(8); err != nil {
				t.Fatal(err)
			}
			l, err := mesh.ParseLayout(c.layout)
			if err != nil {
				t.Fatal(err)
			}
			n := 0
			for _, r := range c.ranks {
				n += r
			}
			devs, err := mesh.ParseDevices(fmt.Sprintf("cpu:%d", n))
			if err != nil {
				t.Fatal(err)
			}
			opt := optim.Config{WeightDecay: 0.1}
			ref, err := parallel.New(src, devs, l, parallel.Options{Optimizer: opt})
			if err != nil {
				t.Fatal(err)
			}
			defer ref.Close()
			var fab *processesFabric
			over, err := parallel.New(src, devs, l, parallel.Options{Optimizer: opt, World: func(ds []backend.Backend) (comm.Fabric, error) {
				f, err := newProcessesFabric(ds, c.ranks)
				fab = f
				return f, err
			}})
			if err != nil {
				t.Fatal(err)
			}
			wantLoss, wantNorm, wantParams := train(t, ref)
			gotLoss, gotNorm, gotParams := train(t, over)
			for i := range wantLoss {
				if math.Float64bits(gotLoss[i]) != math.Float64bits(wantLoss[i]) || math.Float64bits(gotNorm[i]) != math.Float64bits(wantNorm[i]) {
					t.Errorf("step %d: loss %v norm %v over TCP, %v and %v in process", i+1, gotLoss[i], gotNorm[i], wantLoss[i], wantNorm[i])
				}
			}
			for name, want := range wantParams {
				got := gotParams[name]
				if len(got) != len(want) {
					t.Fatalf("%s: %d values over TCP, %d in process", name, len(got), len(want))
				}
				for i := range want {
					if math.Float32bits(got[i]) != math.Float32bits(want[i]) {
						t.Fatalf("%s[%d]: %v over TCP, %v in process", name, i, got[i], want[i])
					}
				}
			}
			// The collectives really crossed processes.
			var wire int64
			for _, w := range fab.ws {
				for _, p := range w.peers {
					if p != nil {
						wire += p.sent.Load()
					}
				}
			}
			if wire == 0 {
				t.Error("no bytes went over TCP")
			}
			if err := over.Close(); err != nil {
				t.Fatal(err)
			}
		})
	}
}
