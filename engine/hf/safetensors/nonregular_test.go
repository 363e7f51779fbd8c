package safetensors

import (
	"errors"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
)

func TestOpenRefusesNonRegularFiles(t *testing.T) {
	dir := t.TempDir()
	fifo := filepath.Join(dir, "model.safetensors")
	if err := syscall.Mkfifo(fifo, 0o644); err != nil {
		t.Skip("mkfifo:", err)
	}
	for path, kind := range map[string]string{fifo: "a named pipe", "/dev/zero": "a device", dir: "a directory"} {
		_, err := Open(path) // a named pipe without a writer would block os.Open forever
		if !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), "not a regular file ("+kind+")") {
			t.Errorf("Open(%s) = %v, want it refused as %s", path, err, kind)
		}
	}
	if _, err := OpenCheckpoint(dir); err == nil || !strings.Contains(err.Error(), "not a regular file (a named pipe)") {
		t.Errorf("OpenCheckpoint(dir with a FIFO model.safetensors) = %v", err)
	}
}
