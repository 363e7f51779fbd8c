package optim

import (
	"fmt"
	"math"
)

// Schedule is a learning-rate schedule with Hugging Face transformers' get_scheduler semantics.
type Schedule struct {
	// Kind: "constant", "constant_with_warmup", "linear", "cosine" or "cosine_with_min_lr".
	Kind string
	// LR is the peak (initial) learning rate.
	LR float64
	// WarmupSteps ramps the rate linearly from 0 over this many steps (ignored by "constant",
	// as in HF).
	WarmupSteps int
	// TotalSteps is num_training_steps (linear and cosine kinds).
	TotalSteps int
	// NumCycles is the number of cosine waves; 0 means 0.5 (HF default: decay to zero once).
	NumCycles float64
	// MinLR (cosine_with_min_lr) is the floor; MinLRRate is the floor as a fraction of LR and is
	// used when MinLR is 0.
	MinLR, MinLRRate float64
}

// Validate reports schedule settings that cannot work, naming the field.
func (s Schedule) Validate() error {
	switch s.Kind {
	case "constant", "constant_with_warmup", "linear", "cosine", "cosine_with_min_lr":
	default:
		return fmt.Errorf("optim: lr_scheduler_type %q is not supported (use constant, constant_with_warmup, linear, cosine or cosine_with_min_lr)", s.Kind)
	}
	if s.LR < 0 || math.IsNaN(s.LR) || math.IsInf(s.LR, 0) {
		return fmt.Errorf("optim: learning_rate %v must be a finite number >= 0", s.LR)
	}
	if s.WarmupSteps < 0 {
		return fmt.Errorf("optim: warmup_steps %d must be >= 0", s.WarmupSteps)
	}
	if (s.Kind == "linear" || s.Kind == "cosine" || s.Kind == "cosine_with_min_lr") && s.TotalSteps <= 0 {
		return fmt.Errorf("optim: lr_scheduler_type %s needs the total number of steps (max_steps) > 0", s.Kind)
	}
	if s.Kind == "cosine_with_min_lr" && s.MinLR == 0 && s.MinLRRate == 0 {
		return fmt.Errorf("optim: cosine_with_min_lr needs min_lr or min_lr_rate")
	}
	return nil
}

// Factor is the multiplier of LR at step (HF's lr_lambda(current_step)), where step counts the
// optimizer steps already taken: the first update uses Factor(0).
func (s Schedule) Factor(step int) float64 {
	warm := float64(step) / float64(max(1, s.WarmupSteps))
	switch s.Kind {
	case "constant":
		return 1
	case "constant_with_warmup":
		if step < s.WarmupSteps {
			return warm
		}
		return 1
	case "linear":
		if step < s.WarmupSteps {
			return warm
		}
		return math.Max(0, float64(s.TotalSteps-step)/float64(max(1, s.TotalSteps-s.WarmupSteps)))
	case "cosine", "cosine_with_min_lr":
		if step < s.WarmupSteps {
			return warm
		}
		cycles := s.NumCycles
		if cycles == 0 {
			cycles = 0.5
		}
		progress := float64(step-s.WarmupSteps) / float64(max(1, s.TotalSteps-s.WarmupSteps))
		f := 0.5 * (1 + math.Cos(math.Pi*cycles*2*progress))
		if s.Kind == "cosine_with_min_lr" {
			rate := s.MinLRRate
			if s.MinLR != 0 && s.LR != 0 {
				rate = s.MinLR / s.LR
			}
			f = f*(1-rate) + rate
		}
		return math.Max(0, f)
	}
	return 0
}

// At returns the learning rate for the update that follows step completed steps.
func (s Schedule) At(step int) float64 { return s.LR * s.Factor(step) }
