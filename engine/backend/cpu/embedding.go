package cpu

import "fmt"

// colChunk is the number of columns per parallel chunk in column-split ops.
const colChunk = 64

func (b *Backend) embeddingShapes(op string, out, weight, ids T) (n, c, v int, idv []int32, err error) {
	if weight.IsNil() || weight.Rank() != 2 {
		return 0, 0, 0, nil, fmt.Errorf("cpu: %s: weight %v must be 2-D [V, C]", op, weight)
	}
	v, c = weight.Dim(0), weight.Dim(1)
	if idv, err = ints(op, "ids", ids); err != nil {
		return
	}
	n = len(idv)
	if err = numel(op, "out", out, n*c, "numel(ids)*C"); err != nil {
		return
	}
	for i, id := range idv {
		if id < 0 || int(id) >= v {
			err = fmt.Errorf("cpu: %s: ids[%d] = %d is outside the vocabulary [0, %d)", op, i, id, v)
			return
		}
	}
	return
}

// Embedding gathers out[n] = weight[ids[n]].
func (b *Backend) Embedding(out, weight, ids T) error {
	const op = "embedding"
	_, c, _, idv, err := b.embeddingShapes(op, out, weight, ids)
	if err != nil {
		return err
	}
	ws, err := b.in(op, "weight", weight)
	if err != nil {
		return err
	}
	os, flush, err := b.out(op, "out", out, false)
	if err != nil {
		return err
	}
	b.pool.rows(len(idv), 64, func(lo, hi int) {
		for i := lo; i < hi; i++ {
			id := int(idv[i])
			copy(os[i*c:(i+1)*c], ws[id*c:(id+1)*c])
		}
	})
	flush()
	return nil
}

// EmbeddingBackward scatter-adds dWeight[ids[n]] += dOut[n], in increasing n per row. Work is
// split by columns, so no two workers touch the same element.
func (b *Backend) EmbeddingBackward(dWeight, dOut, ids T) error {
	const op = "embedding-backward"
	_, c, _, idv, err := b.embeddingShapes(op, dOut, dWeight, ids)
	if err != nil {
		return err
	}
	ds, err := b.in(op, "dOut", dOut)
	if err != nil {
		return err
	}
	dw, flush, err := b.out(op, "dWeight", dWeight, true)
	if err != nil {
		return err
	}
	b.pool.rows(c, colChunk, func(lo, hi int) {
		for i, id := range idv {
			src := ds[i*c+lo : i*c+hi]
			dst := dw[int(id)*c+lo : int(id)*c+hi]
			for j, v := range src {
				dst[j] += v
			}
		}
	})
	flush()
	return nil
}
