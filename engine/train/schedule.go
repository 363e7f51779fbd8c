package train

import (
	"math"

	"github.com/halo-shell/halo-shell/engine/optim"
)

// schedule is the learning-rate schedule of a run with hyperparameters h.
func (t *Trainer) schedule(h Hyper) optim.Schedule {
	return optim.Schedule{Kind: h.LRSchedulerType, LR: h.LearningRate, WarmupSteps: t.warmup, TotalSteps: t.totalSteps}
}

// warmupSteps resolves warmup_steps / warmup_ratio against the total number of steps (as
// Hugging Face does: ceil(ratio * total)).
func warmupSteps(s ScheduleConfig, total int) int {
	if s.WarmupSteps > 0 {
		return s.WarmupSteps
	}
	return int(math.Ceil(s.WarmupRatio * float64(total)))
}
