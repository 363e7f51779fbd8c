package cuda

import (
	"errors"
	"fmt"
	"runtime"
	"sync"
)

var keepAlive = runtime.KeepAlive

// libraries is the process-wide set of loaded CUDA libraries.
type libraries struct {
	drv   *driverAPI
	nvrtc *nvrtcAPI
	lt    *cublasLtAPI
	// err is why no GPU can be used (missing driver, cuInit failure, no device); nil when one can.
	err error
	// opsErr is why kernels or GEMMs cannot run (NVRTC or cuBLASLt missing) even though the
	// driver works.
	opsErr error
	// driverVersion is cuDriverGetVersion's number (13000 for 13.0).
	driverVersion int32
	deviceCount   int
}

var (
	libsOnce sync.Once
	libs     libraries
)

// loadLibraries loads every library once per process.
func loadLibraries() *libraries {
	libsOnce.Do(func() { libs = openLibraries(osSearchEnv()) })
	return &libs
}

func openLibraries(env searchEnv) libraries {
	var l libraries
	drv, err := loadDriver(env)
	l.drv = drv
	if err != nil {
		l.err = err
	} else if r := drv.cuInit(0); r != cuSuccess {
		l.err = fmt.Errorf("cuda: cuInit failed with the driver at %s: %w (is a GPU visible to this process? check nvidia-smi and CUDA_VISIBLE_DEVICES)", drv.info.Path, drv.check("cuInit", r))
	} else {
		var n int32
		if r := drv.cuDeviceGetCount(&n); r != cuSuccess {
			l.err = drv.check("cuDeviceGetCount", r)
		} else if n == 0 {
			l.err = errors.New("cuda: the driver loaded but reports no CUDA device (check nvidia-smi and CUDA_VISIBLE_DEVICES)")
		}
		l.deviceCount = int(n)
		drv.cuDriverGetVersion(&l.driverVersion)
	}
	var errs []error
	if l.nvrtc, err = loadNVRTC(env); err != nil {
		errs = append(errs, err)
	}
	if l.lt, err = loadCublasLt(env); err != nil {
		errs = append(errs, err)
	}
	l.opsErr = errors.Join(errs...)
	return l
}

// Available reports whether a CUDA GPU and every library this backend needs can be used. The
// error says which library or device is missing and what to set or install.
func Available() error {
	l := loadLibraries()
	if l.err != nil {
		return l.err
	}
	return l.opsErr
}

// DeviceCount is the number of CUDA devices the driver sees (0 without a usable driver).
func DeviceCount() int {
	l := loadLibraries()
	if l.err != nil {
		return 0
	}
	return l.deviceCount
}

// DeviceInfo describes one GPU.
type DeviceInfo struct {
	Ordinal int    `json:"ordinal"`
	Name    string `json:"name"`
	// Arch is the NVRTC target, e.g. "sm_90".
	Arch string `json:"arch"`
	// KernelArch is the architecture the kernels are built for: Arch, or the older one
	// HALO_CUDA_ARCH names (arch.go).
	KernelArch         string `json:"kernel_arch,omitempty"`
	Major              int    `json:"cc_major"`
	Minor              int    `json:"cc_minor"`
	SMs                int    `json:"multiprocessors"`
	L2Bytes            int    `json:"l2_bytes"`
	MaxSharedPerBlock  int    `json:"max_shared_per_block_optin"`
	MaxThreadsPerBlock int    `json:"max_threads_per_block"`
	TotalMem           uint64 `json:"total_mem_bytes"`
	FreeMem            uint64 `json:"free_mem_bytes,omitempty"`
}

// Diagnostics is what the backend found: libraries, versions and devices. It is what
// `halo-shell run cuda-info` prints and what `device: auto` logs.
type Diagnostics struct {
	Libraries       []LibraryInfo `json:"libraries"`
	DriverVersion   string        `json:"driver_version,omitempty"`
	NVRTCVersion    string        `json:"nvrtc_version,omitempty"`
	CublasLtVersion uint64        `json:"cublaslt_version,omitempty"`
	Devices         []DeviceInfo  `json:"devices,omitempty"`
	// Usable is true when Available returns nil.
	Usable bool   `json:"usable"`
	Reason string `json:"reason,omitempty"`
}

// Diagnose loads the libraries (once per process) and describes what it found. It never fails:
// problems are reported in the result.
func Diagnose() Diagnostics {
	l := loadLibraries()
	var dg Diagnostics
	for _, li := range []LibraryInfo{l.drv.info, l.nvrtc.info, l.lt.info} {
		dg.Libraries = append(dg.Libraries, li)
	}
	if l.driverVersion > 0 {
		dg.DriverVersion = fmt.Sprintf("%d.%d", l.driverVersion/1000, l.driverVersion%1000/10)
	}
	if l.nvrtc.nvrtcVersion != nil && l.nvrtc.info.Err == "" {
		dg.NVRTCVersion = l.nvrtc.Version()
	}
	if l.lt.cublasLtGetVersion != nil && l.lt.info.Err == "" {
		dg.CublasLtVersion = l.lt.cublasLtGetVersion()
	}
	if l.err == nil {
		for i := 0; i < l.deviceCount; i++ {
			di, err := queryDevice(l.drv, i)
			if err != nil {
				dg.Reason = err.Error()
				continue
			}
			dg.Devices = append(dg.Devices, di)
		}
	}
	if err := Available(); err != nil {
		dg.Reason = err.Error()
	} else {
		dg.Usable = true
	}
	return dg
}

// queryDevice reads a device's attributes; it needs no context.
func queryDevice(drv *driverAPI, ordinal int) (DeviceInfo, error) {
	di := DeviceInfo{Ordinal: ordinal}
	var dev int32
	if err := drv.check(fmt.Sprintf("cuDeviceGet(%d)", ordinal), drv.cuDeviceGet(&dev, int32(ordinal))); err != nil {
		return di, err
	}
	name := make([]byte, 256)
	if err := drv.check("cuDeviceGetName", drv.cuDeviceGetName(&name[0], int32(len(name)), dev)); err != nil {
		return di, err
	}
	di.Name = goString(&name[0])
	attr := func(a int32) (int, error) {
		var v int32
		err := drv.check(fmt.Sprintf("cuDeviceGetAttribute(%d)", a), drv.cuDeviceGetAttribute(&v, a, dev))
		return int(v), err
	}
	var err error
	for _, f := range []struct {
		dst  *int
		attr int32
	}{
		{&di.Major, attrComputeCapMajor}, {&di.Minor, attrComputeCapMinor},
		{&di.SMs, attrMultiprocessorCount}, {&di.L2Bytes, attrL2CacheSize},
		{&di.MaxSharedPerBlock, attrMaxSharedPerBlockOpt}, {&di.MaxThreadsPerBlock, attrMaxThreadsPerBlock},
	} {
		if *f.dst, err = attr(f.attr); err != nil {
			return di, err
		}
	}
	di.Arch = fmt.Sprintf("sm_%d%d", di.Major, di.Minor)
	if err := drv.check("cuDeviceTotalMem_v2", drv.cuDeviceTotalMem(&di.TotalMem, dev)); err != nil {
		return di, err
	}
	return di, nil
}
