package cuda

import "github.com/halo-shell/halo-shell/engine/backend"

// DeviceProps implements backend.PropsReporter: the SMs and the L2 size the driver reports.
func (b *Backend) DeviceProps() backend.DeviceProps {
	return backend.DeviceProps{Units: b.d.info.SMs, CacheBytes: int64(b.d.info.L2Bytes)}
}
