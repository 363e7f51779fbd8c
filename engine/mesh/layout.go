package mesh

import (
	"fmt"

	"github.com/halo-shell/halo-shell/internal/layoutspec"
)

// maxDevices bounds device lists and degrees read from outside input.
const maxDevices = layoutspec.MaxDevices

// Devices is the list of devices of a run: one kind ("cpu" or "cuda") and their indices.
// For "cpu", the indices are simulated devices 0..n-1 in one process.
type Devices struct {
	Kind string
	IDs  []int
}

// Len is the number of devices.
func (d Devices) Len() int { return len(d.IDs) }

// String formats d the way ParseDevices reads it ("cpu:4", "cuda:0-7", "cuda:0,2").
func (d Devices) String() string { return layoutspec.Devices(d).String() }

// ParseDevices reads a device list: "cpu" (one simulated device), "cpu:N" (N simulated
// devices), "cuda" (device 0), "cuda:3", "cuda:0-7" or "cuda:0,2,5" (ids ascending, distinct).
// The syntax is internal/layoutspec's, which clients share.
func ParseDevices(s string) (Devices, error) {
	d, err := layoutspec.ParseDevices(s)
	if err != nil {
		return Devices{}, fmt.Errorf("mesh: %w", err)
	}
	return Devices(d), nil
}

// Layout is a parallel layout: the degree of each kind of parallelism. A degree of 0 is read as
// 1, except DP, where 0 means "whatever the devices leave" (devices / (TP·CP)).
type Layout struct {
	// DP is the data-parallel degree: replicas (or, with FSDP, shards) that each see their own
	// part of the batch.
	DP int
	// FSDP shards parameters, gradients and optimizer state over the data ranks (ZeRO-3 style:
	// parameters are all-gathered for compute, gradients reduce-scattered).
	FSDP bool
	// TP is the tensor-parallel degree: attention heads and the MLP width are split.
	TP int
	// CP is the context-parallel degree: each sequence is split over CP ranks.
	CP int
	// EP is the expert-parallel degree: experts are split over EP ranks of the data group.
	EP int
	// ETP is the expert-tensor-parallel degree: each expert's FFN is split over ETP ranks.
	ETP int
}

func one(v int) int {
	if v <= 0 {
		return 1
	}
	return v
}

// Norm returns l with zero degrees read as 1 and DP filled in from n devices (when TP·CP
// divides n; otherwise DP stays as given and Check reports the problem).
func (l Layout) Norm(n int) Layout {
	l.TP, l.CP, l.EP, l.ETP = one(l.TP), one(l.CP), one(l.EP), one(l.ETP)
	if l.DP <= 0 && n > 0 && n%(l.TP*l.CP) == 0 {
		l.DP = n / (l.TP * l.CP)
	}
	return l
}

// Size is the number of devices the layout uses (DP·CP·TP).
func (l Layout) Size() int { return one(l.DP) * one(l.CP) * one(l.TP) }

// String formats l as ParseLayout reads it, e.g. "dp=2 fsdp tp=2 cp=1 ep=1 etp=1".
func (l Layout) String() string { return layoutspec.Layout(l).String() }

// ParseLayout reads a layout from words separated by spaces or commas: dp=N, tp=N, cp=N, ep=N,
// etp=N, fsdp (or fsdp=true/false). Omitted degrees are 1, except dp, which follows from the
// devices. Example: "ep=2 tp=2". The syntax is internal/layoutspec's, which clients share.
func ParseLayout(s string) (Layout, error) {
	l, err := layoutspec.ParseLayout(s)
	if err != nil {
		return Layout{}, fmt.Errorf("mesh: %w", err)
	}
	return Layout(l), nil
}

// Config is the layout part of a run's YAML configuration. Zero values mean the defaults.
type Config struct {
	// Devices is the device list, e.g. "cpu:4" or "cuda:0-7" (default "cpu").
	Devices string `yaml:"devices" json:"devices"`
	// DataParallelShard turns on FSDP sharding over the data-parallel ranks.
	FSDP bool `yaml:"fsdp" json:"fsdp"`
	// TensorParallelSize is TP (default 1).
	TensorParallelSize int `yaml:"tensor_parallel_size" json:"tensor_parallel_size"`
	// ContextParallelSize is CP (default 1).
	ContextParallelSize int `yaml:"context_parallel_size" json:"context_parallel_size"`
	// ExpertParallelSize is EP (default 1).
	ExpertParallelSize int `yaml:"expert_parallel_size" json:"expert_parallel_size"`
	// ExpertTensorParallelSize is ETP (default 1).
	ExpertTensorParallelSize int `yaml:"expert_tensor_parallel_size" json:"expert_tensor_parallel_size"`
}

// Resolve reads the devices and returns them with the layout (DP follows from the devices).
// It checks syntax and ranges only; Check applies the rules that need the model.
func (c Config) Resolve() (Devices, Layout, error) {
	ds := c.Devices
	if ds == "" {
		ds = "cpu"
	}
	d, err := ParseDevices(ds)
	if err != nil {
		return Devices{}, Layout{}, err
	}
	for _, f := range []struct {
		key string
		v   int
	}{
		{"tensor_parallel_size", c.TensorParallelSize}, {"context_parallel_size", c.ContextParallelSize},
		{"expert_parallel_size", c.ExpertParallelSize}, {"expert_tensor_parallel_size", c.ExpertTensorParallelSize},
	} {
		if f.v < 0 || f.v > maxDevices {
			return Devices{}, Layout{}, fmt.Errorf("mesh: %s: %d must be between 1 and %d", f.key, f.v, maxDevices)
		}
	}
	l := Layout{FSDP: c.FSDP, TP: c.TensorParallelSize, CP: c.ContextParallelSize,
		EP: c.ExpertParallelSize, ETP: c.ExpertTensorParallelSize}
	return d, l.Norm(d.Len()), nil
}
