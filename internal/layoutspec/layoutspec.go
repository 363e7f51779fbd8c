// Package layoutspec is the written form of device lists and parallel layouts: "cpu:4",
// "cuda:0-7", "ep=2 tp=2", and the layout words a live session takes ("tp=2 fsdp
// devices=cpu:4"). It reads and writes those strings and checks their syntax and ranges, with
// the error messages people see, and nothing else.
//
// It is a leaf, shared by the engine and its clients: engine/mesh reads layouts and devices
// through it (and adds the rules that need a model), engine/train splits a session's layout
// words with it, and front ends (cell, repl, kernel) check a layout before sending it, without
// linking the engine. Whether a layout suits a model and its devices is engine/mesh's Check;
// this package does not know models.
//
// Errors name the string and the word that is wrong, without a package prefix: the caller
// adds its own ("mesh: layout \"pp=2\": unknown key ...").
package layoutspec

import (
	"fmt"
	"strconv"
	"strings"
)

// MaxDevices bounds device lists and degrees read from outside input.
const MaxDevices = 4096

// Devices is a device list: one kind ("cpu" or "cuda") and the device indices. For "cpu" the
// indices are simulated devices 0..n-1 in one process.
type Devices struct {
	Kind string
	IDs  []int
}

// String formats d the way ParseDevices reads it ("cpu:4", "cuda:0-7", "cuda:0,2"); the zero
// Devices is "".
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
		if err != nil || n < 1 || n > MaxDevices {
			return Devices{}, fmt.Errorf("devices %q: after cpu: give the number of simulated devices, 1 to %d (e.g. cpu:4)", s, MaxDevices)
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
			if err != nil || a < 0 || b < a || b >= MaxDevices {
				return Devices{}, fmt.Errorf("devices %q: %q is not a device index or an ascending range like 0-7", s, part)
			}
			for i := a; i <= b; i++ {
				if len(ids) > 0 && i <= ids[len(ids)-1] {
					return Devices{}, fmt.Errorf("devices %q: device %d is listed twice or out of order; list ids ascending", s, i)
				}
				ids = append(ids, i)
			}
		}
		return Devices{Kind: "cuda", IDs: ids}, nil
	}
	return Devices{}, fmt.Errorf("devices %q: unknown kind %q (use cpu, cpu:N, cuda, cuda:0-7 or cuda:0,2)", s, kind)
}

// Layout is the degrees a layout string gives. A degree of 0 is one the string leaves out:
// 1, except DP, which then follows from the devices. The fields are engine/mesh.Layout's, in
// its order, so that each converts to the other.
type Layout struct {
	DP   int  // data-parallel degree
	FSDP bool // parameters, gradients and optimizer state sharded over the data ranks
	TP   int  // tensor-parallel degree
	CP   int  // context-parallel degree
	EP   int  // expert-parallel degree
	ETP  int  // expert-tensor-parallel degree
}

func one(v int) int {
	if v <= 0 {
		return 1
	}
	return v
}

// String formats l as ParseLayout reads it, every degree written out (a left-out one as 1):
// "dp=2 fsdp tp=2 cp=1 ep=1 etp=1".
func (l Layout) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "dp=%d", one(l.DP))
	if l.FSDP {
		b.WriteString(" fsdp")
	}
	fmt.Fprintf(&b, " tp=%d cp=%d ep=%d etp=%d", one(l.TP), one(l.CP), one(l.EP), one(l.ETP))
	return b.String()
}

// fields splits layout words at spaces, commas and tabs.
func fields(s string) []string {
	return strings.FieldsFunc(s, func(r rune) bool { return r == ' ' || r == ',' || r == '\t' })
}

// ParseLayout reads a layout from words separated by spaces or commas: dp=N, tp=N, cp=N, ep=N,
// etp=N, fsdp (or fsdp=true/false); keys are case-insensitive and each may be given once.
// Omitted degrees are 0 (see Layout). Example: "ep=2 tp=2".
func ParseLayout(s string) (Layout, error) {
	var l Layout
	seen := map[string]bool{}
	for _, w := range fields(s) {
		k, v, hasV := strings.Cut(w, "=")
		k = strings.ToLower(k)
		if seen[k] {
			return Layout{}, fmt.Errorf("layout %q: %s is given twice", s, k)
		}
		seen[k] = true
		if k == "fsdp" {
			switch strings.ToLower(v) {
			case "", "true", "1", "on", "yes":
				l.FSDP = true
			case "false", "0", "off", "no":
				l.FSDP = false
			default:
				return Layout{}, fmt.Errorf("layout %q: fsdp=%s: use fsdp, fsdp=true or fsdp=false", s, v)
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
			return Layout{}, fmt.Errorf("layout %q: unknown key %q (keys: dp, fsdp, tp, cp, ep, etp)", s, k)
		}
		n, err := strconv.Atoi(v)
		if !hasV || err != nil || n < 1 || n > MaxDevices {
			return Layout{}, fmt.Errorf("layout %q: %s needs a degree from 1 to %d, like %s=2", s, k, MaxDevices, k)
		}
		*dst = n
	}
	return l, nil
}

// SplitSpec splits the layout words a session takes ("tp=2 fsdp devices=cpu:4") into the
// layout words ("tp=2 fsdp", for ParseLayout) and the device list of a devices= word ("cpu:4",
// for ParseDevices; "" when there is none). The devices key is case-insensitive and may be
// given once.
func SplitSpec(spec string) (layout, devices string, err error) {
	var words []string
	for _, w := range fields(spec) {
		if k, v, ok := strings.Cut(w, "="); ok && strings.EqualFold(k, "devices") {
			if devices != "" {
				return "", "", fmt.Errorf("layout %q: devices is given twice", spec)
			}
			devices = v
			continue
		}
		words = append(words, w)
	}
	return strings.Join(words, " "), devices, nil
}

// CheckSpec checks the syntax of a session's layout words (SplitSpec, then ParseLayout and,
// when a devices= word is given, ParseDevices), so that a misspelt word is caught before it is
// sent. It returns the first error; nil means the session will read the words (it may still
// refuse the layout for the model or the devices of the run).
func CheckSpec(spec string) error {
	words, devs, err := SplitSpec(spec)
	if err != nil {
		return err
	}
	if _, err := ParseLayout(words); err != nil {
		return err
	}
	if devs != "" {
		if _, err := ParseDevices(devs); err != nil {
			return err
		}
	}
	return nil
}
