// Package profile measures where a training step's time goes.
//
// A Recorder collects spans: one per backend op (its op class, bytes and FLOPs from the cost
// table of engine/backend, cost.go, and its duration) and one per collective (its kind, bytes). Wrap puts a Recorder
// in front of a backend.Backend; while profiling is off the wrapper forwards every call and
// records nothing (one atomic load per op), while it is on each op is followed by a Sync so
// that asynchronous devices are charged for their own work. Per step, the wall time is split
// into compute by op class, communication by collective kind and host/idle time (the wall time
// minus every span), so the parts add up to the step time by construction. Steps can be
// exported as a Chrome/Perfetto trace (JSON).
//
// The package does not run steps or decide what to profile: the session (or a batch run)
// brackets each step with BeginStep and EndStep and turns recording on and off.
package profile
