package cuda

import (
	"fmt"
	"unsafe"

	"github.com/halo-shell/halo-shell/engine/backend"
	"github.com/halo-shell/halo-shell/engine/tensor"
)

// The backend's memory: allocation, uploads, downloads and copies between tensors.

// Empty returns a tensor whose contents are undefined until written: the block comes from the
// allocator without the posted zero fill. HALO_CUDA_EMPTY=cleared makes it Alloc (zero-filled),
// for comparing against.
func (b *Backend) Empty(dt tensor.DType, shape ...int) (T, error) {
	if !b.emptyUncleared {
		return b.Alloc(dt, shape...)
	}
	if !dt.Valid() {
		return T{}, fmt.Errorf("cuda: Empty: invalid dtype %s", dt)
	}
	return b.allocScratch(dt, shape...)
}

// Alloc returns a zero-filled tensor.
func (b *Backend) Alloc(dt tensor.DType, shape ...int) (T, error) {
	if !dt.Valid() {
		return T{}, fmt.Errorf("cuda: Alloc: invalid dtype %s", dt)
	}
	s := tensor.Shape(shape)
	if err := s.Check(); err != nil {
		return T{}, fmt.Errorf("cuda: Alloc %s%v: %w", dt, shape, err)
	}
	n := uint64(s.Numel()) * uint64(dt.Size())
	if n == 0 {
		n = 1 // a valid, empty tensor still needs a distinct buffer
	}
	buf, err := b.d.Alloc(n) // a cached block needs no trip to the device goroutine
	if err != nil {
		return T{}, fmt.Errorf("cuda: Alloc %s%v: %w", dt, shape, err)
	}
	p := buf.ptr
	if err := b.d.Post(func() error {
		return b.d.drv.check("cuMemsetD8Async", b.d.drv.cuMemsetD8Async(p, 0, n, b.d.stream))
	}); err != nil {
		_ = b.d.alloc.Free(p) // the fill was not queued: nothing uses the block
		return T{}, err
	}
	buf.bytes = uint64(s.Numel()) * uint64(dt.Size())
	if buf.bytes == 0 {
		buf.bytes = 1
	}
	b.i32.invalidate(buf.ptr, buf.bytes) // recycled memory: whatever was recorded there is gone
	return tensor.New(buf, 0, dt, shape...)
}

// allocScratch is Alloc without the zero fill, for buffers the next operation overwrites.
func (b *Backend) allocScratch(dt tensor.DType, shape ...int) (T, error) {
	s := tensor.Shape(shape)
	if err := s.Check(); err != nil {
		return T{}, fmt.Errorf("cuda: scratch %s%v: %w", dt, shape, err)
	}
	n := max(uint64(s.Numel())*uint64(dt.Size()), 1)
	buf, err := b.d.Alloc(n)
	if err != nil {
		return T{}, fmt.Errorf("cuda: scratch %s%v: %w", dt, shape, err)
	}
	b.i32.invalidate(buf.ptr, buf.bytes)
	return tensor.New(buf, 0, dt, shape...)
}

// Free releases a tensor returned by Alloc.
func (b *Backend) Free(t T) error {
	if t.IsNil() {
		return nil
	}
	buf, ok := t.Buffer().(*Buffer)
	if !ok || buf.dev != b.d {
		return fmt.Errorf("cuda: Free %v: not a tensor of %s", t, b.Name())
	}
	if t.Offset() != 0 {
		return fmt.Errorf("cuda: Free %v: a view (offset %d) cannot be freed; free the tensor Alloc returned", t, t.Offset())
	}
	if buf.ptr == 0 {
		return fmt.Errorf("cuda: Free %v: already freed", t)
	}
	b.i32.invalidate(buf.ptr, buf.bytes)
	return buf.Free()
}

// smallUploadBytes is the largest upload that is copied on the caller's goroutine and posted.
const smallUploadBytes = 64 << 10

// Upload copies host bytes into dst, ordered after the work already queued. Uploads of up to
// 1 MiB return without waiting for the GPU (src may be reused at once); larger ones wait. Those
// of up to smallUploadBytes do not wait for the device goroutine either. The
// values of an I32 dst are remembered on the host (host_int32.go), so that ops validating or
// sorting indices need not read them back.
func (b *Backend) Upload(dst T, src []byte) error {
	p, err := b.ptr("Upload", "dst", dst)
	if err != nil {
		return err
	}
	if int64(len(src)) != dst.Bytes() {
		return fmt.Errorf("cuda: Upload: %d bytes for %v (%d bytes)", len(src), dst, dst.Bytes())
	}
	if len(src) == 0 {
		return nil
	}
	b.i32.invalidate(p, uint64(len(src)))
	if len(src) <= smallUploadBytes {
		// Small uploads (a batch's indices, an expert's routing) are copied here and posted:
		// the caller may reuse src at once and does not wait for the device goroutine.
		own := append([]byte(nil), src...)
		err = b.d.Post(func() error { return b.uploadOnThread(p, own) })
	} else {
		err = b.d.Do(func() error { return b.uploadOnThread(p, src) })
	}
	if err != nil {
		return err
	}
	if dst.DType() == tensor.I32 {
		b.i32.record(p, decodeInt32(src))
	}
	return nil
}

// Download copies src to host bytes after all preceding work.
func (b *Backend) Download(dst []byte, src T) error {
	p, err := b.ptr("Download", "src", src)
	if err != nil {
		return err
	}
	if int64(len(dst)) != src.Bytes() {
		return fmt.Errorf("cuda: Download: %d bytes for %v (%d bytes)", len(dst), src, src.Bytes())
	}
	if len(dst) == 0 {
		return nil
	}
	return b.d.Do(func() error {
		if err := b.d.syncOnThread(); err != nil {
			return err
		}
		return b.d.drv.check("cuMemcpyDtoH_v2", b.d.drv.cuMemcpyDtoH(unsafe.Pointer(&dst[0]), p, uint64(len(dst))))
	})
}

// Copy copies src into dst, converting between F32 and BF16.
func (b *Backend) Copy(dst, src T) error {
	arg := b.args("Copy")
	pd := arg.ptr("dst", dst)
	ps := arg.ptr("src", src)
	if err := arg.err(); err != nil {
		return err
	}
	if dst.Numel() != src.Numel() {
		return fmt.Errorf("cuda: Copy: dst %v and src %v differ in element count", dst, src)
	}
	b.i32.invalidate(pd, uint64(dst.Bytes()))
	if dst.DType() == src.DType() {
		if dst.Bytes() == 0 || pd == ps {
			return nil
		}
		return b.d.Post(func() error {
			return b.d.drv.check("cuMemcpyDtoDAsync_v2", b.d.drv.cuMemcpyDtoDAsync(pd, ps, uint64(dst.Bytes()), b.d.stream))
		})
	}
	cd := arg.code("dst", dst)
	cs := arg.code("src", src)
	if err := arg.err(); err != nil {
		return err
	}
	n := int64(dst.Numel())
	return b.launch1D("elementwise.cu", "ew_convert", n, pd, cd, ps, cs, n)
}

// MemStats reports the caching allocator's statistics.
func (b *Backend) MemStats() backend.MemStats {
	s := b.d.MemStats()
	total := b.d.info.TotalMem
	if l := b.d.alloc.memLimit(); l > 0 {
		total = min(total, l)
	}
	return backend.MemStats{Allocated: int64(s.Allocated), Reserved: int64(s.Reserved), Peak: int64(s.PeakAllocated), Total: int64(total)}
}

// SetMemoryLimit implements backend.MemoryLimiter: the caching allocator refuses to reserve
// past limit bytes from now on, and MemStats reports the cap as the device's total.
func (b *Backend) SetMemoryLimit(limit int64, why string) error {
	if limit <= 0 {
		return fmt.Errorf("cuda: %s: memory limit %d bytes must be positive", why, limit)
	}
	return b.d.alloc.setLimit(uint64(limit), why)
}

// ResetPeak sets the peak to the current allocation.
func (b *Backend) ResetPeak() { b.d.ResetPeakMem() }
