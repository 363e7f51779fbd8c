package cuda

import (
	"fmt"
	"io"
	"os"
	"strings"
)

// nvrtcAPI holds the NVRTC entry points used to compile kernels/*.cu at run time.
type nvrtcAPI struct {
	info LibraryInfo

	nvrtcVersion           func(major, minor *int32) int32
	nvrtcGetErrorString    func(res int32) string
	nvrtcCreateProgram     func(prog *uintptr, src, name *byte, nHeaders int32, headers, includeNames **byte) int32
	nvrtcCompileProgram    func(prog uintptr, nOpts int32, opts **byte) int32
	nvrtcGetProgramLogSize func(prog uintptr, n *uint64) int32
	nvrtcGetProgramLog     func(prog uintptr, log *byte) int32
	nvrtcGetCUBINSize      func(prog uintptr, n *uint64) int32
	nvrtcGetCUBIN          func(prog uintptr, cubin *byte) int32
	nvrtcGetPTXSize        func(prog uintptr, n *uint64) int32
	nvrtcGetPTX            func(prog uintptr, ptx *byte) int32
	nvrtcDestroyProgram    func(prog *uintptr) int32

	major, minor int32
}

func loadNVRTC(env searchEnv) (*nvrtcAPI, error) {
	h, info, err := openLibrary(specNVRTC, env)
	n := &nvrtcAPI{info: info}
	if err != nil {
		return n, err
	}
	s := symbolTable{lib: h, what: "NVRTC " + info.Path}
	s.bind(&n.nvrtcVersion, "nvrtcVersion")
	s.bind(&n.nvrtcGetErrorString, "nvrtcGetErrorString")
	s.bind(&n.nvrtcCreateProgram, "nvrtcCreateProgram")
	s.bind(&n.nvrtcCompileProgram, "nvrtcCompileProgram")
	s.bind(&n.nvrtcGetProgramLogSize, "nvrtcGetProgramLogSize")
	s.bind(&n.nvrtcGetProgramLog, "nvrtcGetProgramLog")
	s.bind(&n.nvrtcGetCUBINSize, "nvrtcGetCUBINSize")
	s.bind(&n.nvrtcGetCUBIN, "nvrtcGetCUBIN")
	s.bind(&n.nvrtcGetPTXSize, "nvrtcGetPTXSize")
	s.bind(&n.nvrtcGetPTX, "nvrtcGetPTX")
	s.bind(&n.nvrtcDestroyProgram, "nvrtcDestroyProgram")
	if err := s.err(); err != nil {
		n.info.Err = err.Error()
		return n, err
	}
	if r := n.nvrtcVersion(&n.major, &n.minor); r != 0 {
		return n, fmt.Errorf("cuda: nvrtcVersion: %s", n.errString(r))
	}
	return n, nil
}

// Version returns NVRTC's "major.minor".
func (n *nvrtcAPI) Version() string { return fmt.Sprintf("%d.%d", n.major, n.minor) }

func (n *nvrtcAPI) errString(r int32) string {
	if s := n.nvrtcGetErrorString(r); s != "" {
		return s
	}
	return fmt.Sprintf("NVRTC error %d", r)
}

// compile compiles CUDA C source to a CUBIN for arch ("sm_90"), or to PTX (NUL-terminated, as
// cuModuleLoadData wants it) for a virtual architecture ("compute_86"). name names the source in
// messages. On a compile error the message carries NVRTC's log.
func (n *nvrtcAPI) compile(name, src, arch string, extraOpts []string) ([]byte, error) {
	var prog uintptr
	if r := n.nvrtcCreateProgram(&prog, cString(src), cString(name), 0, nil, nil); r != 0 {
		return nil, fmt.Errorf("cuda: nvrtc: %s: create program: %s", name, n.errString(r))
	}
	defer n.nvrtcDestroyProgram(&prog)
	opts := append([]string{"--gpu-architecture=" + arch, "-std=c++17", "-default-device"}, extraOpts...)
	cOpts := make([]*byte, len(opts))
	for i, o := range opts {
		cOpts[i] = cString(o)
	}
	r := n.nvrtcCompileProgram(prog, int32(len(cOpts)), &cOpts[0])
	log := n.programLog(prog)
	printNVRTCLog(os.Stderr, name, arch, log)
	if r != 0 {
		return nil, fmt.Errorf("cuda: nvrtc %s: compiling %s for %s (%s): %s\n%s", n.Version(), name, arch, strings.Join(opts, " "), n.errString(r), log)
	}
	var size uint64
	if strings.HasPrefix(arch, "compute_") {
		if r := n.nvrtcGetPTXSize(prog, &size); r != 0 || size == 0 {
			return nil, fmt.Errorf("cuda: nvrtc: %s: no PTX for %s (%s)", name, arch, n.errString(r))
		}
		ptx := make([]byte, size)
		if r := n.nvrtcGetPTX(prog, &ptx[0]); r != 0 {
			return nil, fmt.Errorf("cuda: nvrtc: %s: get PTX: %s", name, n.errString(r))
		}
		return ptx, nil
	}
	if r := n.nvrtcGetCUBINSize(prog, &size); r != 0 || size == 0 {
		return nil, fmt.Errorf("cuda: nvrtc: %s: no CUBIN for %s (%s); NVRTC %s may not know this architecture", name, arch, n.errString(r), n.Version())
	}
	cubin := make([]byte, size)
	if r := n.nvrtcGetCUBIN(prog, &cubin[0]); r != 0 {
		return nil, fmt.Errorf("cuda: nvrtc: %s: get CUBIN: %s", name, n.errString(r))
	}
	return cubin, nil
}

// printNVRTCLog writes a compilation's log to w when HALO_CUDA_NVRTC_LOG is set and the log is
// not empty.
func printNVRTCLog(w io.Writer, name, arch, log string) {
	if _, ok := swNVRTCLog.Lookup(); ok && log != "" {
		fmt.Fprintf(w, "nvrtc %s (%s):\n%s\n", name, arch, log)
	}
}

func (n *nvrtcAPI) programLog(prog uintptr) string {
	var size uint64
	if n.nvrtcGetProgramLogSize(prog, &size) != 0 || size <= 1 || size > 1<<24 {
		return ""
	}
	buf := make([]byte, size)
	if n.nvrtcGetProgramLog(prog, &buf[0]) != 0 {
		return ""
	}
	return strings.TrimRight(string(buf), "\x00\n")
}
