package kernel

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestInstallWritesKernelspec(t *testing.T) {
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	tmp := t.TempDir()
	t.Setenv("JUPYTER_DATA_DIR", filepath.Join(tmp, "user"))
	t.Setenv("VIRTUAL_ENV", filepath.Join(tmp, "venv"))
	cases := []struct {
		name string
		o    InstallOptions
		dir  string
	}{
		{"default is user", InstallOptions{Executable: exe}, filepath.Join(tmp, "user", "kernels", "halo")},
		{"user", InstallOptions{User: true, Executable: exe}, filepath.Join(tmp, "user", "kernels", "halo")},
		{"prefix", InstallOptions{Prefix: filepath.Join(tmp, "pfx"), Executable: exe}, filepath.Join(tmp, "pfx", "share", "jupyter", "kernels", "halo")},
		{"sys-prefix", InstallOptions{SysPrefix: true, Executable: exe}, filepath.Join(tmp, "venv", "share", "jupyter", "kernels", "halo")},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			dir, err := Install(c.o)
			if err != nil {
				t.Fatal(err)
			}
			if dir != c.dir {
				t.Fatalf("installed into %s, want %s", dir, c.dir)
			}
			b, err := os.ReadFile(filepath.Join(dir, "kernel.json"))
			if err != nil {
				t.Fatal(err)
			}
			var s Spec
			if err := json.Unmarshal(b, &s); err != nil {
				t.Fatal(err)
			}
			want, _ := filepath.EvalSymlinks(exe)
			if len(s.Argv) != 4 || s.Argv[0] != want || strings.Join(s.Argv[1:], " ") != "kernel --connection-file {connection_file}" ||
				s.DisplayName != "halo-shell (Go)" || s.Language != "go" || s.InterruptMode != "message" {
				t.Fatalf("kernel.json = %s", b)
			}
		})
	}
}

func TestInstallRefusesBadOptions(t *testing.T) {
	tmp := t.TempDir()
	cases := []struct {
		name string
		o    InstallOptions
		want string
	}{
		{"two places", InstallOptions{User: true, Prefix: tmp}, "choose one"},
		{"not executable", InstallOptions{Prefix: tmp, Executable: filepath.Join(tmp, "missing")}, "not an executable"},
		{"directory", InstallOptions{Prefix: tmp, Executable: tmp}, "not an executable"},
	}
	for _, c := range cases {
		if _, err := Install(c.o); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: Install = %v, want error containing %q", c.name, err, c.want)
		}
	}
}

func TestSpecWithSession(t *testing.T) {
	s := NewSpec("/bin/halo-shell", "exp1")
	if got := strings.Join(s.Argv, " "); got != "/bin/halo-shell kernel --connection-file {connection_file} --session exp1" {
		t.Fatalf("argv = %s", got)
	}
}
