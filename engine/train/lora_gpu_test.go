package train

import (
	"math"
	"strings"
	"testing"

	"github.com/halo-shell/halo-shell/engine/backend/cuda"
)

// TestLoRAOnGPUMatchesCPU trains LoRA adapters (all-linear, dropout, gradient checkpointing)
// on one GPU and on the CPU oracle from the same start: the adapter path uses only the
// backend contract's GEMM, ScaleRows and Add, so the losses agree within fp32 reordering.
// It skips without a CUDA GPU.
func TestLoRAOnGPUMatchesCPU(t *testing.T) {
	if err := cuda.Available(); err != nil {
		t.Skipf("needs a CUDA GPU: %v", strings.SplitN(err.Error(), "\n", 2)[0])
	}
	path := writeJSONL(t, t.TempDir(), "d.jsonl", pcRecords(40))
	extra := []string{"--use_peft=true", "--lora_target_modules=all-linear", "--lora_dropout=0.1", "--gradient_checkpointing=true",
		"--lora_r=4", "--learning_rate=1e-2"}
	cpuLoss := steps(t, newTrainer(t, tinyConfig(t, path, append(extra, "--device=cpu")...)), 5)
	gpu := newTrainer(t, tinyConfig(t, path, append(extra, "--device=cuda")...))
	gpuLoss := steps(t, gpu, 5)
	for i := range cpuLoss {
		if d := math.Abs(gpuLoss[i]-cpuLoss[i]) / math.Abs(cpuLoss[i]); d > 1e-4 {
			t.Fatalf("step %d: GPU loss %v, CPU %v (relative difference %.2g)", i+1, gpuLoss[i], cpuLoss[i], d)
		}
	}
	if gpu.model.Grads != nil {
		t.Fatal("the GPU LoRA run allocated base gradients")
	}
}

// TestQLoRAOnGPUMatchesCPU is the same comparison with the base's linears in NF4
// (load_in_4bit, double quantisation): the CUDA DequantNF4 kernel writes the bits of the CPU
// oracle, so the GPU losses follow the CPU's within fp32 reordering, in f32 and in bf16 (there
// within bf16 rounding). It skips without a CUDA GPU.
func TestQLoRAOnGPUMatchesCPU(t *testing.T) {
	if err := cuda.Available(); err != nil {
		t.Skipf("needs a CUDA GPU: %v", strings.SplitN(err.Error(), "\n", 2)[0])
	}
	path := writeJSONL(t, t.TempDir(), "d.jsonl", pcRecords(40))
	for _, c := range []struct {
		name string
		dt   []string
		tol  float64
	}{{"f32", nil, 1e-4}, {"bf16", []string{"--bf16=true"}, 2e-2}} {
		t.Run(c.name, func(t *testing.T) {
			extra := append([]string{"--use_peft=true", "--load_in_4bit=true", "--use_bnb_nested_quant=true",
				"--lora_target_modules=all-linear", "--gradient_checkpointing=true", "--lora_r=4", "--learning_rate=1e-2"}, c.dt...)
			cpuLoss := steps(t, newTrainer(t, tinyConfig(t, path, append(extra, "--device=cpu")...)), 5)
			gpu := newTrainer(t, tinyConfig(t, path, append(extra, "--device=cuda")...))
			if ok, _, _ := gpu.model.Quantized(); !ok {
				t.Fatal("load_in_4bit left the GPU base in full precision")
			}
			gpuLoss := steps(t, gpu, 5)
			for i := range cpuLoss {
				if d := math.Abs(gpuLoss[i]-cpuLoss[i]) / math.Abs(cpuLoss[i]); d > c.tol {
					t.Fatalf("step %d: GPU loss %v, CPU %v (relative difference %.2g)", i+1, gpuLoss[i], cpuLoss[i], d)
				}
			}
		})
	}
}
