package backend

// DeviceProps are the sizes of a device that decide how large an experiment must be to show an
// effect on it: a copy that is to stay in cache must fit CacheBytes, a GEMM sweep that is to
// cross a wave boundary must count tiles in Units.
type DeviceProps struct {
	// Units are the parallel workers ops are spread over: the streaming multiprocessors of a
	// GPU, the worker threads of the CPU backend.
	Units int
	// CacheBytes is the last-level cache: the L2 of a GPU, the largest cache level of the CPU
	// the backend runs on; 0 when unknown.
	CacheBytes int64
}

// PropsReporter is implemented by backends that know their device's sizes.
type PropsReporter interface {
	DeviceProps() DeviceProps
}

// PropsOf returns b's DeviceProps, the zero value when b does not report them.
func PropsOf(b Backend) DeviceProps {
	if p, ok := b.(PropsReporter); ok {
		return p.DeviceProps()
	}
	return DeviceProps{}
}
