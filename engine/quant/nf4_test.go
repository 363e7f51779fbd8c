package quant

import (
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"math"
	"os"
	"testing"

	"github.com/halo-shell/halo-shell/engine/tensor"
)

// The golden file is written by the independent reference implementation
// scripts/nf4-goldens/gen.py (python3 scripts/nf4-goldens/gen.py from the repository root), not
// by this package, so it has no -update flag here: regenerating it from the Go code would make
// the comparison circular.
type golden struct {
	NF4Code      []uint32     `json:"nf4_code"`
	NF4Midpoints []uint32     `json:"nf4_midpoints"`
	DynamicMap   []uint32     `json:"dynamic_map_signed"`
	Cases        []goldenCase `json:"cases"`
}

type goldenCase struct {
	Name           string   `json:"name"`
	N              int      `json:"n"`
	Seed           uint32   `json:"seed"`
	Nested         bool     `json:"nested"`
	Packed         string   `json:"packed"`
	Absmax         []uint32 `json:"absmax"`
	Offset         uint32   `json:"offset"`
	NestedCodes    string   `json:"nested_codes"`
	NestedAbsmax   []uint32 `json:"nested_absmax"`
	DequantAbsmax  []uint32 `json:"dequant_absmax"`
	DequantSHA256  string   `json:"dequant_bf16_sha256"`
	DequantBF16Hex string   `json:"dequant_bf16"`
}

func loadGolden(t *testing.T) golden {
	t.Helper()
	raw, err := os.ReadFile("testdata/nf4_golden.json")
	if err != nil {
		t.Fatal(err)
	}
	var g golden
	if err := json.Unmarshal(raw, &g); err != nil {
		t.Fatal(err)
	}
	return g
}

// lcgInput is gen.py's lcg_input: a 32-bit LCG, uniform in (-1, 1), times a per-block scale,
// rounded to bf16.
func lcgInput(n int, seed uint32) []float32 {
	s := seed
	out := make([]float32, n)
	for i := range out {
		s = s*1664525 + 1013904223
		u := float32(float64(int32(s>>8)-(1<<23)) / float64(1<<23))
		scale := float32(0.01 + float64(0.37*float64((i/64)%11)))
		out[i] = tensor.BF16ToF32(tensor.F32ToBF16(float32(u * scale)))
	}
	return out
}

func bitsOf(xs []float32) []uint32 {
	out := make([]uint32, len(xs))
	for i, x := range xs {
		out[i] = math.Float32bits(x)
	}
	return out
}

func firstDiff(a, b []uint32) int {
	if len(a) != len(b) {
		return -2
	}
	for i := range a {
		if a[i] != b[i] {
			return i
		}
	}
	return -1
}

func TestCodeBooksMatchReference(t *testing.T) {
	g := loadGolden(t)
	if i := firstDiff(bitsOf(NF4Code[:]), g.NF4Code); i != -1 {
		t.Errorf("NF4Code differs from the reference at %d", i)
	}
	if i := firstDiff(bitsOf(nf4Mid[:]), g.NF4Midpoints); i != -1 {
		t.Errorf("NF4 midpoints differ from the reference at %d", i)
	}
	m := DynamicMap()
	if i := firstDiff(bitsOf(m[:]), g.DynamicMap); i != -1 {
		t.Errorf("DynamicMap differs from the reference at %d: got %v", i, m[max(i, 0)])
	}
}

// The thresholds bitsandbytes' dQuantizeNF4 hard-codes as float literals; the midpoints this
// package derives from the code book must round to the same fp32 values.
func TestMidpointsMatchPublishedDecisionTree(t *testing.T) {
	published := []float64{
		-0.8480964004993439, -0.6106329262256622, -0.4599952697753906, -0.33967943489551544,
		-0.23460740596055984, -0.13791173323988914, -0.045525018125772476, 0.03979014977812767,
		0.1202552504837513, 0.2035212516784668, 0.2920137718319893, 0.3893125355243683,
		0.5016634166240692, 0.6427869200706482, 0.8614784181118011,
	}
	for i, p := range published {
		if nf4Mid[i] != float32(p) {
			t.Errorf("midpoint %d = %v, decision tree has %v", i, nf4Mid[i], float32(p))
		}
	}
}

func TestQuantizeMatchesReference(t *testing.T) {
	g := loadGolden(t)
	if len(g.Cases) == 0 {
		t.Fatal("golden has no cases")
	}
	for _, c := range g.Cases {
		t.Run(c.Name, func(t *testing.T) {
			x := lcgInput(c.N, c.Seed)
			w, err := QuantizeNF4(x, []int{c.N}, Options{DoubleQuant: c.Nested})
			if err != nil {
				t.Fatal(err)
			}
			if got := hex.EncodeToString(w.Packed); got != c.Packed {
				t.Fatalf("packed codes differ from the reference (first 32 hex: got %.32s want %.32s)", got, c.Packed)
			}
			if !c.Nested {
				if i := firstDiff(bitsOf(w.Absmax), c.Absmax); i != -1 {
					t.Fatalf("absmax differs at block %d", i)
				}
			} else {
				nd := w.Nested
				if math.Float32bits(nd.Offset) != c.Offset {
					t.Fatalf("offset %v, reference %v", nd.Offset, math.Float32frombits(c.Offset))
				}
				if got := hex.EncodeToString(nd.Codes); got != c.NestedCodes {
					t.Fatalf("nested codes differ from the reference")
				}
				if i := firstDiff(bitsOf(nd.Absmax), c.NestedAbsmax); i != -1 {
					t.Fatalf("nested absmax differs at %d", i)
				}
				if i := firstDiff(bitsOf(w.BlockAbsmax()), c.DequantAbsmax); i != -1 {
					t.Fatalf("dequantised absmax differs at block %d", i)
				}
			}
			dst := make([]uint16, c.N)
			if err := w.DequantizeBF16(dst); err != nil {
				t.Fatal(err)
			}
			raw := make([]byte, 2*len(dst))
			for i, v := range dst {
				binary.LittleEndian.PutUint16(raw[2*i:], v)
			}
			if c.DequantBF16Hex != "" && hex.EncodeToString(raw) != c.DequantBF16Hex {
				t.Fatalf("bf16 dequantisation differs from the reference")
			}
			sum := sha256.Sum256(raw)
			if hex.EncodeToString(sum[:]) != c.DequantSHA256 {
				t.Fatalf("bf16 dequantisation hash differs from the reference")
			}
		})
	}
}

// Bit patterns derived by hand from the algorithm.
func TestQuantizeEdgeCases(t *testing.T) {
	mid7 := nf4Mid[7] // between 0.0 (code 7) and 0.0796 (code 8)
	above := math.Nextafter32(mid7, 1)
	tests := []struct {
		name   string
		x      []float32
		packed []byte
		absmax []float32
	}{
		// 0 * (1/0) is NaN, which every comparison rejects: code 0 everywhere, absmax 0.
		{"all zeros", make([]float32, 64), make([]byte, 32), []float32{0}},
		// +a and -a tie for the absmax; they map to the ends of the code book. 0.5 lies below
		// the 0.4407|0.5626 midpoint 0.50166 (code 12), -0.5 below the -0.5251|-0.3949
		// midpoint -0.45999 (code 2).
		{"absmax tie", []float32{2, -2, 1, -1}, []byte{0xF0, 0xC2}, []float32{2}},
		// 1 and -1 of absmax 1 are codes 15 and 0; a value on a midpoint takes the lower code,
		// the next float above it the upper.
		{"midpoint", []float32{1, -1, mid7, above}, []byte{0xF0, 0x78}, []float32{1}},
		// Extremes of fp32 range: the reciprocal of 3e38 is subnormal, the ratio still ±1.
		{"extremes", []float32{3e38, -3e38}, []byte{0xF0}, []float32{3e38}},
		// Odd count: the last low nibble is the padding zero, code 7.
		// 0.5 lies below the 0.4407|0.5626 midpoint 0.50166: code 12.
		{"odd count", []float32{1, -1, 0.5}, []byte{0xF0, 0xC7}, []float32{1}},
		// 65 elements: the last block holds one element, itself its absmax (code 15), padded 7.
		{"partial block", append(make([]float32, 64), -0.25), append(make([]byte, 32), 0x07), []float32{0, 0.25}},
	}
	tests[5].packed[32] = 0x07
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			w, err := QuantizeNF4(tc.x, []int{len(tc.x)}, Options{})
			if err != nil {
				t.Fatal(err)
			}
			if hex.EncodeToString(w.Packed) != hex.EncodeToString(tc.packed) {
				t.Errorf("packed %x, want %x", w.Packed, tc.packed)
			}
			if i := firstDiff(bitsOf(w.Absmax), bitsOf(tc.absmax)); i != -1 {
				t.Errorf("absmax %v, want %v", w.Absmax, tc.absmax)
			}
		})
	}
}

func TestQuantizeRefusesBadInput(t *testing.T) {
	for _, tc := range []struct {
		name  string
		x     []float32
		shape []int
	}{
		{"shape mismatch", []float32{1, 2, 3}, []int{2, 2}},
		{"empty", nil, []int{0}},
		{"nan", []float32{1, float32(math.NaN())}, []int{2}},
		{"inf", []float32{float32(math.Inf(-1))}, []int{1}},
	} {
		if _, err := QuantizeNF4(tc.x, tc.shape, Options{}); err == nil {
			t.Errorf("%s: QuantizeNF4 accepted it", tc.name)
		}
	}
}

// Round trip: every element comes back within half the widest code gap of its block's scale
// (plus the bf16 rounding of the result), and a nested absmax stays within the 8-bit map's
// resolution of the exact one.
func TestRoundTripErrorBound(t *testing.T) {
	var gap float32
	for i := 0; i < 15; i++ {
		gap = max(gap, NF4Code[i+1]-NF4Code[i])
	}
	for _, nested := range []bool{false, true} {
		x := lcgInput(64*40+3, 9)
		w, err := QuantizeNF4(x, []int{len(x)}, Options{DoubleQuant: nested})
		if err != nil {
			t.Fatal(err)
		}
		exact, _ := QuantizeNF4(x, []int{len(x)}, Options{})
		got := make([]float32, len(x))
		if err := w.DequantizeF32(got); err != nil {
			t.Fatal(err)
		}
		am := w.BlockAbsmax()
		var worst float64
		for i := range x {
			b := i / Blocksize
			ref := float64(exact.Absmax[b])
			scaleErr := math.Abs(float64(am[b]) - ref)
			bound := float64(gap)/2*ref + scaleErr + 1e-6
			e := math.Abs(float64(got[i] - x[i]))
			worst = max(worst, e/ref)
			if e > bound {
				t.Fatalf("nested=%v element %d: |%v - %v| = %v > bound %v", nested, i, got[i], x[i], e, bound)
			}
			// The 8-bit map's widest gap is under 0.015 of the nested block's scale.
			if nested && scaleErr > 0.0075*float64(w.Nested.Absmax[b/NestedBlocksize])+1e-7 {
				t.Fatalf("nested absmax of block %d is %v, exact %v", b, am[b], ref)
			}
		}
		if worst < 0.01 {
			t.Errorf("nested=%v: worst relative error %v is implausibly small for 4 bits", nested, worst)
		}
	}
}

func TestStorageBytes(t *testing.T) {
	n := int64(4096 * 4096)
	plain := StorageBytes(n, false)
	if want := n/2 + 4*n/64; plain != want {
		t.Errorf("plain = %d, want %d", plain, want)
	}
	nested := StorageBytes(n, true)
	if want := n/2 + n/64 + 4*(n/64/256) + 4*256; nested != want {
		t.Errorf("nested = %d, want %d", nested, want)
	}
	if bpp := float64(nested) / float64(n); bpp < 0.5 || bpp > 0.52 {
		t.Errorf("nested NF4 costs %.4f bytes per parameter, want about 0.516", bpp)
	}
}

// TestCodeSearchCountsMidpoints checks the four-comparison search of QuantizeNF4Value against
// its definition, the number of midpoints below the value: on every midpoint, the fp32
// neighbours of each, the code values, ±1, beyond ±1, zeros, infinities and NaN (code 0).
func TestCodeSearchCountsMidpoints(t *testing.T) {
	count := func(x float32) uint8 {
		var c uint8
		for _, m := range nf4Mid {
			if x > m {
				c++
			}
		}
		return c
	}
	xs := []float32{0, float32(math.Copysign(0, -1)), 1, -1, 1.5, -1.5, float32(math.Inf(1)), float32(math.Inf(-1)), float32(math.NaN())}
	for _, m := range nf4Mid {
		xs = append(xs, m, math.Nextafter32(m, 2), math.Nextafter32(m, -2))
	}
	xs = append(xs, NF4Code[:]...)
	for i := 0; i <= 4000; i++ {
		xs = append(xs, float32(i-2000)/1999)
	}
	for _, x := range xs {
		if got, want := QuantizeNF4Value(x), count(x); got != want {
			t.Errorf("QuantizeNF4Value(%v) = %d, want %d (midpoints below it)", x, got, want)
		}
	}
}
