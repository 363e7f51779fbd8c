package backend

import "fmt"

// ColumnCopyArgs describe Ops.CopyColumns, a copy of column blocks between two row-major
// matrices with the same number of rows. Dst is viewed as [R, Cd] and Src as [R, Cs], with R
// their first dimension and the columns the product of the rest. For every row n, group
// g < Groups and j < Width:
//
//	Dst[n, DstOffset + g*DstStride + j]  =  Src[n, SrcOffset + g*SrcStride + j]     (or +=)
//
// SrcStride 0 broadcasts one block of Src to every group of Dst. DstStride 0 (with Groups > 1)
// sums the groups of Src into one block of Dst, in increasing g, in fp32, rounded once: the
// backward of a broadcast. Columns of Dst outside the blocks are left as they are. With
// Accumulate the result is added to Dst (one rounding). It moves the heads of
// multi-head latent attention between the projections' layouts and the attention's (engine/nn
// MLA): splits, concatenations and broadcasts of per-head columns that Rows views cannot
// express. Dst and Src must not share a buffer.
type ColumnCopyArgs struct {
	Dst, Src             T
	Groups, Width        int
	DstOffset, DstStride int
	SrcOffset, SrcStride int
	Accumulate           bool
}

// Dims checks the geometry of a (shapes and bounds, not dtypes or devices) and returns the
// rows and the column counts of Dst and Src. Errors name the argument: "copy-columns: ...".
func (a ColumnCopyArgs) Dims() (rows, dstCols, srcCols int, err error) {
	const op = "copy-columns"
	if a.Dst.IsNil() || a.Src.IsNil() {
		return 0, 0, 0, fmt.Errorf("%s: Dst and Src are required", op)
	}
	if a.Dst.Rank() < 1 || a.Src.Rank() < 1 || a.Dst.Dim(0) != a.Src.Dim(0) {
		return 0, 0, 0, fmt.Errorf("%s: Dst %v and Src %v must have the same number of rows (dim 0)", op, a.Dst, a.Src)
	}
	rows = a.Dst.Dim(0)
	if rows == 0 {
		return 0, 0, 0, nil
	}
	dstCols, srcCols = a.Dst.Numel()/rows, a.Src.Numel()/rows
	if a.Groups < 1 || a.Width < 1 {
		return 0, 0, 0, fmt.Errorf("%s: Groups %d and Width %d must be at least 1", op, a.Groups, a.Width)
	}
	if a.DstStride < 0 || a.SrcStride < 0 || a.DstOffset < 0 || a.SrcOffset < 0 {
		return 0, 0, 0, fmt.Errorf("%s: offsets and strides must not be negative (Dst %d+%d·g, Src %d+%d·g)", op, a.DstOffset, a.DstStride, a.SrcOffset, a.SrcStride)
	}
	if a.DstStride > 0 && a.DstStride < a.Width && a.Groups > 1 {
		return 0, 0, 0, fmt.Errorf("%s: DstStride %d is below Width %d, so the groups' blocks would overlap in Dst (use DstStride 0 to sum them)", op, a.DstStride, a.Width)
	}
	if end := a.DstOffset + (a.Groups-1)*a.DstStride + a.Width; end > dstCols {
		return 0, 0, 0, fmt.Errorf("%s: the blocks end at column %d of Dst %v, which has %d columns", op, end, a.Dst, dstCols)
	}
	if end := a.SrcOffset + (a.Groups-1)*a.SrcStride + a.Width; end > srcCols {
		return 0, 0, 0, fmt.Errorf("%s: the blocks end at column %d of Src %v, which has %d columns", op, end, a.Src, srcCols)
	}
	return rows, dstCols, srcCols, nil
}
