package nccl

import (
	"fmt"
	"strings"
	"unsafe"

	"github.com/ebitengine/purego"
	"github.com/halo-shell/halo-shell/engine/tensor"
)

// UniqueIDBytes is the size of ncclUniqueId (NCCL_UNIQUE_ID_BYTES).
const UniqueIDBytes = 128

// UniqueID is an ncclUniqueId: made once (NewUniqueID) on one process and given to every rank
// of the communicator it names.
type UniqueID struct {
	Internal [UniqueIDBytes]byte
}

// ncclResult_t.
const (
	ncclSuccess            = 0
	ncclUnhandledCudaError = 1
	ncclSystemError        = 2
	ncclInternalError      = 3
	ncclInvalidArgument    = 4
	ncclInvalidUsage       = 5
	ncclRemoteError        = 6
	ncclInProgress         = 7
)

// ncclDataType_t.
const (
	ncclInt8     = 0
	ncclUint8    = 1
	ncclInt32    = 2
	ncclUint32   = 3
	ncclInt64    = 4
	ncclUint64   = 5
	ncclFloat16  = 6
	ncclFloat32  = 7
	ncclFloat64  = 8
	ncclBfloat16 = 9
)

// ncclRedOp_t.
const (
	ncclSum = 0
	ncclAvg = 4
)

// minVersion is the oldest NCCL this package accepts (ncclCommSplit arrived in 2.18).
const minVersion = 21800

// api holds NCCL's entry points. Every function returns an ncclResult_t except where noted.
type api struct {
	info    LibraryInfo
	version int

	ncclGetVersion     func(v *int32) int32
	ncclGetUniqueId    func(id *UniqueID) int32
	ncclGetErrorString func(r int32) *byte // const char*
	ncclGetLastError   func(comm uintptr) *byte
	// ncclCommInitRankScalable (2.23+) takes the id by pointer; ncclCommInitRank by value (used
	// when the former is missing).
	ncclCommInitRankScalable func(comm *uintptr, nranks, rank, nID int32, ids *UniqueID, config unsafe.Pointer) int32
	ncclCommInitRank         func(comm *uintptr, nranks int32, id UniqueID, rank int32) int32
	ncclCommSplit            func(comm uintptr, color, key int32, newcomm *uintptr, config unsafe.Pointer) int32
	ncclCommDestroy          func(comm uintptr) int32
	ncclCommAbort            func(comm uintptr) int32
	ncclCommGetAsyncError    func(comm uintptr, r *int32) int32
	ncclCommCount            func(comm uintptr, n *int32) int32
	ncclCommUserRank         func(comm uintptr, r *int32) int32
	ncclGroupStart           func() int32
	ncclGroupEnd             func() int32
	ncclAllReduce            func(send, recv uintptr, count uint64, dt, op int32, comm, stream uintptr) int32
	ncclAllGather            func(send, recv uintptr, sendcount uint64, dt int32, comm, stream uintptr) int32
	ncclReduceScatter        func(send, recv uintptr, recvcount uint64, dt, op int32, comm, stream uintptr) int32
	ncclBroadcast            func(send, recv uintptr, count uint64, dt, root int32, comm, stream uintptr) int32
	ncclSend                 func(send uintptr, count uint64, dt, peer int32, comm, stream uintptr) int32
	ncclRecv                 func(recv uintptr, count uint64, dt, peer int32, comm, stream uintptr) int32
}

// loadAPI opens the library and binds every symbol. A missing symbol is an error naming it.
func loadAPI(env searchEnv) (*api, error) {
	h, info, err := open(env)
	a := &api{info: info}
	if err != nil {
		return a, err
	}
	var missing []string
	bind := func(fn any, name string, required bool) {
		addr, err := purego.Dlsym(h, name)
		if err != nil || addr == 0 {
			if required {
				missing = append(missing, name)
			}
			return
		}
		purego.RegisterFunc(fn, addr)
	}
	bind(&a.ncclGetVersion, "ncclGetVersion", true)
	bind(&a.ncclGetUniqueId, "ncclGetUniqueId", true)
	bind(&a.ncclGetErrorString, "ncclGetErrorString", true)
	bind(&a.ncclGetLastError, "ncclGetLastError", true)
	bind(&a.ncclCommInitRankScalable, "ncclCommInitRankScalable", false)
	bind(&a.ncclCommInitRank, "ncclCommInitRank", true)
	bind(&a.ncclCommSplit, "ncclCommSplit", true)
	bind(&a.ncclCommDestroy, "ncclCommDestroy", true)
	bind(&a.ncclCommAbort, "ncclCommAbort", true)
	bind(&a.ncclCommGetAsyncError, "ncclCommGetAsyncError", true)
	bind(&a.ncclCommCount, "ncclCommCount", true)
	bind(&a.ncclCommUserRank, "ncclCommUserRank", true)
	bind(&a.ncclGroupStart, "ncclGroupStart", true)
	bind(&a.ncclGroupEnd, "ncclGroupEnd", true)
	bind(&a.ncclAllReduce, "ncclAllReduce", true)
	bind(&a.ncclAllGather, "ncclAllGather", true)
	bind(&a.ncclReduceScatter, "ncclReduceScatter", true)
	bind(&a.ncclBroadcast, "ncclBroadcast", true)
	bind(&a.ncclSend, "ncclSend", true)
	bind(&a.ncclRecv, "ncclRecv", true)
	if len(missing) > 0 {
		err := fmt.Errorf("nccl: %s is missing symbols %s: it is not NCCL or older than 2.18; point %s at libnccl.so.2 of NCCL 2.18 or newer", info.Path, strings.Join(missing, ", "), EnvLibrary)
		a.info.Err = err.Error()
		return a, err
	}
	var v int32
	if r := a.ncclGetVersion(&v); r != ncclSuccess {
		err := fmt.Errorf("nccl: ncclGetVersion failed (%d) with %s", r, info.Path)
		a.info.Err = err.Error()
		return a, err
	}
	a.version = int(v)
	a.info.Version = versionString(a.version)
	if a.version < minVersion {
		err := fmt.Errorf("nccl: %s is NCCL %s; halo-shell needs 2.18 or newer (ncclCommSplit, bfloat16, ncclAvg); install a newer NCCL or set %s", info.Path, a.info.Version, EnvLibrary)
		a.info.Err = err.Error()
		return a, err
	}
	return a, nil
}

// Error is a failed NCCL call.
type Error struct {
	Call   string
	Code   int32
	Reason string // ncclGetErrorString
	Detail string // ncclGetLastError, when there is one
}

func (e *Error) Error() string {
	s := fmt.Sprintf("nccl: %s: %s (ncclResult %d)", e.Call, e.Reason, e.Code)
	if e.Detail != "" {
		s += ": " + e.Detail
	}
	switch e.Code {
	case ncclUnhandledCudaError:
		s += "; a CUDA call inside NCCL failed (out of memory, or a device fault in an earlier kernel)"
	case ncclSystemError:
		s += "; a system call or the network failed (set NCCL_DEBUG=INFO for NCCL's log)"
	case ncclRemoteError:
		s += "; another rank failed or disconnected"
	case ncclInvalidArgument, ncclInvalidUsage:
		s += "; every rank must call the same collectives in the same order with matching sizes"
	}
	return s
}

// check turns a result into an error (nil on success). comm may be 0.
func (a *api) check(call string, r int32, comm uintptr) error {
	if r == ncclSuccess {
		return nil
	}
	e := &Error{Call: call, Code: r, Reason: goString(a.ncclGetErrorString(r))}
	e.Detail = goString(a.ncclGetLastError(comm))
	return e
}

// goString copies a NUL-terminated C string (at most 4096 bytes).
func goString(p *byte) string {
	if p == nil {
		return ""
	}
	var b []byte
	for i := 0; i < 4096; i++ {
		c := *(*byte)(unsafe.Add(unsafe.Pointer(p), i))
		if c == 0 {
			break
		}
		b = append(b, c)
	}
	return string(b)
}

// reduceType is the NCCL type of a float dtype.
func reduceType(dt tensor.DType) (int32, error) {
	switch dt {
	case tensor.F32:
		return ncclFloat32, nil
	case tensor.BF16:
		return ncclBfloat16, nil
	case tensor.F16:
		return ncclFloat16, nil
	}
	return 0, fmt.Errorf("dtype %s cannot be reduced; reductions need f32, bf16 or f16", dt)
}
