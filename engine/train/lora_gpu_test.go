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
