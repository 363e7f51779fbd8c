package backend

import "time"

// DeviceTimer is the Optional.Timer of backends whose ops run asynchronously on a device queue
// (the CUDA backend). Profilers use it to time every op on the device without waiting for each:
//
//	Mark records a point in the device's queue, behind the work queued so far, and returns at
//	once;
//	Elapsed waits until the device has reached the later mark and returns the device time
//	between two marks;
//	Release hands marks back for reuse once their times have been read.
//
// The time between a mark taken before an op is queued and one taken after it is the op's time
// on the device (when the device was busy with earlier work, it starts at that work's end).
type DeviceTimer interface {
	Mark() (TimeMark, error)
	Elapsed(from, to TimeMark) (time.Duration, error)
	Release(marks ...TimeMark)
}

// TimeMark is a point in a device's queue (DeviceTimer); zero is no mark.
type TimeMark uintptr

// SyncCounter is the Optional.Syncs of backends that count the times the host waited for the
// device (the CUDA backend): stream, context and event synchronisations, the waits of downloads
// and of ops that read device data on the host. HostSyncs returns the total since the backend
// was opened; it may be called from any goroutine. A training step that lets the host run ahead
// of the device makes few: engine/profile reports the difference over each profiled step.
type SyncCounter interface {
	HostSyncs() int64
}
