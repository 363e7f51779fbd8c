package safetensors

import (
	"strconv"
	"unicode/utf8"
)

// appendRustJSONString appends s as a JSON string the way Rust's serde_json writes it (which is
// what the reference writer uses for headers): '"' and '\\' are escaped, control characters
// below 0x20 become \b \t \n \f \r or \u00xx (lower-case hex), everything else, including
// non-ASCII text and 0x7f, is written as is. s must be valid UTF-8.
func appendRustJSONString(dst []byte, s string) []byte {
	const hex = "0123456789abcdef"
	dst = append(dst, '"')
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case c == '"' || c == '\\':
			dst = append(dst, '\\', c)
		case c == '\b':
			dst = append(dst, '\\', 'b')
		case c == '\t':
			dst = append(dst, '\\', 't')
		case c == '\n':
			dst = append(dst, '\\', 'n')
		case c == '\f':
			dst = append(dst, '\\', 'f')
		case c == '\r':
			dst = append(dst, '\\', 'r')
		case c < 0x20:
			dst = append(dst, '\\', 'u', '0', '0', hex[c>>4], hex[c&0xf])
		default:
			dst = append(dst, c)
		}
	}
	return append(dst, '"')
}

// appendPythonJSONString appends s as a JSON string the way Python's json.dumps writes it with
// its default ensure_ascii=True (which is how transformers writes index files): printable ASCII
// as is except '"' and '\\', \n \r \t \b \f by name, everything else as \uxxxx (lower-case
// hex), characters above U+FFFF as a surrogate pair. s must be valid UTF-8.
func appendPythonJSONString(dst []byte, s string) []byte {
	const hex = "0123456789abcdef"
	u4 := func(dst []byte, r rune) []byte {
		return append(dst, '\\', 'u', hex[r>>12&0xf], hex[r>>8&0xf], hex[r>>4&0xf], hex[r&0xf])
	}
	dst = append(dst, '"')
	for _, r := range s {
		switch {
		case r == '"' || r == '\\':
			dst = append(dst, '\\', byte(r))
		case r == '\n':
			dst = append(dst, '\\', 'n')
		case r == '\r':
			dst = append(dst, '\\', 'r')
		case r == '\t':
			dst = append(dst, '\\', 't')
		case r == '\b':
			dst = append(dst, '\\', 'b')
		case r == '\f':
			dst = append(dst, '\\', 'f')
		case r >= 0x20 && r <= 0x7e:
			dst = append(dst, byte(r))
		case r > 0xffff:
			r -= 0x10000
			dst = u4(dst, 0xd800|(r>>10)&0x3ff)
			dst = u4(dst, 0xdc00|r&0x3ff)
		default:
			dst = u4(dst, r)
		}
	}
	return append(dst, '"')
}

func appendInt(dst []byte, v int64) []byte { return strconv.AppendInt(dst, v, 10) }

func validName(s string) bool { return utf8.ValidString(s) }
