package cuda

import (
	"encoding/binary"
	"hash/fnv"
	"slices"
)

// Block order of the Hopper attention kernels.
//
// A block of attention_wg.cu owns 64 rows of one head, and its work is the tiles of the other
// side that those rows see: under a causal mask over packed documents, a query block near the
// end of a long document walks up to 64 times more key tiles than one near its start, and a
// dK/dV block near the start walks that many query tiles for each of the G query heads of its
// group. Launched in row order, head after head, the heaviest blocks of the last heads start
// when most of the grid is done and run on alone (for dK/dV at 4 x 4096 tokens a block near a
// document start is about 40% of an SM slot's share). So the kernels take a one-dimensional
// grid whose index runs over heads fastest and over a rank of row blocks, heaviest first (the
// longest-processing-time-first order); the rank is mapped to a row block through an order
// computed here from the host's copy of the document boundaries and uploaded once per distinct
// boundaries. Without a host copy (boundaries made on the device) or with separate key
// boundaries the kernels use their built-in order (longest rows first within each document's
// span for queries, key blocks in row order).

// attnBlockOrder lists the row blocks (rows rows each, over the cu[len(cu)-1] rows of cu's
// documents) heaviest first, ties in row order. keys selects the dK/dV estimate (queries that
// see the block's keys) over the query estimate (keys its queries see); window is the sliding
// window (0: none).
func attnBlockOrder(cu []int32, rows, window int, keys bool) []int32 {
	n := int(cu[len(cu)-1])
	nb := (n + rows - 1) / rows
	work := make([]int, nb)
	doc := 0 // the document of the current row, advanced monotonically
	docOf := func(r int) int {
		for doc+1 < len(cu)-1 && int(cu[doc+1]) <= r {
			doc++
		}
		return doc
	}
	for b := range nb {
		r0, r1 := b*rows, min((b+1)*rows, n)-1
		if keys {
			d := docOf(r1)
			hi := int(cu[d+1]) - 1
			if window > 0 {
				hi = min(hi, r1+window-1)
			}
			work[b] = hi - r0 + 1
			continue
		}
		d := docOf(r0)
		lo := int(cu[d])
		if window > 0 {
			lo = max(lo, r0-window+1)
		}
		work[b] = r1 - lo + 1
	}
	order := make([]int32, nb)
	for i := range order {
		order[i] = int32(i)
	}
	slices.SortStableFunc(order, func(a, b int32) int { return work[b] - work[a] })
	return order
}

// attnOrderKey identifies an order: the estimate, the window and the boundaries.
func attnOrderKey(cu []int32, window int, keys bool) uint64 {
	h := fnv.New64a()
	var buf [4]byte
	put := func(v int32) {
		binary.LittleEndian.PutUint32(buf[:], uint32(v))
		h.Write(buf[:])
	}
	flag := int32(window) << 1
	if keys {
		flag |= 1
	}
	put(flag)
	for _, v := range cu {
		put(v)
	}
	return h.Sum64()
}

// attnOrdersMax bounds the cached orders (each a few KiB of device memory); past it the cache
// starts over.
const attnOrdersMax = 64

// attnOrderOnThread returns the device address of the order for cu (a host copy the caller no
// longer changes), uploading it on first use, or 0 when cu is nil. Device goroutine only.
func (b *Backend) attnOrderOnThread(cu []int32, window int, keys bool) (uintptr, error) {
	if cu == nil {
		return 0, nil
	}
	key := attnOrderKey(cu, window, keys)
	if p, ok := b.attnOrders[key]; ok {
		return p.ptr, nil
	}
	order := attnBlockOrder(cu, wgRows, window, keys)
	buf, err := b.d.allocOnThread(uint64(4 * len(order)))
	if err != nil {
		return 0, err
	}
	raw := make([]byte, 4*len(order))
	for i, v := range order {
		binary.LittleEndian.PutUint32(raw[4*i:], uint32(v))
	}
	if err := b.uploadOnThread(buf.ptr, raw); err != nil {
		b.d.alloc.Free(buf.ptr)
		return 0, err
	}
	if b.attnOrders == nil || len(b.attnOrders) >= attnOrdersMax {
		for _, old := range b.attnOrders {
			b.d.alloc.Free(old.ptr) // stream-ordered: kernels queued before still read it
		}
		b.attnOrders = map[uint64]*Buffer{}
	}
	b.attnOrders[key] = buf
	return buf.ptr, nil
}
