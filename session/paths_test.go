package session

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"unicode/utf8"
)

func FuzzParseListen(f *testing.F) {
	for _, s := range []string{"tcp://127.0.0.1:7070", "tcp://:0", "tcp://[::1]:80", "tcp://host", "unix:///x", "tcp://a:b", "tcp://h:99999", "", "tcp://h:1/path"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		addr, err := ParseListen(s)
		if err != nil {
			if !strings.Contains(err.Error(), "--listen") {
				t.Fatalf("error %q does not name the flag", err)
			}
			return
		}
		if addr == "" || strings.HasPrefix(addr, ":") {
			t.Fatalf("ParseListen(%q) = %q: no host", s, addr)
		}
	})
}

func FuzzValidateName(f *testing.F) {
	for _, s := range []string{"default", "exp-1.b_2", "", ".hidden", "a/b", "../x", strings.Repeat("a", 65), "ünï"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		if n := NameFor(s); ValidateName(n) != nil {
			t.Fatalf("NameFor(%q) = %q is not a valid name: %v", s, n, ValidateName(n))
		} else if ValidateName(s) == nil && n != s {
			t.Fatalf("NameFor changed the valid name %q to %q", s, n)
		}
		err := ValidateName(s)
		if err != nil {
			return
		}
		if strings.ContainsAny(s, "/\\\x00") || strings.HasPrefix(s, ".") || len(s) > 64 || !utf8.ValidString(s) {
			t.Fatalf("ValidateName accepted %q", s)
		}
		p, err := PathsFor(s)
		if err != nil || !strings.HasSuffix(p.Socket, "/"+s+".sock") {
			t.Fatalf("PathsFor(%q) = %v, %v", s, p, err)
		}
	})
}

// List removes the socket of a session that no longer answers (and lists nothing).
func TestListRemovesStaleSockets(t *testing.T) {
	dir := t.TempDir()
	t.Setenv("HALO_SESSION_DIR", dir)
	stale := filepath.Join(dir, "gone.sock")
	if err := os.WriteFile(stale, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	ss, err := List(t.Context())
	if err != nil || len(ss) != 0 {
		t.Fatalf("List = %v, %v", ss, err)
	}
	if _, err := os.Stat(stale); !os.IsNotExist(err) {
		t.Fatalf("stale socket not removed: %v", err)
	}
}
