package tokenizer

import "unicode/utf8"

// The byte-level alphabet of GPT-2: every byte maps to one printable rune, so that any
// byte string becomes a string of visible characters. Printable Latin-1 bytes map to
// themselves; the others map to U+0100 upwards in byte order.
var (
	byteToRune [256]rune
	runeToByte map[rune]byte
	// byteToStr holds the UTF-8 encoding of byteToRune for each byte.
	byteToStr [256]string
)

func init() {
	runeToByte = make(map[rune]byte, 256)
	n := 0
	for b := 0; b < 256; b++ {
		printable := (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF)
		r := rune(b)
		if !printable {
			r = rune(256 + n)
			n++
		}
		byteToRune[b] = r
		runeToByte[r] = byte(b)
		byteToStr[b] = string(r)
	}
}

// byteLevelEncode maps every byte of s to its byte-level rune.
func byteLevelEncode(s string) string {
	buf := make([]byte, 0, len(s)*2)
	for i := 0; i < len(s); i++ {
		buf = utf8.AppendRune(buf, byteToRune[s[i]])
	}
	return string(buf)
}

// byteLevelDecodeToken appends the bytes a byte-level token stands for. A token containing
// a rune outside the byte-level alphabet (an added token such as "<think>" is inside it,
// but one with CJK text is not) is appended as its own UTF-8 bytes, as Hugging Face does.
func byteLevelDecodeToken(dst []byte, tok string) []byte {
	start := len(dst)
	for _, r := range tok {
		b, ok := runeToByte[r]
		if !ok {
			return append(dst[:start], tok...)
		}
		dst = append(dst, b)
	}
	return dst
}

// lossyUTF8 converts b to a string the way Rust's String::from_utf8_lossy does: each
// maximal prefix of an invalid sequence becomes one U+FFFD (Go's conversions would emit
// one per byte, which differs for truncated multi-byte sequences).
func lossyUTF8(b []byte) string {
	if utf8.Valid(b) {
		return string(b)
	}
	out := make([]byte, 0, len(b)+8)
	for i := 0; i < len(b); {
		c := b[i]
		if c < 0x80 {
			out = append(out, c)
			i++
			continue
		}
		r, size := utf8.DecodeRune(b[i:])
		if r != utf8.RuneError || size > 1 {
			out = append(out, b[i:i+size]...)
			i += size
			continue
		}
		// Invalid: consume the maximal subpart of a well-formed sequence (Unicode 3.9, U+FFFD
		// substitution of maximal subparts), at least one byte.
		out = append(out, "\uFFFD"...)
		i += maximalSubpart(b[i:])
	}
	return string(out)
}

// maximalSubpart returns the length (>= 1) of the longest prefix of b that starts a
// well-formed UTF-8 sequence but does not complete it.
func maximalSubpart(b []byte) int {
	c := b[0]
	var need int
	lo, hi := byte(0x80), byte(0xBF)
	switch {
	case c >= 0xC2 && c <= 0xDF:
		need = 1
	case c == 0xE0:
		need, lo = 2, 0xA0
	case c >= 0xE1 && c <= 0xEC, c == 0xEE, c == 0xEF:
		need = 2
	case c == 0xED:
		need, hi = 2, 0x9F
	case c == 0xF0:
		need, lo = 3, 0x90
	case c >= 0xF1 && c <= 0xF3:
		need = 3
	case c == 0xF4:
		need, hi = 3, 0x8F
	default:
		return 1
	}
	n := 1
	for k := 0; k < need && n < len(b); k++ {
		x := b[n]
		if k == 0 {
			if x < lo || x > hi {
				return n
			}
		} else if x < 0x80 || x > 0xBF {
			return n
		}
		n++
	}
	return n
}
