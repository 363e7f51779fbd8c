package safetensors

import (
	"encoding/binary"
	"fmt"
	"maps"
	"math"
	"os"
	"slices"
)

// TensorInfo describes one tensor of an open file or checkpoint.
type TensorInfo struct {
	Name  string
	DType DType
	Shape []int  // a copy; changing it does not change the file
	Data  []byte // a view of the tensor's bytes in the mapped file: valid until Close, never write to it
	File  string // the path of the file that holds the tensor
}

// NumElements is the product of Shape (1 for a scalar).
func (t TensorInfo) NumElements() int64 {
	n := int64(1)
	for _, d := range t.Shape {
		n *= int64(d)
	}
	return n
}

// File is one open .safetensors file. Its tensors' Data are views of the file's bytes, memory
// mapped where the operating system allows it (read into memory elsewhere). A File is safe for
// concurrent use by several goroutines until Close.
type File struct {
	path     string
	buf      []byte // the whole file
	release  func() error
	metadata map[string]string
	entries  map[string]entry
	names    []string
	dataOff  int64 // where the data section starts in buf
	dataLen  int64
}

// Open opens and validates the safetensors file at path. The file's data is memory mapped; it
// is not read until a tensor's Data is used. Close the File when done.
//
// The file must not be truncated or rewritten in place while it is open: the mapping shows the
// change, and reading past a truncation kills the process. Save and SaveCheckpoint replace
// files by renaming, which leaves open mappings of the old file intact.
func Open(path string) (*File, error) {
	fd, err := openRegular(path)
	if err != nil {
		return nil, err
	}
	defer fd.Close()
	st, err := fd.Stat()
	if err != nil {
		return nil, fmt.Errorf("safetensors: %w", err)
	}
	if !st.Mode().IsRegular() {
		return nil, formatErr(path, "", "not a regular file")
	}
	size := st.Size()
	if size < 8 {
		return nil, formatErr(path, "", "file is %d bytes long, too short to hold the 8-byte header length", size)
	}
	if size > math.MaxInt {
		return nil, formatErr(path, "", "file is %d bytes long, more than this platform can map", size)
	}
	buf, release, err := mapFile(fd, int(size))
	if err != nil {
		return nil, fmt.Errorf("safetensors: %s: %w", path, err)
	}
	f, err := Read(path, buf)
	if err != nil {
		release()
		return nil, err
	}
	f.release = release
	return f, nil
}

// openRegular opens path for reading after checking that it is a regular file: opening a
// named pipe blocks until something writes to it, and a device never ends.
func openRegular(path string) (*os.File, error) {
	st, err := os.Stat(path)
	if err != nil {
		return nil, fmt.Errorf("safetensors: %w", err)
	}
	if !st.Mode().IsRegular() {
		return nil, formatErr(path, "", "not a regular file (%s); checkpoint files must be regular files", fileKind(st.Mode()))
	}
	fd, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("safetensors: %w", err)
	}
	return fd, nil
}

// fileKind names the type of a file that is not regular.
func fileKind(m os.FileMode) string {
	switch {
	case m.IsDir():
		return "a directory"
	case m&os.ModeNamedPipe != 0:
		return "a named pipe"
	case m&os.ModeSocket != 0:
		return "a socket"
	case m&os.ModeDevice != 0:
		return "a device"
	}
	return m.Type().String()
}

// Read parses a whole safetensors file held in buf; name is used in errors and TensorInfo.File.
// The File's tensors are views of buf, which must not change while they are in use.
func Read(name string, buf []byte) (*File, error) {
	if len(buf) < 8 {
		return nil, formatErr(name, "", "file is %d bytes long, too short to hold the 8-byte header length", len(buf))
	}
	n := binary.LittleEndian.Uint64(buf)
	if n > MaxHeaderSize {
		return nil, formatErr(name, "", "header length %d exceeds the %d-byte limit", n, MaxHeaderSize)
	}
	if n > uint64(len(buf)-8) {
		return nil, formatErr(name, "", "header length %d runs past the end of the file (the file is %d bytes)", n, len(buf))
	}
	h, err := parseHeader(name, buf[8:8+n])
	if err != nil {
		return nil, err
	}
	dataOff := int64(8 + n)
	avail := int64(len(buf)) - dataOff
	if h.dataLen > avail {
		for _, e := range h.entries {
			if e.end > avail {
				return nil, formatErr(name, e.name, "data_offsets [%d, %d] run past the end of the file: its data section holds %d bytes (truncated file?)", e.begin, e.end, avail)
			}
		}
	}
	if h.dataLen < avail {
		return nil, formatErr(name, "", "%d bytes follow the last tensor's data; the format requires tensor data to end the file", avail-h.dataLen)
	}
	f := &File{
		path:     name,
		buf:      buf,
		metadata: h.metadata,
		entries:  make(map[string]entry, len(h.entries)),
		names:    make([]string, 0, len(h.entries)),
		dataOff:  dataOff,
		dataLen:  h.dataLen,
	}
	for _, e := range h.entries {
		f.entries[e.name] = e
		f.names = append(f.names, e.name)
	}
	slices.Sort(f.names)
	return f, nil
}

// Path is the path the File was opened from (or the name given to Read).
func (f *File) Path() string { return f.path }

// Names returns the names of the file's tensors, sorted.
func (f *File) Names() []string { return slices.Clone(f.names) }

// Len is the number of tensors in the file.
func (f *File) Len() int { return len(f.names) }

// Tensor returns the named tensor; ok is false if the file has no such tensor.
func (f *File) Tensor(name string) (t TensorInfo, ok bool) {
	e, ok := f.entries[name]
	if !ok {
		return TensorInfo{}, false
	}
	lo, hi := f.dataOff+e.begin, f.dataOff+e.end
	return TensorInfo{
		Name:  name,
		DType: e.dtype,
		Shape: slices.Clone(e.shape),
		Data:  f.buf[lo:hi:hi],
		File:  f.path,
	}, true
}

// Metadata returns a copy of the header's __metadata__ map; nil when the header has none.
func (f *File) Metadata() map[string]string { return maps.Clone(f.metadata) }

// HeaderSize is the length of the file's header (the 8-byte length and the JSON text).
func (f *File) HeaderSize() int64 { return f.dataOff }

// DataSize is the total size of the file's tensor data in bytes.
func (f *File) DataSize() int64 { return f.dataLen }

// Close releases the file's mapping. Data slices obtained from the File must not be used
// afterwards (with a memory mapping, touching them crashes the program).
func (f *File) Close() error {
	if f.release == nil {
		return nil
	}
	err := f.release()
	f.release = nil
	f.buf = nil
	if err != nil {
		return fmt.Errorf("safetensors: %s: %w", f.path, err)
	}
	return nil
}
