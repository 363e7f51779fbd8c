package kernel

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
)

// SpecName is the kernelspec's name: `jupyter console --kernel halo`.
const SpecName = "halo"

// Spec is the content of kernel.json.
type Spec struct {
	Argv          []string          `json:"argv"`
	DisplayName   string            `json:"display_name"`
	Language      string            `json:"language"`
	InterruptMode string            `json:"interrupt_mode"`
	Env           map[string]string `json:"env,omitempty"`
	Metadata      map[string]any    `json:"metadata,omitempty"`
}

// InstallOptions say where to write the kernelspec. At most one of User, Prefix and SysPrefix
// may be set; none means User.
type InstallOptions struct {
	// User installs into the user's Jupyter data directory ($JUPYTER_DATA_DIR, else
	// $XDG_DATA_HOME/jupyter or ~/.local/share/jupyter; ~/Library/Jupyter on macOS).
	User bool
	// Prefix installs into PREFIX/share/jupyter/kernels.
	Prefix string
	// SysPrefix installs into the active Python environment's prefix ($VIRTUAL_ENV,
	// $CONDA_PREFIX, else python3's sys.prefix).
	SysPrefix bool
	// Executable is the halo-shell binary Jupyter runs (default: this executable). It is made
	// absolute.
	Executable string
	// Session, when set, makes the kernel attach to this session instead of the default one.
	Session string
}

// NewSpec returns the kernelspec that runs exe as a kernel.
func NewSpec(exe, sessionName string) Spec {
	argv := []string{exe, "kernel", "--connection-file", "{connection_file}"}
	if sessionName != "" {
		argv = append(argv, "--session", sessionName)
	}
	return Spec{Argv: argv, DisplayName: "halo-shell (Go)", Language: "go", InterruptMode: "message",
		Metadata: map[string]any{"debugger": false}}
}

// Install writes kernels/halo/kernel.json under the directory chosen by o and returns the
// kernelspec's directory.
func Install(o InstallOptions) (string, error) {
	n := 0
	for _, b := range []bool{o.User, o.Prefix != "", o.SysPrefix} {
		if b {
			n++
		}
	}
	if n > 1 {
		return "", errors.New("kernel install: choose one of --user, --prefix DIR and --sys-prefix")
	}
	var base string
	switch {
	case o.Prefix != "":
		base = filepath.Join(o.Prefix, "share", "jupyter")
	case o.SysPrefix:
		p, err := sysPrefix()
		if err != nil {
			return "", err
		}
		base = filepath.Join(p, "share", "jupyter")
	default:
		d, err := userDataDir()
		if err != nil {
			return "", err
		}
		base = d
	}
	exe := o.Executable
	if exe == "" {
		e, err := os.Executable()
		if err != nil {
			return "", fmt.Errorf("kernel install: cannot find this executable (%v); pass its path", err)
		}
		exe = e
	}
	exe, err := filepath.Abs(exe)
	if err != nil {
		return "", fmt.Errorf("kernel install: executable %s: %w", exe, err)
	}
	if resolved, err := filepath.EvalSymlinks(exe); err == nil {
		exe = resolved
	}
	if st, err := os.Stat(exe); err != nil || st.IsDir() || st.Mode()&0o111 == 0 {
		return "", fmt.Errorf("kernel install: %s is not an executable file", exe)
	}
	dir := filepath.Join(base, "kernels", SpecName)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", fmt.Errorf("kernel install: %w", err)
	}
	b, err := json.MarshalIndent(NewSpec(exe, o.Session), "", "  ")
	if err != nil {
		return "", err
	}
	f := filepath.Join(dir, "kernel.json")
	tmp := f + ".tmp"
	if err := os.WriteFile(tmp, append(b, '\n'), 0o644); err != nil {
		return "", fmt.Errorf("kernel install: %w", err)
	}
	if err := os.Rename(tmp, f); err != nil {
		return "", fmt.Errorf("kernel install: %w", err)
	}
	return dir, nil
}

// userDataDir is Jupyter's per-user data directory (jupyter_core.paths.jupyter_data_dir).
func userDataDir() (string, error) {
	if d := os.Getenv("JUPYTER_DATA_DIR"); d != "" {
		return d, nil
	}
	home, err := os.UserHomeDir()
	if err != nil {
		return "", fmt.Errorf("kernel install: no home directory (%v); use --prefix DIR", err)
	}
	switch runtime.GOOS {
	case "darwin":
		return filepath.Join(home, "Library", "Jupyter"), nil
	case "windows":
		if a := os.Getenv("APPDATA"); a != "" {
			return filepath.Join(a, "jupyter"), nil
		}
		return filepath.Join(home, ".jupyter", "data"), nil
	}
	if x := os.Getenv("XDG_DATA_HOME"); x != "" {
		return filepath.Join(x, "jupyter"), nil
	}
	return filepath.Join(home, ".local", "share", "jupyter"), nil
}

// sysPrefix is the prefix of the active Python environment.
func sysPrefix() (string, error) {
	for _, v := range []string{"VIRTUAL_ENV", "CONDA_PREFIX"} {
		if d := os.Getenv(v); d != "" {
			return d, nil
		}
	}
	py, err := exec.LookPath("python3")
	if err != nil {
		return "", errors.New("kernel install --sys-prefix: no Python environment is active (VIRTUAL_ENV, CONDA_PREFIX unset) and no python3 in PATH; use --prefix DIR")
	}
	out, err := exec.Command(py, "-c", "import sys; print(sys.prefix)").Output()
	if err != nil {
		return "", fmt.Errorf("kernel install --sys-prefix: asking %s for sys.prefix: %v", py, err)
	}
	return strings.TrimSpace(string(out)), nil
}
