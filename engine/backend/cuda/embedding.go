package cuda

import (
	"encoding/binary"
	"fmt"
	"math"
	"slices"
	"unsafe"
)

// Host launchers of kernels/embedding.cu: the token embedding's gather and its deterministic
// scatter-add backward, with the sorted index metadata the backward reads.

// Embedding gathers rows of weight by ids.
func (b *Backend) Embedding(out, weight, ids T) error {
	const op = "Embedding"
	if weight.Rank() != 2 {
		return fmt.Errorf("cuda: Embedding: weight %v must be [V, C]", weight)
	}
	V, C := weight.Dim(0), weight.Dim(1)
	N := ids.Numel()
	if out.Numel() != N*C {
		return fmt.Errorf("cuda: Embedding: out %v must hold [%d, %d] for ids %v and weight %v", out, N, C, ids, weight)
	}
	arg := b.args(op)
	po, co := arg.float("out", out)
	pw, cw := arg.float("weight", weight)
	pi := arg.i32("ids", ids)
	if err := arg.err(); err != nil {
		return err
	}
	if N == 0 {
		return nil
	}
	total := int64(N) * int64(C)
	args := packArgs(po, co, pw, cw, pi, int64(N), int32(C), int32(V), b.flagPtr())
	// Uploaded ids are checked on the host; only ids made on the device need the flag read back.
	switch res, at, v := b.i32.checkRange(pi, N, int32(min(V, math.MaxInt32)), false); res {
	case i32Bad:
		return fmt.Errorf("cuda: Embedding: ids[%d] = %d is outside the vocabulary [0, %d)", at, v, V)
	case i32Valid:
		return b.d.Post(func() error {
			return b.d.launchOnThread("embedding.cu", "embedding_fwd", grid1D(total, b.d.info.SMs), [3]uint32{256, 1, 1}, 0, args...)
		})
	}
	return b.d.Do(func() error {
		if err := b.resetFlagOnThread(int64(N)); err != nil {
			return err
		}
		if err := b.d.launchOnThread("embedding.cu", "embedding_fwd", grid1D(total, b.d.info.SMs), [3]uint32{256, 1, 1}, 0, args...); err != nil {
			return err
		}
		bad, err := b.readFlagOnThread()
		if err != nil {
			return err
		}
		if int(bad) < N {
			var id int32
			_ = b.d.drv.cuMemcpyDtoH(unsafe.Pointer(&id), pi+uintptr(4*bad), 4)
			return fmt.Errorf("cuda: Embedding: ids[%d] = %d is outside the vocabulary [0, %d)", bad, id, V)
		}
		return nil
	})
}

// EmbeddingBackward scatter-adds dOut rows into dWeight, deterministically.
func (b *Backend) EmbeddingBackward(dWeight, dOut, ids T) error {
	const op = "EmbeddingBackward"
	if dWeight.Rank() != 2 {
		return fmt.Errorf("cuda: %s: dWeight %v must be [V, C]", op, dWeight)
	}
	V, C := dWeight.Dim(0), dWeight.Dim(1)
	N := ids.Numel()
	if dOut.Numel() != N*C {
		return fmt.Errorf("cuda: %s: dOut %v must hold [%d, %d]", op, dOut, N, C)
	}
	arg := b.args(op)
	pw, cw := arg.float("dWeight", dWeight)
	pd, cd := arg.float("dOut", dOut)
	pi := arg.i32("ids", ids)
	if err := arg.err(); err != nil {
		return err
	}
	if N == 0 {
		return nil
	}
	// Uploaded ids are sorted from their host copy here, while the device goroutine launches
	// earlier work; others are downloaded first (a wait), on the device goroutine.
	host, known := b.hostInt32(pi, N)
	var meta []byte
	var nOrder, nUniq int
	if known {
		var err error
		if meta, nOrder, nUniq, err = embeddingBackwardMeta(host, V); err != nil {
			return fmt.Errorf("cuda: %s: %w", op, err)
		}
	}
	queue := b.d.Post
	if !known {
		queue = b.d.Do
	}
	return queue(func() error {
		drv := b.d.drv
		if !known {
			if err := b.d.syncOnThread(); err != nil {
				return err
			}
			host := make([]int32, N)
			if err := drv.check("cuMemcpyDtoH_v2", drv.cuMemcpyDtoH(unsafe.Pointer(&host[0]), pi, uint64(4*N))); err != nil {
				return err
			}
			var err error
			if meta, nOrder, nUniq, err = embeddingBackwardMeta(host, V); err != nil {
				return fmt.Errorf("cuda: %s: %w", op, err)
			}
		}
		buf, err := b.d.allocOnThread(uint64(len(meta)))
		if err != nil {
			return err
		}
		defer b.d.alloc.Free(buf.ptr) // freed after the kernel: later work is on the same stream
		if err := b.uploadOnThread(buf.ptr, meta); err != nil {
			return err
		}
		pOrder := buf.ptr
		pUniq := pOrder + uintptr(4*nOrder)
		pSeg := pUniq + uintptr(4*nUniq)
		args := packArgs(pw, cw, pd, cd, pOrder, pUniq, pSeg, int32(C))
		grid := [3]uint32{uint32(nUniq), uint32((C + 127) / 128), 1}
		return b.d.launchOnThread("embedding.cu", "embedding_bwd", grid, [3]uint32{128, 1, 1}, 0, args...)
	})
}

// embeddingBackwardMeta returns what embedding_bwd reads, as little-endian int32 bytes: order
// [N] (token indices sorted by id, stably), uniq [U] (the distinct ids, ascending) and seg [U+1]
// (uniq[u]'s tokens are order[seg[u]:seg[u+1]]). An id outside [0, V) is an error naming it.
func embeddingBackwardMeta(ids []int32, V int) (meta []byte, nOrder, nUniq int, err error) {
	N := len(ids)
	keys := make([]uint64, N)
	for i, id := range ids {
		if id < 0 || int(id) >= V {
			return nil, 0, 0, fmt.Errorf("ids[%d] = %d is outside the vocabulary [0, %d)", i, id, V)
		}
		keys[i] = uint64(id)<<32 | uint64(i) // unique keys: sorting them is a stable sort by id
	}
	slices.Sort(keys)
	nUniq = 0
	for k, key := range keys {
		if k == 0 || key>>32 != keys[k-1]>>32 {
			nUniq++
		}
	}
	meta = make([]byte, 4*(N+2*nUniq+1))
	order, uniq, seg := meta[:4*N], meta[4*N:4*(N+nUniq)], meta[4*(N+nUniq):]
	u := 0
	for k, key := range keys {
		binary.LittleEndian.PutUint32(order[4*k:], uint32(key))
		if k == 0 || key>>32 != keys[k-1]>>32 {
			binary.LittleEndian.PutUint32(uniq[4*u:], uint32(key>>32))
			binary.LittleEndian.PutUint32(seg[4*u:], uint32(k))
			u++
		}
	}
	binary.LittleEndian.PutUint32(seg[4*nUniq:], uint32(N))
	return meta, N, nUniq, nil
}
