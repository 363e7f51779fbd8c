package bench

import (
	"time"

	"github.com/halo-shell/halo-shell/engine/backend"
	"github.com/halo-shell/halo-shell/engine/comm"
	"github.com/halo-shell/halo-shell/engine/profile"
)

// ShareMethod says how CommBreakdown's shares are computed; it is written into every report
// of a parallel layout.
const ShareMethod = "each device records its own compute ops and collectives (the profile spans the session's Profile shows; " +
	"every op synchronised, a collective's span includes waiting for the slowest rank); by_kind_s is the mean over devices " +
	"of the seconds in each collective kind, share = by_kind_s / wall_s with wall_s the mean over devices of the profiled " +
	"step's wall time; dispatch_fraction and combine_fraction are the shares of all_to_all_dispatch and all_to_all_combine " +
	"(the expert-parallel token exchange), comm_fraction that of every kind; bytes and calls are per device means from the " +
	"communicators' totals over the profiled step"

// CommBreakdown is the communication of the profiled step of a parallel layout.
type CommBreakdown struct {
	Method string `json:"method"`
	// WallS is the mean over devices of the step's wall time (the shares' denominator).
	WallS float64 `json:"wall_s"`
	// ByKindS is the mean over devices of the seconds in each collective kind.
	ByKindS map[string]float64 `json:"by_kind_s"`
	// Share is ByKindS / WallS.
	Share map[string]float64 `json:"share"`
	// DispatchFraction and CombineFraction are the shares of the expert-parallel
	// all-to-alls (0 without expert parallelism); CommFraction the share of every kind.
	DispatchFraction float64 `json:"dispatch_fraction"`
	CombineFraction  float64 `json:"combine_fraction"`
	CommFraction     float64 `json:"comm_fraction"`
	// Bytes and Calls are per device means over the profiled step, by kind.
	Bytes map[string]float64 `json:"bytes"`
	Calls map[string]float64 `json:"calls"`
	// PerDevice is each device's own figures.
	PerDevice []DeviceComm `json:"per_device"`
}

// DeviceComm is one device's collectives in the profiled step.
type DeviceComm struct {
	Rank             int                `json:"rank"`
	Device           string             `json:"device"`
	WallS            float64            `json:"wall_s"`
	ByKindS          map[string]float64 `json:"by_kind_s"`
	DispatchFraction float64            `json:"dispatch_fraction"`
	CombineFraction  float64            `json:"combine_fraction"`
}

// commBreakdown computes the communication figures from each device's step (steps[r] is rank
// r's), their mean and the communicators' totals before and after the step.
func commBreakdown(steps []profile.Step, mean profile.Step, before, after []comm.Stats, devs []backend.Backend) *CommBreakdown {
	c := &CommBreakdown{Method: ShareMethod, WallS: mean.Wall.Seconds(), ByKindS: map[string]float64{},
		Share: map[string]float64{}, Bytes: map[string]float64{}, Calls: map[string]float64{}}
	share := func(d, wall time.Duration) float64 {
		if wall <= 0 {
			return 0
		}
		return d.Seconds() / wall.Seconds()
	}
	var all time.Duration
	for k, d := range mean.Comm {
		c.ByKindS[k] = d.Seconds()
		c.Share[k] = share(d, mean.Wall)
		all += d
	}
	c.DispatchFraction = share(mean.Comm[comm.KindAllToAllDispatch], mean.Wall)
	c.CombineFraction = share(mean.Comm[comm.KindAllToAllCombine], mean.Wall)
	c.CommFraction = share(all, mean.Wall)
	for r, s := range steps {
		dc := DeviceComm{Rank: r, WallS: s.Wall.Seconds(), ByKindS: map[string]float64{},
			DispatchFraction: share(s.Comm[comm.KindAllToAllDispatch], s.Wall),
			CombineFraction:  share(s.Comm[comm.KindAllToAllCombine], s.Wall)}
		if r < len(devs) {
			dc.Device = devs[r].Name()
		}
		for k, d := range s.Comm {
			dc.ByKindS[k] = d.Seconds()
		}
		c.PerDevice = append(c.PerDevice, dc)
	}
	if len(after) > 0 && len(before) == len(after) {
		n := float64(len(after))
		for r, st := range after {
			for k, v := range st {
				b := before[r][k]
				c.Bytes[k] += float64(v.Bytes-b.Bytes) / n
				c.Calls[k] += float64(v.Calls-b.Calls) / n
			}
		}
	}
	return c
}
