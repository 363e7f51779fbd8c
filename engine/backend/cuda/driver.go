package cuda

import (
	"fmt"
	"unsafe"

	"github.com/ebitengine/purego"
)

// driverAPI holds the CUDA driver entry points this package uses. Versioned symbols are bound
// explicitly (cuMemAlloc_v2, ...): the unversioned names are the CUDA 3.x ABI.
type driverAPI struct {
	info LibraryInfo

	cuInit               func(flags uint32) int32
	cuDriverGetVersion   func(v *int32) int32
	cuDeviceGetCount     func(n *int32) int32
	cuDeviceGet          func(dev *int32, ordinal int32) int32
	cuDeviceGetName      func(name *byte, n int32, dev int32) int32
	cuDeviceGetAttribute func(v *int32, attr int32, dev int32) int32
	cuDeviceTotalMem     func(bytes *uint64, dev int32) int32
	cuPrimaryCtxRetain   func(ctx *uintptr, dev int32) int32
	cuPrimaryCtxRelease  func(dev int32) int32
	cuCtxSetCurrent      func(ctx uintptr) int32
	cuCtxSynchronize     func() int32
	cuMemAlloc           func(ptr *uintptr, bytes uint64) int32
	cuMemFree            func(ptr uintptr) int32
	cuMemGetInfo         func(free, total *uint64) int32
	cuMemcpyHtoD         func(dst uintptr, src unsafe.Pointer, bytes uint64) int32
	cuMemcpyDtoH         func(dst unsafe.Pointer, src uintptr, bytes uint64) int32
	cuMemcpyDtoDAsync    func(dst, src uintptr, bytes uint64, stream uintptr) int32
	cuMemsetD8Async      func(dst uintptr, v uint8, n uint64, stream uintptr) int32
	cuMemsetD32Async     func(dst uintptr, v uint32, n uint64, stream uintptr) int32
	cuMemsetD16Async     func(dst uintptr, v uint16, n uint64, stream uintptr) int32
	cuStreamCreate       func(s *uintptr, flags uint32) int32
	cuStreamDestroy      func(s uintptr) int32
	cuStreamSynchronize  func(s uintptr) int32
	cuEventCreate        func(e *uintptr, flags uint32) int32
	cuEventRecord        func(e, s uintptr) int32
	cuEventSynchronize   func(e uintptr) int32
	cuEventElapsedTime   func(ms *float32, start, end uintptr) int32
	cuEventDestroy       func(e uintptr) int32
	cuModuleLoadData     func(mod *uintptr, image unsafe.Pointer) int32
	cuModuleUnload       func(mod uintptr) int32
	cuModuleGetFunction  func(fn *uintptr, mod uintptr, name *byte) int32
	cuFuncSetAttribute   func(fn uintptr, attr int32, v int32) int32
	cuGetErrorString     func(res int32, s **byte) int32
	cuGetErrorName       func(res int32, s **byte) int32
	// cuTensorMapEncodeTiled (CUDA 12.0) encodes the TMA descriptors of the Hopper grouped
	// GEMM's TMA variant; nil when the driver lacks it, and that variant is then refused.
	cuTensorMapEncodeTiled func(tmap unsafe.Pointer, dtype int32, rank uint32, addr uintptr, dims, strides *uint64,
		box, elemStrides *uint32, interleave, swizzle, l2Promotion, oobFill int32) int32

	// cuLaunchKernel is called through SyscallN: it is the hot path.
	cuLaunchKernel uintptr
}

// Device attributes (CUdevice_attribute).
const (
	attrMaxThreadsPerBlock   = 1
	attrMultiprocessorCount  = 16
	attrL2CacheSize          = 38
	attrComputeCapMajor      = 75
	attrComputeCapMinor      = 76
	attrMaxSharedPerBlockOpt = 97
)

const funcAttrMaxDynamicShared = 8 // CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES

// funcAttrSharedCarveout is CU_FUNC_ATTRIBUTE_PREFERRED_SHARED_MEMORY_CARVEOUT (percent of the
// unified L1/shared memory to give to shared memory).
const funcAttrSharedCarveout = 9

func loadDriver(env searchEnv) (*driverAPI, error) {
	h, info, err := openLibrary(specDriver, env)
	d := &driverAPI{info: info}
	if err != nil {
		return d, err
	}
	s := symbolTable{lib: h, what: "CUDA driver " + info.Path}
	s.bind(&d.cuInit, "cuInit")
	s.bind(&d.cuDriverGetVersion, "cuDriverGetVersion")
	s.bind(&d.cuDeviceGetCount, "cuDeviceGetCount")
	s.bind(&d.cuDeviceGet, "cuDeviceGet")
	s.bind(&d.cuDeviceGetName, "cuDeviceGetName")
	s.bind(&d.cuDeviceGetAttribute, "cuDeviceGetAttribute")
	s.bind(&d.cuDeviceTotalMem, "cuDeviceTotalMem_v2")
	s.bind(&d.cuPrimaryCtxRetain, "cuDevicePrimaryCtxRetain")
	s.bind(&d.cuPrimaryCtxRelease, "cuDevicePrimaryCtxRelease_v2", "cuDevicePrimaryCtxRelease")
	s.bind(&d.cuCtxSetCurrent, "cuCtxSetCurrent")
	s.bind(&d.cuCtxSynchronize, "cuCtxSynchronize")
	s.bind(&d.cuMemAlloc, "cuMemAlloc_v2")
	s.bind(&d.cuMemFree, "cuMemFree_v2")
	s.bind(&d.cuMemGetInfo, "cuMemGetInfo_v2")
	s.bind(&d.cuMemcpyHtoD, "cuMemcpyHtoD_v2")
	s.bind(&d.cuMemcpyDtoH, "cuMemcpyDtoH_v2")
	s.bind(&d.cuMemcpyDtoDAsync, "cuMemcpyDtoDAsync_v2")
	s.bind(&d.cuMemsetD8Async, "cuMemsetD8Async")
	s.bind(&d.cuMemsetD32Async, "cuMemsetD32Async")
	s.bind(&d.cuMemsetD16Async, "cuMemsetD16Async")
	s.bind(&d.cuStreamCreate, "cuStreamCreate")
	s.bind(&d.cuStreamDestroy, "cuStreamDestroy_v2")
	s.bind(&d.cuStreamSynchronize, "cuStreamSynchronize")
	s.bind(&d.cuEventCreate, "cuEventCreate")
	s.bind(&d.cuEventRecord, "cuEventRecord")
	s.bind(&d.cuEventSynchronize, "cuEventSynchronize")
	// CUDA 12.8 added cuEventElapsedTime_v2 and CUDA 13 made it the default.
	s.bind(&d.cuEventElapsedTime, "cuEventElapsedTime_v2", "cuEventElapsedTime")
	s.bind(&d.cuEventDestroy, "cuEventDestroy_v2")
	s.bind(&d.cuModuleLoadData, "cuModuleLoadData")
	s.bind(&d.cuModuleUnload, "cuModuleUnload")
	s.bind(&d.cuModuleGetFunction, "cuModuleGetFunction")
	s.bind(&d.cuFuncSetAttribute, "cuFuncSetAttribute")
	s.bind(&d.cuGetErrorString, "cuGetErrorString")
	s.bind(&d.cuGetErrorName, "cuGetErrorName")
	s.bindOptional(&d.cuTensorMapEncodeTiled, "cuTensorMapEncodeTiled")
	d.cuLaunchKernel = s.addr("cuLaunchKernel")
	if err := s.err(); err != nil {
		d.info.Err = err.Error()
		return d, err
	}
	return d, nil
}

// CUresult codes that callers react to.
const (
	cuSuccess          = 0
	cuErrOutOfMemory   = 2
	cuErrNoDevice      = 100
	cuErrInvalidDevice = 101
)

// DriverError is a failed CUDA driver call.
type DriverError struct {
	Call string
	Code int32
	Name string
	Msg  string
}

func (e *DriverError) Error() string {
	return fmt.Sprintf("cuda: %s: %s (%d): %s", e.Call, e.Name, e.Code, e.Msg)
}

// check turns a CUresult into an error naming the call.
func (d *driverAPI) check(call string, res int32) error {
	if res == cuSuccess {
		return nil
	}
	e := &DriverError{Call: call, Code: res, Name: "CUDA_ERROR_UNKNOWN", Msg: "unknown error"}
	var p *byte
	if d.cuGetErrorName != nil && d.cuGetErrorName(res, &p) == cuSuccess && p != nil {
		e.Name = goString(p)
	}
	p = nil
	if d.cuGetErrorString != nil && d.cuGetErrorString(res, &p) == cuSuccess && p != nil {
		e.Msg = goString(p)
	}
	return e
}

// launch calls cuLaunchKernel. args holds pointers to each kernel argument's value.
func (d *driverAPI) launch(fn uintptr, grid, block [3]uint32, shared uint32, stream uintptr, args []unsafe.Pointer) int32 {
	var argp uintptr
	if len(args) > 0 {
		argp = uintptr(unsafe.Pointer(&args[0]))
	}
	r1, _, _ := purego.SyscallN(d.cuLaunchKernel, fn,
		uintptr(grid[0]), uintptr(grid[1]), uintptr(grid[2]),
		uintptr(block[0]), uintptr(block[1]), uintptr(block[2]),
		uintptr(shared), stream, argp, 0)
	keepAlive(args)
	return int32(r1)
}

// goString copies a NUL-terminated C string.
func goString(p *byte) string {
	if p == nil {
		return ""
	}
	var n int
	for *(*byte)(unsafe.Add(unsafe.Pointer(p), n)) != 0 {
		n++
		if n > 1<<20 {
			break
		}
	}
	return string(unsafe.Slice(p, n))
}

// cString returns a NUL-terminated copy of s.
func cString(s string) *byte {
	b := make([]byte, len(s)+1)
	copy(b, s)
	return &b[0]
}
