package nccl

import (
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"unsafe"

	"github.com/halo-shell/halo-shell/engine/tensor"
)

func fakeEnv(vars map[string]string, files []string, globs map[string][]string) searchEnv {
	have := map[string]bool{}
	for _, f := range files {
		have[f] = true
	}
	return searchEnv{
		getenv: func(k string) string { return vars[k] },
		glob:   func(p string) ([]string, error) { return globs[p], nil },
		exists: func(p string) bool { return have[p] },
	}
}

func TestCandidatesOrder(t *testing.T) {
	site := "/opt/torch/.venv/lib/python3.12/site-packages/nvidia/nccl/lib"
	files := []string{
		site + "/libnccl.so.2",
		"/lib/x86_64-linux-gnu/libnccl.so.2",
		"/custom/libnccl.so.2",
		"/custom/libnccl.so",
	}
	globs := map[string][]string{sitePackagesGlobs[0]: {site}}
	cases := []struct {
		name     string
		vars     map[string]string
		want     []string
		override bool
	}{
		{"override alone", map[string]string{EnvLibrary: "/x/libnccl.so.2", "LD_LIBRARY_PATH": "/custom"}, []string{"/x/libnccl.so.2"}, true},
		{"LD_LIBRARY_PATH, then standard, then site-packages, then the loader", map[string]string{"LD_LIBRARY_PATH": "/custom::/nothing"},
			[]string{"/custom/libnccl.so.2", "/lib/x86_64-linux-gnu/libnccl.so.2", site + "/libnccl.so.2", "/custom/libnccl.so", "libnccl.so.2", "libnccl.so"}, false},
		{"no LD_LIBRARY_PATH", nil,
			[]string{"/lib/x86_64-linux-gnu/libnccl.so.2", site + "/libnccl.so.2", "libnccl.so.2", "libnccl.so"}, false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			got, ov := candidates(fakeEnv(tc.vars, files, globs))
			if !reflect.DeepEqual(got, tc.want) || ov != tc.override {
				t.Fatalf("candidates = %q (override %v), want %q (%v)", got, ov, tc.want, tc.override)
			}
		})
	}
}

// withSonames makes discovery look for names no machine has, so that a missing library is
// missing here even where NCCL is installed.
func withSonames(t *testing.T, names ...string) {
	old := sonames
	sonames = names
	t.Cleanup(func() { sonames = old })
}

func TestMissingLibraryNamesWhatWasTriedAndWhatToDo(t *testing.T) {
	withSonames(t, "libnccl-absent-for-test.so.2")
	dir := t.TempDir()
	_, err := loadAPI(fakeEnv(map[string]string{"LD_LIBRARY_PATH": dir}, nil, nil))
	if err == nil {
		t.Fatal("loaded a library that does not exist")
	}
	for _, want := range []string{"libnccl.so.2 not found", "libnccl-absent-for-test.so.2", EnvLibrary, "install NCCL 2.18"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not mention %q", err, want)
		}
	}
}

func TestOverrideThatIsNotALibrary(t *testing.T) {
	p := filepath.Join(t.TempDir(), "libnccl.so.2")
	os.WriteFile(p, []byte("not an ELF file"), 0o644)
	_, err := loadAPI(fakeEnv(map[string]string{EnvLibrary: p}, nil, nil))
	if err == nil || !strings.Contains(err.Error(), EnvLibrary+`="`+p+`"`) || !strings.Contains(err.Error(), "or unset it") {
		t.Fatalf("got %v; want an error naming %s and the file", err, EnvLibrary)
	}
}

func TestLibraryWithoutNCCLSymbolsIsRefused(t *testing.T) {
	libc, _ := filepath.Glob("/lib/x86_64-linux-gnu/libc.so.6")
	if len(libc) == 0 {
		libc, _ = filepath.Glob("/usr/lib*/libc.so.6")
	}
	if len(libc) == 0 {
		t.Skip("no libc.so.6 to stand in for a library that is not NCCL")
	}
	_, err := loadAPI(fakeEnv(map[string]string{EnvLibrary: libc[0]}, nil, nil))
	if err == nil || !strings.Contains(err.Error(), "missing symbols ncclGetVersion") || !strings.Contains(err.Error(), "not NCCL or older than 2.18") {
		t.Fatalf("got %v; want the missing NCCL symbols named", err)
	}
}

func TestAvailableSaysWhyNot(t *testing.T) {
	err := Available()
	if err == nil {
		t.Skip("NCCL and a GPU are usable here; the reason for their absence cannot be checked")
	}
	if !strings.HasPrefix(err.Error(), "nccl: ") {
		t.Fatalf("error %q does not say it comes from nccl", err)
	}
	if _, lerr := load(); lerr == nil && !strings.Contains(err.Error(), "no GPU can be used") {
		t.Fatalf("library loads but the error %q does not say the GPU is missing", err)
	}
	if _, err := NewUniqueID(); err == nil && Library().Err != "" {
		t.Fatal("NewUniqueID succeeded without a library")
	}
	if Library().Err == "" && Library().Path == "" {
		t.Fatal("Library() reports neither a path nor an error")
	}
}

func TestVersionString(t *testing.T) {
	for code, want := range map[int]string{22809: "2.28.9", 21803: "2.18.3", 2708: "2.7.8"} {
		if got := versionString(code); got != want {
			t.Errorf("versionString(%d) = %q, want %q", code, got, want)
		}
	}
}

func TestNVLSIsTurnedOffUnlessTheUserChose(t *testing.T) {
	cases := []struct {
		name string
		env  map[string]string
		want string
		set  bool
	}{
		{"unset: turned off", map[string]string{}, "0", true},
		{"user on: kept", map[string]string{"NCCL_NVLS_ENABLE": "1"}, "1", false},
		{"user empty: kept", map[string]string{"NCCL_NVLS_ENABLE": ""}, "", false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			set := false
			got, err := nvlsDefault(func(k string) (string, bool) { v, ok := tc.env[k]; return v, ok },
				func(k, v string) error { set = true; tc.env[k] = v; return nil })
			if err != nil || got != tc.want || set != tc.set || tc.env["NCCL_NVLS_ENABLE"] != tc.want {
				t.Fatalf("got %q set=%v err=%v env=%v; want %q set=%v", got, set, err, tc.env, tc.want, tc.set)
			}
		})
	}
	_, err := nvlsDefault(func(string) (string, bool) { return "", false }, func(string, string) error { return errors.New("denied") })
	if err == nil || !strings.Contains(err.Error(), "NCCL_NVLS_ENABLE=0") {
		t.Fatalf("a failed setenv gave %v", err)
	}
}

func TestReduceTypes(t *testing.T) {
	cases := []struct {
		dt   tensor.DType
		want int32
		ok   bool
	}{
		{tensor.F32, ncclFloat32, true}, {tensor.BF16, ncclBfloat16, true}, {tensor.F16, ncclFloat16, true},
		{tensor.I32, 0, false}, {tensor.U8, 0, false},
	}
	for _, tc := range cases {
		got, err := reduceType(tc.dt)
		if (err == nil) != tc.ok || got != tc.want {
			t.Errorf("reduceType(%s) = %d, %v", tc.dt, got, err)
		}
		if err != nil && !strings.Contains(err.Error(), "f32, bf16 or f16") {
			t.Errorf("reduceType(%s) error %q does not say what works", tc.dt, err)
		}
	}
}

func TestStructSizesMatchNCCL(t *testing.T) {
	if s := unsafe.Sizeof(UniqueID{}); s != 128 {
		t.Fatalf("UniqueID is %d bytes; ncclUniqueId is 128", s)
	}
}

func TestErrorMessagesSayWhatToCheck(t *testing.T) {
	cases := []struct {
		code int32
		want string
	}{
		{ncclRemoteError, "another rank failed"},
		{ncclSystemError, "NCCL_DEBUG=INFO"},
		{ncclUnhandledCudaError, "CUDA call inside NCCL failed"},
		{ncclInvalidUsage, "same collectives in the same order"},
	}
	for _, tc := range cases {
		e := &Error{Call: "ncclAllReduce", Code: tc.code, Reason: "r", Detail: "d"}
		if s := e.Error(); !strings.Contains(s, tc.want) || !strings.Contains(s, "ncclAllReduce") {
			t.Errorf("code %d: %q", tc.code, s)
		}
	}
}

func TestAllToAllPlanUnevenSplits(t *testing.T) {
	// Rank 1 of 3, rows of 10 bytes: sends 2, 0, 3 rows and receives 1, 4, 0.
	got := allToAllPlan([]int{2, 0, 3}, []int{1, 4, 0}, 10, 10)
	want := []p2pOp{
		{send: true, peer: 0, offset: 0, bytes: 20},
		{send: false, peer: 0, offset: 0, bytes: 10},
		{send: false, peer: 1, offset: 10, bytes: 40},
		{send: true, peer: 2, offset: 20, bytes: 30},
	}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("plan\n%+v\nwant\n%+v", got, want)
	}
	if p := allToAllPlan([]int{0, 0}, []int{0, 0}, 4, 4); len(p) != 0 {
		t.Fatalf("an exchange of nothing plans %+v", p)
	}
}
