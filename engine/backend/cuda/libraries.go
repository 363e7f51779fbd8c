package cuda

import "github.com/halo-shell/halo-shell/internal/libsearch"

// nvrtcBuiltinsPattern names the NVRTC builtins library that openLibrary loads from NVRTC's
// own folder before NVRTC itself (NVRTC opens it by name at compile time).
const nvrtcBuiltinsPattern = "libnvrtc-builtins.so.*"

// Library is one shared library the backend loads at run time: how it is searched for, and
// the files that must lie beside it.
type Library struct {
	// What names the library ("CUDA driver", "NVRTC", "cuBLASLt").
	What string
	// Search is the search openLibrary runs: the override variable, the file names and the
	// folders, in order.
	Search libsearch.Spec
	// Companions are glob patterns of files loaded from the library's own folder.
	Companions []string
	// Driver is true for the CUDA driver, which comes with the NVIDIA kernel driver (on a
	// container, mounted from the host) rather than with an application.
	Driver bool
}

// Libraries lists what the backend loads, as it searches for it; packaging (the Dockerfile's
// test) checks against it.
func Libraries() []Library {
	return []Library{
		{What: specDriver.What, Search: searchSpec(specDriver), Driver: true},
		{What: specNVRTC.What, Search: searchSpec(specNVRTC), Companions: []string{nvrtcBuiltinsPattern}},
		{What: specCublasLt.What, Search: searchSpec(specCublasLt)},
	}
}
