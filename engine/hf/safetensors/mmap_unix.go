//go:build unix

package safetensors

import (
	"fmt"
	"os"
	"syscall"
)

// mapFile maps size bytes of fd read-only and shared. The mapping outlives fd.
func mapFile(fd *os.File, size int) ([]byte, func() error, error) {
	buf, err := syscall.Mmap(int(fd.Fd()), 0, size, syscall.PROT_READ, syscall.MAP_SHARED)
	if err != nil {
		return nil, nil, fmt.Errorf("mmap: %w", err)
	}
	return buf, func() error { return syscall.Munmap(buf) }, nil
}
