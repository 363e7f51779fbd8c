package optim_test

import (
	"fmt"

	"github.com/halo-shell/halo-shell/engine/backend"
	"github.com/halo-shell/halo-shell/engine/backend/cpu"
	"github.com/halo-shell/halo-shell/engine/optim"
	"github.com/halo-shell/halo-shell/engine/tensor"
)

// One optimizer step: global grad norm, clipping coefficient, scheduled learning rate, update.
func ExampleNewAdamW() {
	b := cpu.New(cpu.Options{})
	defer b.Close()
	w, _ := backend.FromFloat32(b, []float32{1, -1, 0.5, 2}, tensor.F32, 2, 2)
	gw, _ := backend.FromFloat32(b, []float32{3, 0, -4, 0}, tensor.F32, 2, 2)
	bias, _ := backend.FromFloat32(b, []float32{0.1, 0.2}, tensor.F32, 2)
	gb, _ := backend.FromFloat32(b, []float32{0, 0}, tensor.F32, 2)
	opt, err := optim.NewAdamW(b, []optim.Param{
		{Name: "w", Value: w, Grad: gw, NoDecay: optim.NoDecayByShape(w.Shape())},
		{Name: "b", Value: bias, Grad: gb, NoDecay: optim.NoDecayByShape(bias.Shape())},
	}, optim.Config{WeightDecay: 0.1})
	if err != nil {
		fmt.Println(err)
		return
	}
	defer opt.Free()
	sched := optim.Schedule{Kind: "cosine", LR: 0.1, WarmupSteps: 1, TotalSteps: 10}
	norm, _ := optim.GradNorm(b, []tensor.Tensor{gw, gb})
	coef := optim.ClipCoef(norm, 1.0)
	lr := sched.At(1) // the second update: warmup is over
	if err := opt.Step(lr, coef); err != nil {
		fmt.Println(err)
		return
	}
	got, _ := backend.ToFloat32(b, w)
	fmt.Printf("norm %.1f clip %.3f lr %.4f\nw %.4f\n", norm, coef, lr, got)
	// Output:
	// norm 5.0 clip 0.200 lr 0.1000
	// w [0.8900 -0.9900 0.5950 1.9800]
}
