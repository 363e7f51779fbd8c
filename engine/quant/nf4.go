// Package quant stores weights in 4-bit NormalFloat (NF4) exactly as bitsandbytes does, so that
// a QLoRA base can be quantised at load or read from a bitsandbytes 4-bit checkpoint, and turned
// back into bf16 on the host; it reads and writes bitsandbytes' checkpoint layout (bnb.go) and
// the load_in_4bit request (config.go). It is the format and its host arithmetic only: the
// device op that dequantises into a scratch tensor is backend.Optional.DequantNF4, and the
// layer that owns a quantised weight lives in engine/nn.
//
// The layout, for a weight of N elements (any shape, flattened row-major):
//
//	packed  [ceil(N/2)] uint8    two 4-bit codes per byte, element 2i in the high nibble
//	absmax  [ceil(N/64)] fp32    the largest |x| of each block of Blocksize (64) elements
//
// An element dequantises to NF4Code[code] * absmax[block], computed in fp32 and rounded once to
// the output dtype. Quantisation divides by the block's absmax (as a multiplication by its fp32
// reciprocal) and picks the nearest code by comparing with the midpoints between neighbouring
// codes, a value on a midpoint taking the lower code.
//
// With double quantisation (bitsandbytes' compress_statistics, transformers'
// bnb_4bit_use_double_quant) the absmax vector is itself stored in 8 bits: its mean (Offset) is
// subtracted, and the centred values are quantised blockwise with bitsandbytes' signed dynamic
// map in blocks of 256, each with an fp32 absmax of absmax:
//
//	codes   [ceil(N/64)] uint8
//	absmax2 [ceil(ceil(N/64)/256)] fp32
//	absmax[b] = DynamicMap[codes[b]] * absmax2[b/256] + Offset   (fp32)
package quant

import (
	"fmt"
	"math"
	"runtime"
	"sync"

	"github.com/halo-shell/halo-shell/engine/tensor"
)

// Blocksize is the number of elements that share one absmax: 64, the bitsandbytes default and
// the only size transformers writes for QLoRA.
const Blocksize = 64

// NestedBlocksize is the number of absmax values that share one absmax of absmax under double
// quantisation (fixed at 256 by bitsandbytes).
const NestedBlocksize = 256

// NF4Code is the NF4 code book: the 16 normal-float values bitsandbytes publishes
// (get_4bit_type("nf4")), quantiles of a standard normal scaled to [-1, 1] with an exact zero.
var NF4Code = [16]float32{
	-1.0, -0.6961928009986877, -0.5250730514526367, -0.39491748809814453,
	-0.28444138169288635, -0.18477343022823334, -0.09105003625154495, 0.0,
	0.07958029955625534, 0.16093020141124725, 0.24611230194568634, 0.33791524171829224,
	0.44070982933044434, 0.5626170039176941, 0.7229568362236023, 1.0,
}

// nf4Mid[i] is the fp32 midpoint between NF4Code[i] and NF4Code[i+1], the thresholds of
// bitsandbytes' dQuantizeNF4 decision tree.
var nf4Mid = func() (m [15]float32) {
	for i := range m {
		m[i] = float32((float64(NF4Code[i]) + float64(NF4Code[i+1])) / 2)
	}
	return m
}()

// QuantizeNF4Value returns the NF4 code of a value already divided by its block's absmax. A
// value on a midpoint takes the lower code; NaN (0 * Inf, from a block of zeros) fails every
// comparison of bitsandbytes' decision tree and gets code 0.
func QuantizeNF4Value(x float32) uint8 {
	// The count of midpoints below x, without branches on x (b2u compiles to a set-on-compare):
	// twice as fast as branching on each comparison, and NaN, failing all of them, gets 0.
	var c uint8
	for _, m := range nf4Mid {
		c += b2u(x > m)
	}
	return c
}

func b2u(b bool) uint8 {
	if b {
		return 1
	}
	return 0
}

// Weight is one NF4-quantised tensor with its quantisation state.
type Weight struct {
	Shape  []int     // the original weight's shape (row-major)
	Packed []byte    // [ceil(N/2)] two codes per byte, even element in the high nibble
	Absmax []float32 // [ceil(N/64)] block absmax; nil when Nested holds it
	Nested *Nested   // double-quantised absmax, or nil
}

// Nested is a double-quantised absmax vector.
type Nested struct {
	Codes  []byte       // [blocks] 8-bit codes into Map
	Absmax []float32    // [ceil(blocks/256)] fp32 absmax of the centred absmax values
	Map    [256]float32 // the 8-bit code book (DynamicMap for weights this package writes)
	Offset float32      // the mean subtracted before quantising
}

// Options choose how QuantizeNF4 stores the absmax.
type Options struct {
	// DoubleQuant stores the absmax in 8 bits (bnb_4bit_use_double_quant).
	DoubleQuant bool
}

// N returns the number of elements.
func (w *Weight) N() int { return numel(w.Shape) }

// Blocks returns the number of 64-element blocks.
func (w *Weight) Blocks() int { return (w.N() + Blocksize - 1) / Blocksize }

func numel(shape []int) int {
	n := 1
	for _, d := range shape {
		n *= d
	}
	return n
}

// QuantizeNF4 quantises x (row-major, shape) to NF4 in blocks of 64, as bitsandbytes'
// quantize_4bit(quant_type="nf4", blocksize=64) does, with up to GOMAXPROCS goroutines over runs
// of blocks.
func QuantizeNF4(x []float32, shape []int, opt Options) (*Weight, error) {
	n := numel(shape)
	if n != len(x) || n == 0 {
		return nil, fmt.Errorf("quant: shape %v holds %d elements but %d values were given (need a non-empty tensor)", shape, n, len(x))
	}
	for _, d := range shape {
		if d <= 0 {
			return nil, fmt.Errorf("quant: shape %v has a non-positive dimension", shape)
		}
	}
	blocks := (n + Blocksize - 1) / Blocksize
	w := &Weight{Shape: append([]int(nil), shape...), Packed: make([]byte, (n+1)/2)}
	absmax := make([]float32, blocks)
	// Blocks are independent (a block of 64 fills 32 whole bytes), so runs of them are
	// quantised in parallel; the first non-finite element found is reported.
	bad := -1
	var mu sync.Mutex
	parallelBlocks(blocks, func(b0, b1 int) {
		for b := b0; b < b1; b++ {
			lo, hi := b*Blocksize, min((b+1)*Blocksize, n)
			blk := x[lo:hi]
			var am float32
			for i, v := range blk {
				if math.Float32bits(v)&0x7f800000 == 0x7f800000 { // NaN or ±Inf
					mu.Lock()
					if bad < 0 || lo+i < bad {
						bad = lo + i
					}
					mu.Unlock()
					return
				}
				if a := abs32(v); a > am {
					am = a
				}
			}
			absmax[b] = am
			inv := recip(am)
			out := w.Packed[lo/2:]
			j := 0
			for ; j+1 < len(blk); j += 2 {
				out[j/2] = QuantizeNF4Value(blk[j]*inv)<<4 | QuantizeNF4Value(blk[j+1]*inv)
			}
			if j < len(blk) { // the odd last element: the high nibble (the padding is below)
				out[j/2] = QuantizeNF4Value(blk[j]*inv) << 4
			}
		}
	})
	if bad >= 0 {
		return nil, fmt.Errorf("quant: element %d is %v; a weight must be finite to quantise", bad, x[bad])
	}
	if n%2 == 1 {
		// The last byte pairs the final element with a padding zero that bitsandbytes quantises
		// with the block's scale: code 7 (0.0), or code 0 when the block is all zeros.
		w.Packed[n/2] |= QuantizeNF4Value(float32(0 * recip(absmax[blocks-1])))
	}
	if !opt.DoubleQuant {
		w.Absmax = absmax
		return w, nil
	}
	w.Nested = quantizeNested(absmax)
	return w, nil
}

// parallelBlocks runs f over [0, blocks) split into contiguous runs, one goroutine per run,
// with as many runs as GOMAXPROCS (one for small tensors).
func parallelBlocks(blocks int, f func(b0, b1 int)) {
	workers := min(runtime.GOMAXPROCS(0), max(1, blocks/1024))
	if workers <= 1 {
		f(0, blocks)
		return
	}
	var wg sync.WaitGroup
	per := (blocks + workers - 1) / workers
	for b0 := 0; b0 < blocks; b0 += per {
		wg.Add(1)
		go func(b0, b1 int) {
			defer wg.Done()
			f(b0, b1)
		}(b0, min(b0+per, blocks))
	}
	wg.Wait()
}

// recip is 1/a in fp32; +Inf for a block of zeros, as the CUDA kernel computes it.
func recip(a float32) float32 {
	if a == 0 {
		return float32(math.Inf(1))
	}
	return 1 / a
}

func abs32(x float32) float32 { return math.Float32frombits(math.Float32bits(x) &^ (1 << 31)) }

// max32 is fmaxf for the non-NaN values callers pass.
func max32(a, b float32) float32 {
	if b > a || a != a {
		return b
	}
	return a
}

// quantizeNested double-quantises a block absmax vector: the mean is subtracted and the centred
// values are quantised with the signed dynamic map in blocks of 256. The mean is summed in
// float64 and rounded once to fp32 (torch's fp32 mean may differ from it in the last bit; a
// checkpoint carries its offset, so loading one is exact either way).
func quantizeNested(absmax []float32) *Nested {
	var sum float64
	for _, a := range absmax {
		sum += float64(a)
	}
	nd := &Nested{Map: DynamicMap(), Offset: float32(sum / float64(len(absmax)))}
	centred := make([]float32, len(absmax))
	for i, a := range absmax {
		centred[i] = float32(a - nd.Offset)
	}
	nd.Codes, nd.Absmax = QuantizeBlockwise8(centred, &nd.Map, NestedBlocksize)
	return nd
}

// BlockAbsmax returns the fp32 absmax of every 64-block, dequantising a nested absmax as
// bitsandbytes' dequantize_blockwise does: Map[code] * absmax2 + Offset, in fp32.
func (w *Weight) BlockAbsmax() []float32 {
	if w.Nested == nil {
		return w.Absmax
	}
	nd := w.Nested
	out := make([]float32, len(nd.Codes))
	for i, c := range nd.Codes {
		out[i] = float32(nd.Map[c]*nd.Absmax[i/NestedBlocksize]) + nd.Offset
	}
	return out
}

// Validate checks that the state's lengths agree with the shape.
func (w *Weight) Validate() error {
	n := numel(w.Shape)
	if n <= 0 {
		return fmt.Errorf("quant: NF4 weight has shape %v; need positive dimensions", w.Shape)
	}
	blocks := (n + Blocksize - 1) / Blocksize
	if len(w.Packed) != (n+1)/2 {
		return fmt.Errorf("quant: NF4 weight of shape %v needs %d packed bytes, has %d", w.Shape, (n+1)/2, len(w.Packed))
	}
	if w.Nested == nil {
		if len(w.Absmax) != blocks {
			return fmt.Errorf("quant: NF4 weight of shape %v needs %d absmax values (blocks of %d), has %d", w.Shape, blocks, Blocksize, len(w.Absmax))
		}
		return nil
	}
	if len(w.Nested.Codes) != blocks {
		return fmt.Errorf("quant: NF4 weight of shape %v needs %d nested absmax codes, has %d", w.Shape, blocks, len(w.Nested.Codes))
	}
	if want := (blocks + NestedBlocksize - 1) / NestedBlocksize; len(w.Nested.Absmax) != want {
		return fmt.Errorf("quant: NF4 weight of shape %v needs %d nested absmax values (blocks of %d), has %d", w.Shape, want, NestedBlocksize, len(w.Nested.Absmax))
	}
	return nil
}

// DequantizeF32 writes the weight into dst [N] as fp32: NF4Code[code] * absmax.
func (w *Weight) DequantizeF32(dst []float32) error {
	if err := w.checkDst(len(dst)); err != nil {
		return err
	}
	am := w.BlockAbsmax()
	for i := range dst {
		dst[i] = float32(NF4Code[w.code(i)] * am[i/Blocksize])
	}
	return nil
}

// DequantizeBF16 writes the weight into dst [N] as bf16 bit patterns: the fp32 product rounded
// to nearest even, as bitsandbytes' dequantize_4bit writes a bf16 tensor.
func (w *Weight) DequantizeBF16(dst []uint16) error {
	if err := w.checkDst(len(dst)); err != nil {
		return err
	}
	am := w.BlockAbsmax()
	for i := range dst {
		dst[i] = tensor.F32ToBF16(float32(NF4Code[w.code(i)] * am[i/Blocksize]))
	}
	return nil
}

func (w *Weight) code(i int) uint8 {
	b := w.Packed[i/2]
	if i%2 == 0 {
		return b >> 4
	}
	return b & 0xF
}

func (w *Weight) checkDst(n int) error {
	if err := w.Validate(); err != nil {
		return err
	}
	if n != w.N() {
		return fmt.Errorf("quant: dequantising an NF4 weight of shape %v (%d elements) into %d elements", w.Shape, w.N(), n)
	}
	return nil
}

// Bytes returns the storage the quantised weight takes: packed codes plus absmax state.
func (w *Weight) Bytes() int64 {
	return StorageBytes(int64(w.N()), w.Nested != nil)
}

// StorageBytes is the size of an NF4 weight of n elements: n/2 bytes of codes plus 4 bytes of
// absmax per 64 elements, or with double quantisation 1 byte per 64 elements, 4 bytes per
// 256 blocks and the 256-entry fp32 map (the offset is a scalar, held with the weight's
// metadata, not in device memory).
func StorageBytes(n int64, nested bool) int64 {
	blocks := (n + Blocksize - 1) / Blocksize
	b := (n + 1) / 2
	if !nested {
		return b + 4*blocks
	}
	return b + blocks + 4*((blocks+NestedBlocksize-1)/NestedBlocksize) + 4*256
}
