package session

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/halo-shell/halo-shell/internal/switches"
)

// DefaultName is the session clients attach to when no name is given.
const DefaultName = "default"

var swSessionDir = switches.Register(switches.Switch{Name: "HALO_SESSION_DIR", Kind: switches.Path,
	Doc: "Directory of session sockets, tokens, pid files and logs (default: $XDG_RUNTIME_DIR/halo-shell, else the user cache directory's halo-shell/sessions)."})

// RuntimeDir is the directory that holds session sockets, tokens, pid files and logs:
// $XDG_RUNTIME_DIR/halo-shell when XDG_RUNTIME_DIR is set, else
// os.UserCacheDir()/halo-shell/sessions. HALO_SESSION_DIR overrides both.
func RuntimeDir() (string, error) {
	if d, ok := swSessionDir.Lookup(); ok {
		return d, nil
	}
	if d := os.Getenv("XDG_RUNTIME_DIR"); d != "" {
		return filepath.Join(d, "halo-shell"), nil
	}
	c, err := os.UserCacheDir()
	if err != nil {
		return "", fmt.Errorf("session: no runtime directory: set XDG_RUNTIME_DIR or HALO_SESSION_DIR (%v)", err)
	}
	return filepath.Join(c, "halo-shell", "sessions"), nil
}

// EnsureRuntimeDir creates the runtime directory (mode 0700), makes an existing one that
// others can read or write private, and returns it; it fails when that cannot be done. A
// session server calls it before listening, Start before spawning one.
func EnsureRuntimeDir() (string, error) {
	d, err := RuntimeDir()
	if err != nil {
		return "", err
	}
	if err := os.MkdirAll(d, 0o700); err != nil {
		return "", fmt.Errorf("session: runtime directory %s: %w", d, err)
	}
	st, err := os.Stat(d)
	if err != nil {
		return "", fmt.Errorf("session: runtime directory %s: %w", d, err)
	}
	if st.Mode().Perm()&0o077 != 0 {
		if err := os.Chmod(d, 0o700); err != nil {
			return "", fmt.Errorf("session: runtime directory %s has mode %v and cannot be made private: %w", d, st.Mode().Perm(), err)
		}
	}
	return d, nil
}

// ValidateName checks a session name: 1 to 64 characters of letters, digits, '-', '_' and '.',
// not starting with '.'.
func ValidateName(name string) error {
	if name == "" || len(name) > 64 || strings.HasPrefix(name, ".") {
		return fmt.Errorf("session: name %q: want 1 to 64 characters of letters, digits, '-', '_' or '.', not starting with '.'", name)
	}
	for _, r := range name {
		ok := r == '-' || r == '_' || r == '.' || (r >= 'a' && r <= 'z') || (r >= 'A' && r <= 'Z') || (r >= '0' && r <= '9')
		if !ok {
			return fmt.Errorf("session: name %q: character %q is not allowed (use letters, digits, '-', '_', '.')", name, r)
		}
	}
	return nil
}

// NameFor turns any string (an output directory's base name, a run name) into a valid session
// name: characters other than letters, digits, '-', '_' and '.' become '-', a leading '.'
// becomes '_', and the result is cut to 64 bytes; an empty result is DefaultName.
func NameFor(s string) string {
	b := []byte{}
	for _, r := range s {
		ok := r == '-' || r == '_' || r == '.' || (r >= 'a' && r <= 'z') || (r >= 'A' && r <= 'Z') || (r >= '0' && r <= '9')
		if !ok {
			r = '-'
		}
		b = append(b, byte(r))
		if len(b) == 64 {
			break
		}
	}
	if len(b) == 0 {
		return DefaultName
	}
	if b[0] == '.' {
		b[0] = '_'
	}
	return string(b)
}

// Paths are the files of one session in RuntimeDir.
type Paths struct {
	Socket string // unix socket, 0600
	Token  string // bearer token for TCP, 0600 (only with --listen)
	Pid    string // process id of the session
	Log    string // log of a detached session
	TCP    string // the TCP address the session serves, when it does
	Lock   string // held by Start while it starts the session (one start per name at a time)
}

// PathsFor returns the file paths of the named session.
func PathsFor(name string) (Paths, error) {
	if err := ValidateName(name); err != nil {
		return Paths{}, err
	}
	d, err := RuntimeDir()
	if err != nil {
		return Paths{}, err
	}
	base := filepath.Join(d, name)
	return Paths{Socket: base + ".sock", Token: base + ".token", Pid: base + ".pid", Log: base + ".log", TCP: base + ".tcp", Lock: base + ".lock"}, nil
}
