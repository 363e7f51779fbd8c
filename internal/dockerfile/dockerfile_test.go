package dockerfile

import (
	"os"
	"path"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/halo-shell/halo-shell/engine/backend/cuda"
	"github.com/halo-shell/halo-shell/engine/comm/nccl"
	"github.com/halo-shell/halo-shell/internal/libsearch"
)

// repoFile is a file of the repository root, two levels up from this package.
func repoFile(name string) string { return filepath.Join("..", "..", name) }

func load(t *testing.T) *File {
	t.Helper()
	df, err := Load(repoFile("Dockerfile"))
	if err != nil {
		t.Fatal(err)
	}
	return df
}

// copied is one file the final stage copies: its destination and where it comes from.
type copied struct {
	dst, src, from string
	line           int
}

// copiedFiles lists the files the stage's COPY instructions create, destination by
// destination (a COPY of several sources into a folder yields one entry per source).
func copiedFiles(s *Stage) []copied {
	var out []copied
	for _, in := range s.All("COPY") {
		srcs, dst := in.Words[:len(in.Words)-1], in.Words[len(in.Words)-1]
		for _, src := range srcs {
			d := dst
			if strings.HasSuffix(dst, "/") || len(srcs) > 1 {
				d = path.Join(dst, path.Base(src))
			}
			out = append(out, copied{dst: d, src: src, from: in.Flags["from"], line: in.Line})
		}
	}
	return out
}

// searchedDirs are the folders a search tries in the image: LD_LIBRARY_PATH as the stage sets
// it, then the search's standard folders. (Its pip-wheel globs match nothing in this image.)
func searchedDirs(s *Stage, spec libsearch.Spec) []string {
	var dirs []string
	if v, ok := s.Env("LD_LIBRARY_PATH"); ok {
		for _, d := range strings.Split(v, ":") {
			if d != "" && !strings.HasPrefix(d, "$") {
				dirs = append(dirs, d)
			}
		}
	}
	return append(dirs, spec.Dirs...)
}

// wanted is one library the image must provide, as the code searches for it.
type wanted struct {
	what       string
	search     libsearch.Spec
	companions []string
	cudaMajor  bool // a CUDA toolkit library: its soname's version is the toolkit's major
}

func wantedLibraries() (libs []wanted, driver []cuda.Library) {
	for _, l := range cuda.Libraries() {
		if l.Driver {
			driver = append(driver, l)
			continue
		}
		libs = append(libs, wanted{what: l.What, search: l.Search, companions: l.Companions, cudaMajor: true})
	}
	return append(libs, wanted{what: "NCCL", search: nccl.Search()}), driver
}

// TestImageProvidesEveryLibraryTheLoadersSearch checks that the final stage copies NVRTC (and
// its builtins), cuBLASLt and NCCL under a file name their searches try, into a folder they
// search, from NVIDIA's runtime image of the same CUDA version, and that it does not ship the
// driver, which the NVIDIA container toolkit mounts from the host.
func TestImageProvidesEveryLibraryTheLoadersSearch(t *testing.T) {
	df := load(t)
	final := df.Final()
	files := copiedFiles(final)
	cudaVersion := df.Args["CUDA_VERSION"]
	major, minor, _ := strings.Cut(cudaVersion, ".")
	minor, _, _ = strings.Cut(minor, ".")
	if major == "" || minor == "" {
		t.Fatalf("ARG CUDA_VERSION=%q: want MAJOR.MINOR.PATCH", cudaVersion)
	}
	libs, driver := wantedLibraries()
	if len(libs) != 3 || len(driver) != 1 {
		t.Fatalf("the code loads %d libraries and %d drivers; this test knows NVRTC, cuBLASLt, NCCL and the driver", len(libs), len(driver))
	}
	for _, lib := range libs {
		dirs := searchedDirs(final, lib.search)
		var found *copied
		for i, f := range files {
			if slices.Contains(lib.search.Sonames, path.Base(f.dst)) && slices.Contains(dirs, path.Dir(f.dst)) {
				found = &files[i]
				break
			}
		}
		if found == nil {
			t.Errorf("%s: the image has no %s in a searched folder (%s)", lib.what, strings.Join(lib.search.Sonames, " or "), strings.Join(dirs, ", "))
			continue
		}
		name := path.Base(found.dst)
		if lib.cudaMajor && !strings.HasSuffix(name, ".so."+major) {
			t.Errorf("line %d: %s is copied as %s; with CUDA %s the loader wants the .so.%s one", found.line, lib.what, name, cudaVersion, major)
		}
		src := df.Stage(found.from)
		if src == nil {
			t.Errorf("line %d: %s comes from %q, which is not a stage of this file", found.line, lib.what, found.from)
		} else if want := "nvidia/cuda:" + cudaVersion + "-runtime-"; !strings.HasPrefix(src.Image, want) {
			t.Errorf("line %d: %s comes from %s; want NVIDIA's runtime image %s...", found.line, lib.what, src.Image, want)
		}
		for _, pat := range lib.companions {
			ok := false
			for _, f := range files {
				if m, _ := path.Match(pat, path.Base(f.dst)); m && path.Dir(f.dst) == path.Dir(found.dst) {
					ok = true
					// NVRTC loads the builtins of its own MAJOR.MINOR.
					if lib.cudaMajor && strings.HasPrefix(pat, "libnvrtc-builtins") && !strings.HasSuffix(f.dst, ".so."+major+"."+minor) {
						t.Errorf("line %d: %s is not CUDA %s.%s's", f.line, f.dst, major, minor)
					}
				}
			}
			if !ok {
				t.Errorf("%s: nothing matching %s beside %s (it is loaded from the same folder)", lib.what, pat, found.dst)
			}
		}
	}
	// The driver is the host's: the toolkit mounts it into the image's library folder, which
	// the driver's search must cover, and a copy in the image would shadow it.
	const mounted = "/usr/lib/x86_64-linux-gnu"
	for _, d := range driver {
		if !slices.Contains(d.Search.Dirs, mounted) {
			t.Errorf("%s: the search skips %s, where the NVIDIA container toolkit mounts it", d.What, mounted)
		}
		for _, f := range files {
			if slices.Contains(d.Search.Sonames, path.Base(f.dst)) {
				t.Errorf("line %d: the image ships %s; the driver must come from the host", f.line, f.dst)
			}
		}
	}
	if !strings.HasPrefix(final.Image, "nvidia/cuda:"+cudaVersion+"-base-ubuntu") {
		t.Errorf("the image is based on %s; want NVIDIA's CUDA base image (glibc, no CUDA libraries beyond cudart)", final.Image)
	}
}

// TestImageBuildsTheStaticBinaryAndRunsAsAUser checks the rest of what the image promises:
// the binary comes from a Go build stage running scripts/build-static.sh, the kernelspec is
// installed, Jupyter is a build argument, and the container does not run as root.
func TestImageBuildsTheStaticBinaryAndRunsAsAUser(t *testing.T) {
	df := load(t)
	final := df.Final()
	var bin *copied
	for _, f := range copiedFiles(final) {
		if f.dst == "/usr/local/bin/halo-shell" {
			bin = &f
		}
	}
	if bin == nil {
		t.Fatal("the image has no /usr/local/bin/halo-shell")
	}
	build := df.Stage(bin.from)
	if build == nil || !strings.HasPrefix(build.Image, "golang:") {
		t.Fatalf("the binary comes from stage %q, not from a golang build stage", bin.from)
	}
	script := ""
	for _, in := range build.All("RUN") {
		if strings.Contains(in.Args, "scripts/build-static.sh") && strings.Contains(in.Args, bin.src) {
			script = in.Args
		}
	}
	if script == "" {
		t.Errorf("stage %s does not build %s with scripts/build-static.sh", build.Name, bin.src)
	}
	sh, err := os.ReadFile(repoFile("scripts/build-static.sh"))
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(sh), "CGO_ENABLED=0 go build -trimpath -ldflags='-s -w'") {
		t.Error("scripts/build-static.sh does not build with CGO_ENABLED=0 -trimpath -ldflags='-s -w'")
	}
	ci, err := os.ReadFile(repoFile(".ci/run"))
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(ci), "scripts/build-static.sh") {
		t.Error(".ci/run does not run scripts/build-static.sh, so the image's build stage is never tried")
	}

	install := false
	for _, in := range final.All("RUN") {
		install = install || strings.Contains(in.Args, "halo-shell kernel install")
	}
	if !install {
		t.Error("the image does not install the Jupyter kernelspec (halo-shell kernel install)")
	}
	if def, ok := final.Arg("JUPYTER"); !ok || def != "false" {
		t.Errorf("ARG JUPYTER = %q (declared %v); want a build argument that is false by default", def, ok)
	}

	user := final.User()
	switch name, _, _ := strings.Cut(user, ":"); name {
	case "":
		t.Error("the image sets no USER: it would run as root")
	case "root", "0":
		t.Errorf("USER %s is root", user)
	default:
		created := false
		for _, in := range final.All("RUN") {
			created = created || strings.Contains(in.Args, "useradd") && strings.Contains(in.Args, " "+name)
		}
		if !created {
			t.Errorf("USER %s is not created by a RUN of the image (useradd)", user)
		}
	}
}

func TestParse(t *testing.T) {
	src := `# syntax=docker/dockerfile:1
ARG V=1.2
FROM golang:${V} AS build
RUN echo a \
	&& echo b
COPY --from=x --chown=1:1 a b /dst/
FROM img:$V
ENV A=1 B="two"
ENV C three
COPY ["x y", "/z"]
USER nobody:nogroup
`
	df, err := Parse(strings.NewReader(src))
	if err != nil {
		t.Fatal(err)
	}
	if len(df.Stages) != 2 || df.Stages[0].Image != "golang:1.2" || df.Stages[0].Name != "build" || df.Final().Image != "img:1.2" {
		t.Fatalf("stages %+v", df.Stages)
	}
	run := df.Stages[0].All("RUN")
	if len(run) != 1 || !strings.Contains(run[0].Args, "echo a") || !strings.Contains(run[0].Args, "&& echo b") || run[0].Line != 4 {
		t.Errorf("RUN %+v", run)
	}
	c := df.Stages[0].All("COPY")[0]
	if c.Flags["from"] != "x" || c.Flags["chown"] != "1:1" || !slices.Equal(c.Words, []string{"a", "b", "/dst/"}) {
		t.Errorf("COPY %+v", c)
	}
	if got := copiedFiles(df.Stages[0]); len(got) != 2 || got[0].dst != "/dst/a" || got[1].dst != "/dst/b" {
		t.Errorf("copied %+v", got)
	}
	for k, want := range map[string]string{"A": "1", "B": "two", "C": "three"} {
		if v, ok := df.Final().Env(k); !ok || v != want {
			t.Errorf("ENV %s = %q, %v", k, v, ok)
		}
	}
	if got := copiedFiles(df.Final()); len(got) != 1 || got[0].dst != "/z" || got[0].src != "x y" {
		t.Errorf("JSON COPY %+v", got)
	}
	if df.Final().User() != "nobody:nogroup" {
		t.Errorf("USER %q", df.Final().User())
	}
	for _, bad := range []string{"RUN x\n", "FROM a b c d\n", "FROM a\nCOPY x\n", "FROM a\nRUN x \\\n"} {
		if _, err := Parse(strings.NewReader(bad)); err == nil {
			t.Errorf("Parse(%q) accepted it", bad)
		}
	}
}
