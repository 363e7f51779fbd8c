package safetensors

import (
	"bytes"
	"os"
	"path/filepath"
	"slices"
	"testing"
)

func headerSeeds(f *testing.F) {
	for _, s := range []string{
		`{}`,
		`{"__metadata__":{"format":"pt"},"a":{"dtype":"F32","shape":[2,2],"data_offsets":[0,16]}}`,
		`{"a":{"dtype":"BF16","shape":[],"data_offsets":[0,2]},"b":{"dtype":"F8_E4M3","shape":[0],"data_offsets":[2,2]}}`,
		`{"a":{"dtype":"F4","shape":[2],"data_offsets":[0,1]},"x":{"unknown":[{"y":null}],"dtype":"U8","shape":[1],"data_offsets":[1,2]}}`,
		`{"a":{"dtype":"F32","shape":[4294967296,4294967296],"data_offsets":[0,8]}}`,
		`{"a":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}}`,
		`{"a":{"dtype":"F32","shape":[-1],"data_offsets":[0,0]}}`,
		`{"__metadata__":null}  `,
		`{"a":`,
	} {
		f.Add([]byte(s))
	}
}

// FuzzParseHeader checks that any header text either fails with a FormatError or yields
// tensors that tile their data section and survive a write and a read unchanged.
func FuzzParseHeader(f *testing.F) {
	headerSeeds(f)
	f.Fuzz(func(t *testing.T, text []byte) {
		h, err := parseHeader("fuzz", text)
		if err != nil {
			if _, ok := err.(*FormatError); !ok {
				t.Fatalf("error of type %T: %v", err, err)
			}
			return
		}
		var cursor int64
		tensors := make([]Tensor, 0, len(h.entries))
		for _, e := range h.entries {
			if e.begin != cursor || e.end < e.begin {
				t.Fatalf("entries do not tile: %q at [%d, %d] after %d", e.name, e.begin, e.end, cursor)
			}
			cursor = e.end
			tensors = append(tensors, Tensor{Name: e.name, DType: e.dtype, Shape: e.shape, Data: make([]byte, e.end-e.begin)})
		}
		if cursor != h.dataLen {
			t.Fatalf("dataLen %d, entries end at %d", h.dataLen, cursor)
		}
		if h.dataLen > 1<<20 {
			return // valid but too big to write in a fuzz iteration
		}
		var buf bytes.Buffer
		if _, err := Serialize(&buf, tensors, h.metadata); err != nil {
			t.Fatalf("re-serializing a valid header: %v", err)
		}
		back, err := Read("again", buf.Bytes())
		if err != nil {
			t.Fatalf("reading back a re-serialized header: %v", err)
		}
		for _, x := range tensors {
			got, ok := back.Tensor(x.Name)
			if !ok || got.DType != x.DType || !slices.Equal(got.Shape, x.Shape) || len(got.Data) != len(x.Data) {
				t.Fatalf("tensor %q changed in a round trip", x.Name)
			}
		}
	})
}

// FuzzRead checks that any file either fails with a FormatError or gives tensors whose data
// views have the size their dtype and shape call for and that convert without panicking.
func FuzzRead(f *testing.F) {
	golden, _ := filepath.Glob("testdata/golden/*.safetensors")
	for _, p := range golden {
		if b, err := os.ReadFile(p); err == nil {
			f.Add(b)
		}
	}
	f.Add(rawFile(`{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}}`, 8))
	f.Add(withLength(1<<40, `{}`))
	f.Add([]byte{1})
	f.Fuzz(func(t *testing.T, file []byte) {
		r, err := Read("fuzz", file)
		if err != nil {
			if _, ok := err.(*FormatError); !ok {
				t.Fatalf("error of type %T: %v", err, err)
			}
			return
		}
		for _, name := range r.Names() {
			ti, _ := r.Tensor(name)
			_, size, err := byteSize(ti.DType, ti.Shape)
			if err != nil || int64(len(ti.Data)) != size {
				t.Fatalf("tensor %q: %d bytes for %v %v (%v)", name, len(ti.Data), ti.DType, ti.Shape, err)
			}
			if checkDecodable(ti.DType) == nil && ti.NumElements() <= 1<<16 {
				if _, err := ToFloat32(ti); err != nil {
					t.Fatalf("tensor %q: %v", name, err)
				}
			}
		}
	})
}

// FuzzOpenCheckpointIndex checks that any index file either fails with an error or gives a
// checkpoint whose every name resolves to a tensor, with the shards confined to its directory.
func FuzzOpenCheckpointIndex(f *testing.F) {
	f.Add([]byte(`{"metadata":{"total_size":1},"weight_map":{"a":"s.safetensors"}}`))
	f.Add([]byte(`{"weight_map":{"a":"s.safetensors","b":"s.safetensors"}}`))
	f.Add([]byte(`{"weight_map":{"a":"../s.safetensors"}}`))
	f.Add([]byte(`{"weight_map":{}}`))
	f.Add([]byte(`{"weight_map":null}`))
	dir := f.TempDir()
	if err := Save(filepath.Join(dir, "s.safetensors"), []Tensor{{Name: "a", DType: U8, Shape: []int{1}, Data: []byte{1}}}, nil); err != nil {
		f.Fatal(err)
	}
	f.Fuzz(func(t *testing.T, index []byte) {
		p := filepath.Join(dir, IndexName)
		if err := os.WriteFile(p, index, 0o644); err != nil {
			t.Fatal(err)
		}
		c, err := OpenCheckpoint(dir)
		if err != nil {
			return
		}
		defer c.Close()
		for _, name := range c.Names() {
			ti, ok := c.Tensor(name)
			if !ok || filepath.Dir(ti.File) != dir {
				t.Fatalf("tensor %q: ok=%v file=%s", name, ok, ti.File)
			}
		}
	})
}
