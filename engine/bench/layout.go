package bench

import (
	"fmt"
	"strings"

	"github.com/halo-shell/halo-shell/engine/hf/config"
	"github.com/halo-shell/halo-shell/engine/mesh"
	"github.com/halo-shell/halo-shell/engine/parallel"
)

// runLayout is where a benchmark runs: one device (device, "" for Options.Device as given) or
// a parallel plan over devices with layout l.
type runLayout struct {
	parallel bool
	device   string // the one device named by Devices, e.g. "cuda:3"
	devices  mesh.Devices
	l        mesh.Layout
	// DP is the number of data ranks (1 on one device).
	DP int
}

// oneDevice is the device a one-device run opens: the one Devices names, else device
// (Options.Device: cpu, cuda, cuda:N or auto).
func (l runLayout) oneDevice(device string) string {
	if l.device != "" {
		return l.device
	}
	return device
}

// deviceKind is the config's device word for a device name: cuda:3 is cuda.
func deviceKind(dev string) string {
	kind, _, _ := strings.Cut(dev, ":")
	return kind
}

// layout resolves Devices and the degrees and, for a parallel run, applies the layout rules to
// the checkpoint's config.json (the check the trainer makes, made here before the tokenizer,
// the weights or the data are read).
func (o *Options) layout() (runLayout, error) {
	if o.Devices == "" {
		if o.TP > 1 || o.CP > 1 || o.EP > 1 || o.ETP > 1 || o.FSDP {
			return runLayout{}, fmt.Errorf("bench: a layout (tp %d, cp %d, ep %d, etp %d, fsdp %v) needs a device list: name the devices (--devices cpu:2, cuda:0-1)",
				o.TP, o.CP, o.EP, o.ETP, o.FSDP)
		}
		return runLayout{DP: 1}, nil
	}
	mc := mesh.Config{Devices: o.Devices, FSDP: o.FSDP, TensorParallelSize: o.TP, ContextParallelSize: o.CP,
		ExpertParallelSize: o.EP, ExpertTensorParallelSize: o.ETP}
	d, l, err := mc.Resolve()
	if err != nil {
		return runLayout{}, fmt.Errorf("bench: --devices %s: %w", o.Devices, err)
	}
	if o.Device != "" && o.Device != "auto" && o.Device != d.Kind {
		return runLayout{}, fmt.Errorf("bench: device %s and devices %s disagree: give the devices only", o.Device, o.Devices)
	}
	if d.Len() == 1 && l.Size() == 1 && l.EP == 1 && l.ETP == 1 && !l.FSDP {
		// One device, no layout: the one-device run on that device.
		dev := d.Kind
		if d.Kind != "cpu" {
			dev = fmt.Sprintf("%s:%d", d.Kind, d.IDs[0])
		}
		return runLayout{device: dev, DP: 1}, nil
	}
	cfg, err := config.Load(o.Model)
	if err != nil {
		return runLayout{}, fmt.Errorf("bench: model: %w", err)
	}
	shape, err := parallel.ShapeFromConfig(cfg)
	if err != nil {
		return runLayout{}, fmt.Errorf("bench: model %s: %w", o.Model, err)
	}
	if err := mesh.Check(l, d.Len(), shape, 0); err != nil {
		return runLayout{}, fmt.Errorf("bench: devices %s: %w", d, err)
	}
	l = l.Norm(d.Len())
	return runLayout{parallel: true, devices: d, l: l, DP: l.DP}, nil
}
