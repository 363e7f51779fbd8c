package cuda

// StreamOnThread returns the device's compute stream (a CUstream), on which every kernel, copy
// and memset of the device is queued. Call it only from a function run by Do: the stream
// belongs to the device goroutine. A library that enqueues work on it there (NCCL's
// collectives) is ordered with the device's own work by the stream alone: it runs after
// everything queued before it and before everything queued after it, without a host wait.
func (d *Device) StreamOnThread() uintptr { return d.stream }
