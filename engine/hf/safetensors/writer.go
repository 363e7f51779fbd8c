package safetensors

import (
	"bufio"
	"cmp"
	"encoding/binary"
	"fmt"
	"io"
	"maps"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
)

// Tensor is a tensor to write.
type Tensor struct {
	Name  string
	DType DType
	Shape []int
	// Data holds the little-endian, row-major elements: exactly as many bytes as Shape and
	// DType call for.
	Data []byte
	// Load, used when Data is nil, returns the tensor's bytes when they are about to be
	// written; it lets a large checkpoint be written without holding every tensor in host
	// memory at once. It is called at most once per write.
	Load func() ([]byte, error)
}

// planned is a validated tensor with its place in the file.
type planned struct {
	t          *Tensor
	size       int64
	nelem      int64
	begin, end int64
}

// plan validates tensors and lays them out as the reference writer does: sorted by dtype,
// widest alignment first (the DType order), then by name; offsets contiguous from 0.
func plan(file string, tensors []Tensor) ([]planned, int64, error) {
	out := make([]planned, len(tensors))
	seen := make(map[string]bool, len(tensors))
	for i := range tensors {
		t := &tensors[i]
		if !validName(t.Name) {
			return nil, 0, formatErr(file, t.Name, "tensor name is not valid UTF-8")
		}
		if t.Name == metadataKey {
			return nil, 0, formatErr(file, t.Name, "%s is reserved for the header metadata", metadataKey)
		}
		if seen[t.Name] {
			return nil, 0, formatErr(file, t.Name, "two tensors have this name")
		}
		seen[t.Name] = true
		if !t.DType.Valid() {
			return nil, 0, formatErr(file, t.Name, "invalid dtype %v", t.DType)
		}
		if len(t.Shape) > MaxRank {
			return nil, 0, formatErr(file, t.Name, "shape has %d dimensions, more than %d", len(t.Shape), MaxRank)
		}
		nelem, size, err := byteSize(t.DType, t.Shape)
		if err != nil {
			return nil, 0, formatErr(file, t.Name, "%v", err)
		}
		switch {
		case t.Data != nil && int64(len(t.Data)) != size:
			return nil, 0, formatErr(file, t.Name, "shape %v of dtype %s needs %d bytes, Data holds %d", t.Shape, t.DType, size, len(t.Data))
		case t.Data == nil && t.Load == nil && size != 0:
			return nil, 0, formatErr(file, t.Name, "neither Data nor Load is set")
		}
		out[i] = planned{t: t, size: size, nelem: nelem}
	}
	slices.SortFunc(out, func(a, b planned) int {
		if c := cmp.Compare(b.t.DType, a.t.DType); c != 0 {
			return c
		}
		return strings.Compare(a.t.Name, b.t.Name)
	})
	var off int64
	for i := range out {
		out[i].begin, out[i].end = off, off+out[i].size
		off += out[i].size
	}
	return out, off, nil
}

// encodeHeader returns the 8-byte length and the JSON header, padded with spaces to a multiple
// of 8 bytes, byte for byte as the reference writer produces it: __metadata__ first (its keys
// sorted here; the reference keeps a hash map's order, which is the same for one key), then
// the tensors in file order, each {"dtype","shape","data_offsets"}, compact, no spaces.
func encodeHeader(file string, tensors []planned, metadata map[string]string) ([]byte, error) {
	b := make([]byte, 8, 8+64+96*len(tensors))
	b = append(b, '{')
	first := true
	if metadata != nil {
		b = appendRustJSONString(b, metadataKey)
		b = append(b, ':', '{')
		for i, k := range slices.Sorted(maps.Keys(metadata)) {
			v := metadata[k]
			if !validName(k) || !validName(v) {
				return nil, formatErr(file, "", "metadata entry %q is not valid UTF-8", k)
			}
			if i > 0 {
				b = append(b, ',')
			}
			b = appendRustJSONString(b, k)
			b = append(b, ':')
			b = appendRustJSONString(b, v)
		}
		b = append(b, '}')
		first = false
	}
	for _, p := range tensors {
		if !first {
			b = append(b, ',')
		}
		first = false
		b = appendRustJSONString(b, p.t.Name)
		b = append(b, `:{"dtype":"`...)
		b = append(b, p.t.DType.String()...)
		b = append(b, `","shape":[`...)
		for i, d := range p.t.Shape {
			if i > 0 {
				b = append(b, ',')
			}
			b = appendInt(b, int64(d))
		}
		b = append(b, `],"data_offsets":[`...)
		b = appendInt(b, p.begin)
		b = append(b, ',')
		b = appendInt(b, p.end)
		b = append(b, ']', '}')
	}
	b = append(b, '}')
	for (len(b)-8)%8 != 0 {
		b = append(b, ' ')
	}
	n := len(b) - 8
	if n > MaxHeaderSize {
		return nil, formatErr(file, "", "header would be %d bytes, more than the %d-byte limit readers accept", n, MaxHeaderSize)
	}
	binary.LittleEndian.PutUint64(b, uint64(n))
	return b, nil
}

// Serialize writes tensors as one safetensors file to w, byte-identical to what the Python
// safetensors library writes for the same tensors and metadata (save_file / serialize).
// metadata becomes the header's __metadata__; nil leaves it out (transformers checkpoints use
// {"format": "pt"}). It returns the number of bytes written.
func Serialize(w io.Writer, tensors []Tensor, metadata map[string]string) (int64, error) {
	return serialize("<stream>", w, tensors, metadata)
}

func serialize(file string, w io.Writer, tensors []Tensor, metadata map[string]string) (int64, error) {
	layout, _, err := plan(file, tensors)
	if err != nil {
		return 0, err
	}
	hdr, err := encodeHeader(file, layout, metadata)
	if err != nil {
		return 0, err
	}
	written, err := w.Write(hdr)
	total := int64(written)
	if err != nil {
		return total, fmt.Errorf("safetensors: %s: %w", file, err)
	}
	for _, p := range layout {
		data := p.t.Data
		if data == nil && p.t.Load != nil {
			if data, err = p.t.Load(); err != nil {
				return total, fmt.Errorf("safetensors: %s: tensor %q: loading data: %w", file, p.t.Name, err)
			}
			if int64(len(data)) != p.size {
				return total, formatErr(file, p.t.Name, "Load returned %d bytes, shape %v of dtype %s needs %d", len(data), p.t.Shape, p.t.DType, p.size)
			}
		}
		written, err := w.Write(data)
		total += int64(written)
		if err != nil {
			return total, fmt.Errorf("safetensors: %s: tensor %q: %w", file, p.t.Name, err)
		}
	}
	return total, nil
}

// Save writes tensors to path as one safetensors file (see Serialize). The file is written
// under a temporary name in the same directory, synced, and renamed into place, so path holds
// either its old content or the complete new file.
func Save(path string, tensors []Tensor, metadata map[string]string) error {
	return writeAtomic(path, func(w io.Writer) error {
		_, err := serialize(path, w, tensors, metadata)
		return err
	})
}

func writeAtomic(path string, write func(io.Writer) error) (err error) {
	dir, base := filepath.Split(path)
	if dir == "" {
		dir = "."
	}
	tmp, err := os.CreateTemp(dir, "."+base+".*.tmp")
	if err != nil {
		return fmt.Errorf("safetensors: %w", err)
	}
	defer func() {
		if err != nil {
			tmp.Close()
			os.Remove(tmp.Name())
		}
	}()
	bw := bufio.NewWriterSize(tmp, 1<<20)
	if err = write(bw); err != nil {
		return err
	}
	if err = bw.Flush(); err != nil {
		return fmt.Errorf("safetensors: %s: %w", path, err)
	}
	if err = tmp.Chmod(0o644); err != nil {
		return fmt.Errorf("safetensors: %s: %w", path, err)
	}
	if err = tmp.Sync(); err != nil {
		return fmt.Errorf("safetensors: %s: %w", path, err)
	}
	if err = tmp.Close(); err != nil {
		return fmt.Errorf("safetensors: %s: %w", path, err)
	}
	if err = os.Rename(tmp.Name(), path); err != nil {
		return fmt.Errorf("safetensors: %w", err)
	}
	return nil
}

// DefaultMaxShardSize is the shard size SaveCheckpoint uses when none is given: 5 GB, the
// default of huggingface_hub's split_torch_state_dict_into_shards.
const DefaultMaxShardSize = 5_000_000_000

// CheckpointOptions configures SaveCheckpoint.
type CheckpointOptions struct {
	// MaxShardSize is the most tensor bytes one shard holds (headers are not counted, as in
	// Hugging Face's splitter); 0 means DefaultMaxShardSize. A tensor larger than this gets a
	// shard of its own.
	MaxShardSize int64
	// Metadata is every shard's header metadata; nil means {"format": "pt"}, which
	// transformers requires.
	Metadata map[string]string
}

// SaveCheckpoint writes tensors into dir as transformers' save_pretrained does: one
// model.safetensors when everything fits in one shard, else model-00001-of-0000N.safetensors
// shards and model.safetensors.index.json ({"metadata": {"total_parameters", "total_size"},
// "weight_map"}, as Python's json.dumps(indent=2, sort_keys=True) writes it). Tensors are
// assigned to shards in the order given, starting a new shard when the next tensor would push
// the current one past MaxShardSize (Hugging Face's algorithm); give them in the model's
// state_dict order to get transformers' exact files.
//
// Each file is written atomically; weights files of an earlier save in dir that the new save
// does not replace (other shard counts, a stale index or model.safetensors) are removed
// afterwards. To replace a whole checkpoint atomically, write into a temporary directory and
// rename it. SaveCheckpoint returns the names of the files written.
func SaveCheckpoint(dir string, tensors []Tensor, opts CheckpointOptions) ([]string, error) {
	maxShard := opts.MaxShardSize
	if maxShard <= 0 {
		maxShard = DefaultMaxShardSize
	}
	metadata := opts.Metadata
	if metadata == nil {
		metadata = map[string]string{"format": "pt"}
	}
	// Validate everything before writing anything.
	if _, _, err := plan(dir, tensors); err != nil {
		return nil, err
	}
	if _, err := encodeHeader(dir, nil, metadata); err != nil {
		return nil, err
	}
	var shards [][]Tensor
	var cur []Tensor
	var curSize, totalSize, totalParams int64
	for _, t := range tensors {
		nelem, size, _ := byteSize(t.DType, t.Shape)
		totalSize += size
		totalParams += nelem
		if size > maxShard {
			shards = append(shards, []Tensor{t})
			continue
		}
		if curSize+size > maxShard {
			shards = append(shards, cur)
			cur, curSize = nil, 0
		}
		cur = append(cur, t)
		curSize += size
	}
	if len(cur) > 0 || len(shards) == 0 {
		shards = append(shards, cur)
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("safetensors: %w", err)
	}
	names := make([]string, len(shards))
	weightMap := make(map[string]string, len(tensors))
	for i, shard := range shards {
		names[i] = SingleName
		if len(shards) > 1 {
			names[i] = ShardName(i+1, len(shards))
		}
		if err := Save(filepath.Join(dir, names[i]), shard, metadata); err != nil {
			return nil, err
		}
		for _, t := range shard {
			weightMap[t.Name] = names[i]
		}
	}
	written := slices.Clone(names)
	if len(shards) > 1 {
		idx := encodeIndex(totalParams, totalSize, weightMap)
		if err := writeAtomic(filepath.Join(dir, IndexName), func(w io.Writer) error {
			_, err := w.Write(idx)
			return err
		}); err != nil {
			return nil, err
		}
		written = append(written, IndexName)
	}
	if err := removeStale(dir, written); err != nil {
		return written, err
	}
	return written, nil
}

// ShardName is the file name of shard i (1-based) of n: model-0000i-of-0000n.safetensors.
func ShardName(i, n int) string {
	return fmt.Sprintf("model-%05d-of-%05d.safetensors", i, n)
}

var shardPattern = regexp.MustCompile(`^model-[0-9]{5}-of-[0-9]{5}\.safetensors$`)

// removeStale deletes weights files in dir from an earlier save that keep is not made of.
func removeStale(dir string, keep []string) error {
	ents, err := os.ReadDir(dir)
	if err != nil {
		return fmt.Errorf("safetensors: %w", err)
	}
	for _, e := range ents {
		n := e.Name()
		if e.IsDir() || slices.Contains(keep, n) {
			continue
		}
		if n == SingleName || n == IndexName || shardPattern.MatchString(n) {
			if err := os.Remove(filepath.Join(dir, n)); err != nil {
				return fmt.Errorf("safetensors: removing a stale file from an earlier save: %w", err)
			}
		}
	}
	return nil
}

// encodeIndex renders the index as Python's json.dumps(index, indent=2, sort_keys=True) + "\n".
func encodeIndex(totalParams, totalSize int64, weightMap map[string]string) []byte {
	var b []byte
	b = append(b, "{\n  \"metadata\": {\n    \"total_parameters\": "...)
	b = strconv.AppendInt(b, totalParams, 10)
	b = append(b, ",\n    \"total_size\": "...)
	b = strconv.AppendInt(b, totalSize, 10)
	b = append(b, "\n  },\n  \"weight_map\": {"...)
	for i, name := range slices.Sorted(maps.Keys(weightMap)) {
		if i > 0 {
			b = append(b, ',')
		}
		b = append(b, "\n    "...)
		b = appendPythonJSONString(b, name)
		b = append(b, ": "...)
		b = appendPythonJSONString(b, weightMap[name])
	}
	b = append(b, "\n  }\n}\n"...)
	return b
}
