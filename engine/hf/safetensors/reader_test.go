package safetensors

import (
	"bytes"
	"encoding/binary"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// rawFile builds a file from a header text (unpadded) and n data bytes.
func rawFile(header string, n int) []byte {
	b := binary.LittleEndian.AppendUint64(nil, uint64(len(header)))
	b = append(b, header...)
	return append(b, make([]byte, n)...)
}

func withLength(n uint64, rest string) []byte {
	return append(binary.LittleEndian.AppendUint64(nil, n), rest...)
}

func TestReadRejectsMalformedFiles(t *testing.T) {
	const ok = `{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}}`
	tests := []struct {
		name string
		file []byte
		want []string // substrings of the error
	}{
		{"too short", []byte{1, 2, 3}, []string{"3 bytes long", "too short"}},
		{"header past end", withLength(1000, `{}`), []string{"header length 1000 runs past the end of the file", "10 bytes"}},
		{"huge header", withLength(MaxHeaderSize+1, `{}`), []string{"header length 100000001 exceeds the 100000000-byte limit"}},
		{"max uint64 header", withLength(^uint64(0), `{}`), []string{"exceeds the 100000000-byte limit"}},
		{"not utf8", rawFile("{\"\xff\":1}", 0), []string{"not valid UTF-8"}},
		{"invalid json", rawFile(`{"a":`, 0), []string{"invalid header JSON at byte"}},
		{"not an object", rawFile(`[1]`, 0), []string{"the header must be a JSON object, found an array"}},
		{"trailing garbage", rawFile(ok+`x`, 8), []string{"unexpected data after the header's JSON object"}},
		{"two objects", rawFile(ok+` {}`, 8), []string{"unexpected data after the header's JSON object"}},
		{"unknown dtype", rawFile(`{"a":{"dtype":"F12","shape":[2],"data_offsets":[0,8]}}`, 8), []string{`tensor "a"`, `unknown dtype "F12"`, "BF16"}},
		{"lower-case dtype", rawFile(`{"a":{"dtype":"f32","shape":[2],"data_offsets":[0,8]}}`, 8), []string{`unknown dtype "f32"`}},
		{"dtype not string", rawFile(`{"a":{"dtype":3,"shape":[2],"data_offsets":[0,8]}}`, 8), []string{"dtype must be a string, found the number 3"}},
		{"missing fields", rawFile(`{"a":{"dtype":"F32"}}`, 0), []string{`tensor "a"`, "lacks shape, data_offsets"}},
		{"entry not object", rawFile(`{"a":[1,2]}`, 0), []string{`tensor "a"`, "entry must be a JSON object, found an array"}},
		{"negative dim", rawFile(`{"a":{"dtype":"F32","shape":[-2],"data_offsets":[0,8]}}`, 8), []string{`tensor "a"`, "shape[0] = -2 is not a non-negative integer"}},
		{"float dim", rawFile(`{"a":{"dtype":"F32","shape":[2.0],"data_offsets":[0,8]}}`, 8), []string{"shape[0] = 2.0 is not a non-negative integer"}},
		{"dim too large", rawFile(`{"a":{"dtype":"F32","shape":[18446744073709551616],"data_offsets":[0,8]}}`, 8), []string{"shape[0] = 18446744073709551616"}},
		{"shape null", rawFile(`{"a":{"dtype":"F32","shape":null,"data_offsets":[0,8]}}`, 8), []string{"shape must be an array of non-negative integers, found null"}},
		{"too many dims", rawFile(`{"a":{"dtype":"F32","shape":[`+strings.Repeat("1,", MaxRank)+`1],"data_offsets":[0,4]}}`, 4), []string{"more than 64 dimensions"}},
		{"one offset", rawFile(`{"a":{"dtype":"F32","shape":[2],"data_offsets":[0]}}`, 8), []string{"data_offsets must hold exactly 2 numbers [begin, end], found 1"}},
		{"three offsets", rawFile(`{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8,9]}}`, 8), []string{"data_offsets must hold exactly 2 numbers, found more"}},
		{"shape product overflow", rawFile(`{"a":{"dtype":"F32","shape":[4294967296,4294967296],"data_offsets":[0,8]}}`, 8), []string{`tensor "a"`, "more than 2^63 elements"}},
		{"byte count overflow", rawFile(`{"a":{"dtype":"F64","shape":[4611686018427387904],"data_offsets":[0,8]}}`, 8), []string{"larger than 2^63 bytes"}},
		{"shape mismatch", rawFile(`{"a":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}}`, 8), []string{`tensor "a"`, "shape [3] of dtype F32 needs 12 bytes but data_offsets [0, 8] hold 8"}},
		{"end before begin", rawFile(`{"a":{"dtype":"F32","shape":[0],"data_offsets":[8,0]}}`, 8), []string{"data_offsets [8, 0] end before they begin"}},
		{"gap at start", rawFile(`{"a":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}}`, 12), []string{`tensor "a"`, "gap of 4 bytes after the start of the data section", "contiguous"}},
		{"gap between", rawFile(`{"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},"b":{"dtype":"F32","shape":[1],"data_offsets":[8,12]}}`, 12), []string{`tensor "b"`, `gap of 4 bytes after tensor "a"`}},
		{"overlap", rawFile(`{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}}`, 12), []string{`tensor "b"`, `overlap tensor "a" at [0, 8]`}},
		{"same offsets", rawFile(`{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}}`, 8), []string{`tensor "b"`, `overlap tensor "a"`}},
		{"past end of file", rawFile(ok, 4), []string{`tensor "a"`, "data_offsets [0, 8] run past the end of the file: its data section holds 4 bytes"}},
		{"trailing bytes", rawFile(ok, 12), []string{"4 bytes follow the last tensor's data"}},
		{"duplicate tensor", rawFile(`{"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},"a":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}}`, 8), []string{`tensor "a"`, "names this tensor twice"}},
		{"duplicate field", rawFile(`{"a":{"dtype":"F32","dtype":"F32","shape":[1],"data_offsets":[0,4]}}`, 4), []string{"field dtype appears twice"}},
		{"duplicate metadata", rawFile(`{"__metadata__":{},"__metadata__":{}}`, 0), []string{"__metadata__ twice"}},
		{"metadata not strings", rawFile(`{"__metadata__":{"format":1}}`, 0), []string{`__metadata__["format"] must be a string, found the number 1`}},
		{"metadata not object", rawFile(`{"__metadata__":"pt"}`, 0), []string{`__metadata__ must be a JSON object of strings, found the string "pt"`}},
		{"metadata duplicate key", rawFile(`{"__metadata__":{"k":"a","k":"b"}}`, 0), []string{`__metadata__ has key "k" twice`}},
		{"F4 odd", rawFile(`{"a":{"dtype":"F4","shape":[3],"data_offsets":[0,1]}}`, 1), []string{"not a whole number of bytes"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f, err := Read("bad.safetensors", tt.file)
			if err == nil {
				t.Fatalf("Read accepted the file: %v", f.Names())
			}
			if !errors.Is(err, ErrInvalid) {
				t.Errorf("error %v does not wrap ErrInvalid", err)
			}
			msg := err.Error()
			if !strings.HasPrefix(msg, "safetensors: bad.safetensors: ") {
				t.Errorf("error %q does not name the file", msg)
			}
			for _, w := range tt.want {
				if !strings.Contains(msg, w) {
					t.Errorf("error %q lacks %q", msg, w)
				}
			}
		})
	}
}

func TestReadAcceptsWhatTheReferenceAccepts(t *testing.T) {
	tests := []struct {
		name  string
		file  []byte
		names []string
	}{
		{"empty header", rawFile(`{}`, 0), nil},
		{"whitespace around", rawFile(" \n{}\t\r\n   ", 0), nil},
		{"metadata null", rawFile(`{"__metadata__":null}`, 0), nil},
		{"unknown fields ignored", rawFile(`{"a":{"extra":{"x":[1,{"y":null}]},"dtype":"U8","shape":[1],"data_offsets":[0,1],"more":true}}`, 1), []string{"a"}},
		{"any key order, any entry order", rawFile(`{"b":{"data_offsets":[1,2],"shape":[],"dtype":"I8"},"a":{"shape":[1],"dtype":"U8","data_offsets":[0,1]}}`, 2), []string{"a", "b"}},
		{"empty tensors share an offset", rawFile(`{"a":{"dtype":"F32","shape":[0],"data_offsets":[0,0]},"b":{"dtype":"F32","shape":[2,0],"data_offsets":[0,0]}}`, 0), []string{"a", "b"}},
		{"packed F4 pair", rawFile(`{"a":{"dtype":"F4","shape":[2],"data_offsets":[0,1]}}`, 1), []string{"a"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f, err := Read("ok.safetensors", tt.file)
			if err != nil {
				t.Fatal(err)
			}
			if got := f.Names(); strings.Join(got, ",") != strings.Join(tt.names, ",") {
				t.Errorf("Names() = %q, want %q", got, tt.names)
			}
		})
	}
}

func TestTensorIsAZeroCopyView(t *testing.T) {
	buf := rawFile(`{"a":{"dtype":"U8","shape":[2],"data_offsets":[0,2]},"b":{"dtype":"U8","shape":[1],"data_offsets":[2,3]}}`, 3)
	f, err := Read("mem", buf)
	if err != nil {
		t.Fatal(err)
	}
	a, _ := f.Tensor("a")
	b, _ := f.Tensor("b")
	buf[len(buf)-3], buf[len(buf)-1] = 9, 7
	if a.Data[0] != 9 || b.Data[0] != 7 {
		t.Errorf("Data does not alias the buffer: a=%v b=%v", a.Data, b.Data)
	}
	if cap(a.Data) != 2 {
		t.Errorf("cap(a.Data) = %d, want 2 so that appends cannot overwrite the next tensor", cap(a.Data))
	}
	a.Shape[0] = 100
	if again, _ := f.Tensor("a"); again.Shape[0] != 2 {
		t.Error("changing a returned Shape changed the file's")
	}
	if _, ok := f.Tensor("missing"); ok {
		t.Error(`Tensor("missing") reported ok`)
	}
}

func TestOpenErrors(t *testing.T) {
	dir := t.TempDir()
	if _, err := Open(filepath.Join(dir, "nope.safetensors")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("Open(missing) = %v, want a not-exist error", err)
	}
	if _, err := Open(dir); err == nil || !strings.Contains(err.Error(), "not a regular file") {
		t.Errorf("Open(dir) = %v", err)
	}
	empty := filepath.Join(dir, "empty.safetensors")
	os.WriteFile(empty, nil, 0o644)
	if _, err := Open(empty); err == nil || !strings.Contains(err.Error(), empty+": file is 0 bytes long") {
		t.Errorf("Open(empty) = %v", err)
	}
	trunc := filepath.Join(dir, "trunc.safetensors")
	good := rawFile(`{"a":{"dtype":"F32","shape":[4],"data_offsets":[0,16]}}`, 16)
	os.WriteFile(trunc, good[:len(good)-5], 0o644)
	_, err := Open(trunc)
	if err == nil || !strings.Contains(err.Error(), trunc+`: tensor "a": data_offsets [0, 16] run past the end of the file`) {
		t.Errorf("Open(truncated) = %v", err)
	}
}

func TestOpenMapsTheFile(t *testing.T) {
	path := filepath.Join(t.TempDir(), "m.safetensors")
	want := bytes.Repeat([]byte{1, 2, 3, 4}, 1000)
	if err := Save(path, []Tensor{{Name: "w", DType: F32, Shape: []int{1000}, Data: want}}, map[string]string{"format": "pt"}); err != nil {
		t.Fatal(err)
	}
	f, err := Open(path)
	if err != nil {
		t.Fatal(err)
	}
	w, _ := f.Tensor("w")
	if !bytes.Equal(w.Data, want) || f.DataSize() != 4000 || f.Len() != 1 || f.Path() != path {
		t.Errorf("Open: data equal=%v DataSize=%d Len=%d Path=%s", bytes.Equal(w.Data, want), f.DataSize(), f.Len(), f.Path())
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	if err := f.Close(); err != nil {
		t.Errorf("second Close: %v", err)
	}
}
