//go:build !unix

package safetensors

import (
	"io"
	"os"
)

// mapFile reads the whole file: this platform has no mmap in the standard library.
func mapFile(fd *os.File, size int) ([]byte, func() error, error) {
	buf := make([]byte, size)
	if _, err := io.ReadFull(fd, buf); err != nil {
		return nil, nil, err
	}
	return buf, func() error { return nil }, nil
}
