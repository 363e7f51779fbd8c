package cpu

import "github.com/halo-shell/halo-shell/engine/backend"

// CopyColumns implements backend.Ops.CopyColumns: block copies between the columns of two
// matrices, broadcasting (SrcStride 0) or summing in increasing group order (DstStride 0).
func (b *Backend) CopyColumns(a backend.ColumnCopyArgs) error {
	const op = "copy-columns"
	rows, dc, sc, err := a.Dims()
	if err != nil {
		return err
	}
	if rows == 0 {
		return nil
	}
	if err := overlapErr(op, "Dst", a.Dst, "Src", a.Src); err != nil {
		return err
	}
	src, err := b.in(op, "Src", a.Src)
	if err != nil {
		return err
	}
	// Dst is loaded: only its blocks are written.
	dst, flush, err := b.out(op, "Dst", a.Dst, true)
	if err != nil {
		return err
	}
	sum := a.DstStride == 0 && a.Groups > 1
	b.pool.rows(rows, max(1, convChunk/max(1, a.Groups*a.Width)), func(lo, hi int) {
		for n := lo; n < hi; n++ {
			s, d := src[n*sc:(n+1)*sc], dst[n*dc:(n+1)*dc]
			if sum {
				for j := 0; j < a.Width; j++ {
					var acc float32
					for g := 0; g < a.Groups; g++ {
						acc += s[a.SrcOffset+g*a.SrcStride+j]
					}
					if a.Accumulate {
						acc += d[a.DstOffset+j]
					}
					d[a.DstOffset+j] = acc
				}
				continue
			}
			for g := 0; g < a.Groups; g++ {
				sb := s[a.SrcOffset+g*a.SrcStride:][:a.Width]
				db := d[a.DstOffset+g*a.DstStride:][:a.Width]
				if a.Accumulate {
					for j, v := range sb {
						db[j] += v
					}
				} else {
					copy(db, sb)
				}
			}
		}
	})
	flush()
	return nil
}
