package safetensors

import (
	"bytes"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

func u8(name string, n int) Tensor {
	data := make([]byte, n)
	for i := range data {
		data[i] = byte(len(name) + i)
	}
	return Tensor{Name: name, DType: U8, Shape: []int{n}, Data: data}
}

func TestSaveCheckpointShards(t *testing.T) {
	// Hugging Face's rule, in the order given: a tensor bigger than the limit gets a shard of
	// its own; otherwise a new shard starts when the tensor would push the current one past it.
	tensors := []Tensor{u8("embed", 6), u8("a", 3), u8("b", 4), u8("huge", 20), u8("c", 10), u8("d", 0)}
	dir := t.TempDir()
	files, err := SaveCheckpoint(dir, tensors, CheckpointOptions{MaxShardSize: 10})
	if err != nil {
		t.Fatal(err)
	}
	wantFiles := []string{"model-00001-of-00004.safetensors", "model-00002-of-00004.safetensors",
		"model-00003-of-00004.safetensors", "model-00004-of-00004.safetensors", IndexName}
	if !slices.Equal(files, wantFiles) {
		t.Fatalf("files = %q, want %q", files, wantFiles)
	}
	// shard 1: embed+a (9); b would make 13 > 10 -> shard 2: b; huge alone -> appended as its own
	// shard right away (shard 3) while b's shard stays open; c (4+10 > 10) closes b's shard;
	// so the order is [embed a] [huge] [b] [c d].
	wantShards := map[string][]string{
		"model-00001-of-00004.safetensors": {"a", "embed"},
		"model-00002-of-00004.safetensors": {"huge"},
		"model-00003-of-00004.safetensors": {"b"},
		"model-00004-of-00004.safetensors": {"c", "d"},
	}
	for name, want := range wantShards {
		f, err := Open(filepath.Join(dir, name))
		if err != nil {
			t.Fatal(err)
		}
		if !slices.Equal(f.Names(), want) {
			t.Errorf("%s holds %q, want %q", name, f.Names(), want)
		}
		if md := f.Metadata(); md["format"] != "pt" || len(md) != 1 {
			t.Errorf("%s metadata = %v, want {format: pt}", name, md)
		}
		f.Close()
	}
	wantIndex := `{
  "metadata": {
    "total_parameters": 43,
    "total_size": 43
  },
  "weight_map": {
    "a": "model-00001-of-00004.safetensors",
    "b": "model-00003-of-00004.safetensors",
    "c": "model-00004-of-00004.safetensors",
    "d": "model-00004-of-00004.safetensors",
    "embed": "model-00001-of-00004.safetensors",
    "huge": "model-00002-of-00004.safetensors"
  }
}
`
	idx, err := os.ReadFile(filepath.Join(dir, IndexName))
	if err != nil {
		t.Fatal(err)
	}
	if string(idx) != wantIndex {
		t.Errorf("index:\n%s\nwant:\n%s", idx, wantIndex)
	}

	c, err := OpenCheckpoint(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if want := []string{"a", "b", "c", "d", "embed", "huge"}; !slices.Equal(c.Names(), want) || c.Len() != 6 {
		t.Errorf("Names() = %q, want %q", c.Names(), want)
	}
	for _, x := range tensors {
		got, ok := c.Tensor(x.Name)
		if !ok || !bytes.Equal(got.Data, x.Data) || filepath.Base(got.File) != filepath.Base(idxFile(t, idx, x.Name)) {
			t.Errorf("tensor %q: ok=%v data=%v file=%s", x.Name, ok, got.Data, got.File)
		}
	}
	if c.IndexPath() != filepath.Join(dir, IndexName) || c.IndexMetadata()["total_size"] != float64(43) || len(c.Files()) != 4 || c.Dir() != dir {
		t.Errorf("IndexPath=%q IndexMetadata=%v Files=%d", c.IndexPath(), c.IndexMetadata(), len(c.Files()))
	}
}

// idxFile finds the shard the index text assigns to a tensor.
func idxFile(t *testing.T, idx []byte, name string) string {
	for _, line := range strings.Split(string(idx), "\n") {
		if k, v, ok := strings.Cut(strings.TrimSpace(line), ": "); ok && k == `"`+name+`"` {
			return strings.Trim(v, `",`)
		}
	}
	t.Fatalf("index has no %q", name)
	return ""
}

func TestSaveCheckpointSingleAndStale(t *testing.T) {
	dir := t.TempDir()
	tensors := []Tensor{u8("a", 3), u8("b", 4)}
	if _, err := SaveCheckpoint(dir, tensors, CheckpointOptions{MaxShardSize: 4}); err != nil {
		t.Fatal(err)
	}
	other := filepath.Join(dir, "config.json")
	os.WriteFile(other, []byte("{}"), 0o644)
	files, err := SaveCheckpoint(dir, tensors, CheckpointOptions{Metadata: map[string]string{"format": "pt", "k": "v"}})
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(files, []string{SingleName}) {
		t.Fatalf("files = %q, want [%s]", files, SingleName)
	}
	ents, _ := os.ReadDir(dir)
	var names []string
	for _, e := range ents {
		names = append(names, e.Name())
	}
	if want := []string{"config.json", SingleName}; !slices.Equal(names, want) {
		t.Errorf("directory holds %q, want %q (stale shards and index removed, others kept)", names, want)
	}
	c, err := OpenCheckpoint(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if c.IndexPath() != "" || c.Len() != 2 {
		t.Errorf("single-file checkpoint: IndexPath=%q Len=%d", c.IndexPath(), c.Len())
	}
	if md := c.Files()[0].Metadata(); md["k"] != "v" {
		t.Errorf("metadata = %v", md)
	}
}

func TestSaveCheckpointValidatesFirst(t *testing.T) {
	dir := t.TempDir()
	_, err := SaveCheckpoint(dir, []Tensor{u8("a", 3), {Name: "a", DType: U8, Shape: []int{1}, Data: []byte{1}}}, CheckpointOptions{MaxShardSize: 1})
	if err == nil || !strings.Contains(err.Error(), "two tensors have this name") {
		t.Fatalf("err = %v", err)
	}
	if ents, _ := os.ReadDir(dir); len(ents) != 0 {
		t.Errorf("a refused save wrote %d files", len(ents))
	}
}

func TestOpenCheckpointLayouts(t *testing.T) {
	t.Run("loose files", func(t *testing.T) {
		dir := t.TempDir()
		Save(filepath.Join(dir, "one.safetensors"), []Tensor{u8("x", 1)}, nil)
		Save(filepath.Join(dir, "two.safetensors"), []Tensor{u8("y", 2)}, nil)
		c, err := OpenCheckpoint(dir)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		if !slices.Equal(c.Names(), []string{"x", "y"}) {
			t.Errorf("Names() = %q", c.Names())
		}
	})
	t.Run("file path", func(t *testing.T) {
		p := filepath.Join(t.TempDir(), "w.safetensors")
		Save(p, []Tensor{u8("x", 1)}, nil)
		c, err := OpenCheckpoint(p)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		if !slices.Equal(c.Names(), []string{"x"}) {
			t.Errorf("Names() = %q", c.Names())
		}
	})
	t.Run("index path and other index name", func(t *testing.T) {
		dir := t.TempDir()
		SaveCheckpoint(dir, []Tensor{u8("a", 3), u8("b", 4)}, CheckpointOptions{MaxShardSize: 4})
		other := filepath.Join(dir, "diffusion.safetensors.index.json")
		os.Rename(filepath.Join(dir, IndexName), other)
		for _, p := range []string{dir, other} {
			c, err := OpenCheckpoint(p)
			if err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(c.Names(), []string{"a", "b"}) {
				t.Errorf("OpenCheckpoint(%s).Names() = %q", p, c.Names())
			}
			c.Close()
		}
	})
}

func TestOpenCheckpointErrors(t *testing.T) {
	shard := func(t *testing.T, dir, name string, tensors ...Tensor) {
		if err := Save(filepath.Join(dir, name), tensors, nil); err != nil {
			t.Fatal(err)
		}
	}
	index := func(t *testing.T, dir, text string) {
		if err := os.WriteFile(filepath.Join(dir, IndexName), []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	tests := []struct {
		name  string
		setup func(t *testing.T, dir string)
		want  []string
	}{
		{"empty dir", func(t *testing.T, dir string) {}, []string{"no .safetensors files"}},
		{"bad index json", func(t *testing.T, dir string) { index(t, dir, `{"weight_map": [`) }, []string{IndexName, "invalid index JSON"}},
		{"no weight_map", func(t *testing.T, dir string) { index(t, dir, `{"metadata": {}}`) }, []string{"no weight_map"}},
		{"missing shard", func(t *testing.T, dir string) { index(t, dir, `{"weight_map": {"a": "gone.safetensors"}}`) }, []string{`weight_map names shard gone.safetensors, which does not exist`}},
		{"path traversal", func(t *testing.T, dir string) { index(t, dir, `{"weight_map": {"a": "../x.safetensors"}}`) }, []string{`tensor "a"`, `"../x.safetensors"`, "not a plain file name"}},
		{"absolute path", func(t *testing.T, dir string) { index(t, dir, `{"weight_map": {"a": "/etc/passwd"}}`) }, []string{"not a plain file name"}},
		{"tensor not in shard", func(t *testing.T, dir string) {
			shard(t, dir, "s1.safetensors", u8("a", 1))
			index(t, dir, `{"weight_map": {"a": "s1.safetensors", "b": "s1.safetensors"}}`)
		}, []string{`tensor "b"`, "weight_map puts this tensor in s1.safetensors, which does not contain it"}},
		{"bad shard", func(t *testing.T, dir string) {
			os.WriteFile(filepath.Join(dir, "s1.safetensors"), []byte("12345678{}"), 0o644)
			index(t, dir, `{"weight_map": {"a": "s1.safetensors"}}`)
		}, []string{"s1.safetensors", "header length"}},
		{"duplicate across files", func(t *testing.T, dir string) {
			shard(t, dir, "one.safetensors", u8("a", 1))
			shard(t, dir, "two.safetensors", u8("a", 1))
		}, []string{"two.safetensors", `tensor "a"`, "also in", "one.safetensors"}},
		{"two indexes", func(t *testing.T, dir string) {
			os.WriteFile(filepath.Join(dir, "a.safetensors.index.json"), []byte("{}"), 0o644)
			os.WriteFile(filepath.Join(dir, "b.safetensors.index.json"), []byte("{}"), 0o644)
		}, []string{"2 index files"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dir := t.TempDir()
			tt.setup(t, dir)
			c, err := OpenCheckpoint(dir)
			if err == nil {
				c.Close()
				t.Fatal("OpenCheckpoint succeeded")
			}
			for _, w := range tt.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q lacks %q", err, w)
				}
			}
		})
	}
	if _, err := OpenCheckpoint(filepath.Join(t.TempDir(), "nope")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("OpenCheckpoint(missing) = %v", err)
	}
}

// TestSaveCheckpointMatchesTransformers re-saves the checkpoint that transformers' save_pretrained
// wrote (testdata/reference/sharded, made by scripts/gpu/safetensors_golden.py) with the same
// tensors in the same state_dict order and shard size, and requires identical weights files.
func TestSaveCheckpointMatchesTransformers(t *testing.T) {
	ref := filepath.Join("testdata", "reference", "sharded")
	orderRaw, err := os.ReadFile(filepath.Join(ref, "order.json"))
	if errors.Is(err, os.ErrNotExist) {
		t.Skip("testdata/reference/sharded is absent: run scripts/gpu/safetensors_golden.py on the GPU machine and commit its output")
	}
	if err != nil {
		t.Fatal(err)
	}
	var order struct {
		MaxShardSize int64    `json:"max_shard_size"`
		Order        []string `json:"state_dict_order"`
	}
	if err := json.Unmarshal(orderRaw, &order); err != nil {
		t.Fatal(err)
	}
	c, err := OpenCheckpoint(ref)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	var tensors []Tensor
	for _, name := range order.Order {
		ti, ok := c.Tensor(name)
		if !ok {
			t.Fatalf("transformers' checkpoint lacks state_dict entry %q", name)
		}
		tensors = append(tensors, Tensor{Name: name, DType: ti.DType, Shape: ti.Shape, Data: ti.Data})
	}
	out := t.TempDir()
	files, err := SaveCheckpoint(out, tensors, CheckpointOptions{MaxShardSize: order.MaxShardSize})
	if err != nil {
		t.Fatal(err)
	}
	refFiles, _ := filepath.Glob(filepath.Join(ref, "*.safetensors"))
	if fileExists(filepath.Join(ref, IndexName)) {
		refFiles = append(refFiles, filepath.Join(ref, IndexName))
	}
	if len(files) != len(refFiles) {
		t.Errorf("wrote %q, transformers wrote %q", files, baseNames(refFiles))
	}
	for _, rf := range refFiles {
		want, _ := os.ReadFile(rf)
		got, err := os.ReadFile(filepath.Join(out, filepath.Base(rf)))
		if err != nil {
			t.Errorf("transformers wrote %s, we did not: %v", filepath.Base(rf), err)
			continue
		}
		if !bytes.Equal(got, want) {
			t.Errorf("%s differs from transformers' (%d vs %d bytes)", filepath.Base(rf), len(got), len(want))
		}
	}
}
