package mesh

import (
	"fmt"
	"strconv"
	"strings"
)

// maxDevices bounds device lists and degrees read from outside input.
const maxDevices = 4096

// Devices is the list of devices of a run: one kind ("cpu" or "cuda") and their indices.
// For "cpu", the indices are simulated devices 0..n-1 in one process.
type Devices struct {
	Kind string
	IDs  []int
}

// Len is the number of devices.
func (d Devices) Len() int { return len(d.IDs) }

// String formats d the way ParseDevices reads it ("cpu:4", "cuda:0-7", "cuda:0,2").
func (d Devices) String() string {
	if d.Kind == "" {
		return ""
	}
	if d.Kind == "cpu" {
		return fmt.Sprintf("cpu:%d", len(d.IDs))
	}
	contiguous := len(d.IDs) > 1
	for i := 1; i < len(d.IDs); i++ {
		if d.IDs[i] != d.IDs[i-1]+1 {
			contiguous = false
		}
	}
	if contiguous {
		return fmt.Sprintf("%s:%d-%d", d.Kind, d.IDs[0], d.IDs[len(d.IDs)-1])
	}
	parts := make([]string, len(d.IDs))
	for i, id := range d.IDs {
		parts[i] = strconv.Itoa(id)
	}
	return d.Kind + ":" + strings.Join(parts, ",")
}

// ParseDevices reads a device list: "cpu" (one simulated device), "cpu:N" (N simulated
// devices), "cuda" (device 0), "cuda:3", "cuda:0-7" or "cuda:0,2,5" (ids ascending, distinct).
func ParseDevices(s string) (Devices, error) {
	s = strings.TrimSpace(s)
	kind, spec, has := strings.Cut(s, ":")
	switch kind {
	case "cpu":
		if !has {
			return Devices{Kind: "cpu", IDs: []int{0}}, nil
		}
		n, err := strconv.Atoi(spec)
		if err != nil || n < 1 || n > maxDevices {
			return Devices{}, fmt.Errorf("mesh: devices %q: after cpu: give the number of simulated devices, 1 to %d (e.g. cpu:4)", s, maxDevices)
		}
		ids := make([]int, n)
		for i := range ids {
			ids[i] = i
		}
		return Devices{Kind: "cpu", IDs: ids}, nil
	case "cuda":
		if !has {
			return Devices{Kind: "cuda", IDs: []int{0}}, nil
		}
		var ids []int
		for _, part := range strings.Split(spec, ",") {
			lo, hi, isRange := strings.Cut(part, "-")
			a, err := strconv.Atoi(lo)
			b := a
			if err == nil && isRange {
				b, err = strconv.Atoi(hi)
			}
			if err != nil || a < 0 || b < a || b >= maxDevices {
				return Devices{}, fmt.Errorf("mesh: devices %q: %q is not a device index or an ascending range like 0-7", s, part)
			}
			for i := a; i <= b; i++ {
				if len(ids) > 0 && i <= ids[len(ids)-1] {
					return Devices{}, fmt.Errorf("mesh: devices %q: device %d is listed twice or out of order; list ids ascending", s, i)
				}
				ids = append(ids, i)
			}
		}
		return Devices{Kind: "cuda", IDs: ids}, nil
	}
	return Devices{}, fmt.Errorf("mesh: devices %q: unknown kind %q (use cpu, cpu:N, cuda, cuda:0-7 or cuda:0,2)", s, kind)
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
func (l Layout) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "dp=%d", one(l.DP))
	if l.FSDP {
		b.WriteString(" fsdp")
	}
	fmt.Fprintf(&b, " tp=%d cp=%d ep=%d etp=%d", one(l.TP), one(l.CP), one(l.EP), one(l.ETP))
	return b.String()
}

// ParseLayout reads a layout from words separated by spaces or commas: dp=N, tp=N, cp=N, ep=N,
// etp=N, fsdp (or fsdp=true/false). Omitted degrees are 1, except dp, which follows from the
// devices. Example: "ep=2 tp=2".
func ParseLayout(s string) (Layout, error) {
	var l Layout
	seen := map[string]bool{}
	for _, w := range strings.FieldsFunc(s, func(r rune) bool { return r == ' ' || r == ',' || r == '\t' }) {
		k, v, hasV := strings.Cut(w, "=")
		k = strings.ToLower(k)
		if seen[k] {
			return Layout{}, fmt.Errorf("mesh: layout %q: %s is given twice", s, k)
		}
		seen[k] = true
		if k == "fsdp" {
			switch strings.ToLower(v) {
			case "", "true", "1", "on", "yes":
				l.FSDP = true
			case "false", "0", "off", "no":
				l.FSDP = false
			default:
				return Layout{}, fmt.Errorf("mesh: layout %q: fsdp=%s: use fsdp, fsdp=true or fsdp=false", s, v)
			}
			continue
		}
		var dst *int
		switch k {
		case "dp":
			dst = &l.DP
		case "tp":
			dst = &l.TP
		case "cp":
			dst = &l.CP
		case "ep":
			dst = &l.EP
		case "etp":
			dst = &l.ETP
		default:
			return Layout{}, fmt.Errorf("mesh: layout %q: unknown key %q (keys: dp, fsdp, tp, cp, ep, etp)", s, k)
		}
		n, err := strconv.Atoi(v)
		if !hasV || err != nil || n < 1 || n > maxDevices {
			return Layout{}, fmt.Errorf("mesh: layout %q: %s needs a degree from 1 to %d, like %s=2", s, k, maxDevices, k)
		}
		*dst = n
	}
	return l, nil
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
