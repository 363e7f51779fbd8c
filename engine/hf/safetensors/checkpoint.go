package safetensors

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
)

// IndexName is the file name of a sharded checkpoint's index, as transformers writes it.
const IndexName = "model.safetensors.index.json"

// SingleName is the file name of an unsharded checkpoint's weights, as transformers writes it.
const SingleName = "model.safetensors"

// Source is a set of named tensors: a File or a Checkpoint.
type Source interface {
	Names() []string // sorted
	Tensor(name string) (TensorInfo, bool)
	Close() error
}

var (
	_ Source = (*File)(nil)
	_ Source = (*Checkpoint)(nil)
)

// Checkpoint presents the safetensors files of a Hugging Face checkpoint as one set of tensors.
// It is safe for concurrent use until Close.
type Checkpoint struct {
	dir       string
	indexPath string         // empty when the checkpoint has no index
	indexMeta map[string]any // the index's "metadata" object
	files     []*File
	where     map[string]*File
	names     []string
}

// OpenCheckpoint opens the checkpoint at path, which may be
//
//   - a directory with model.safetensors.index.json (or exactly one other
//     *.safetensors.index.json): the shards its weight_map names;
//   - a directory with model.safetensors, or with other *.safetensors files, all of which are
//     opened (a tensor name found in two files is an error);
//   - an index file or a single .safetensors file.
//
// Every file is memory mapped; Close releases them all.
func OpenCheckpoint(path string) (*Checkpoint, error) {
	st, err := os.Stat(path)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, fmt.Errorf("safetensors: %s does not exist (give a checkpoint directory or a .safetensors file): %w", path, fs.ErrNotExist)
	}
	if err != nil {
		return nil, fmt.Errorf("safetensors: %w", err)
	}
	if !st.IsDir() {
		if strings.HasSuffix(path, ".json") {
			return openIndexed(path)
		}
		return openFiles(filepath.Dir(path), []string{path})
	}
	if p := filepath.Join(path, IndexName); fileExists(p) {
		return openIndexed(p)
	}
	if p := filepath.Join(path, SingleName); fileExists(p) {
		return openFiles(path, []string{p})
	}
	indexes, err := filepath.Glob(filepath.Join(globEscape(path), "*.safetensors.index.json"))
	if err != nil {
		return nil, fmt.Errorf("safetensors: %s: %w", path, err)
	}
	if len(indexes) == 1 {
		return openIndexed(indexes[0])
	}
	if len(indexes) > 1 {
		return nil, formatErr(path, "", "the directory holds %d index files (%s); open one of them", len(indexes), strings.Join(baseNames(indexes), ", "))
	}
	files, err := filepath.Glob(filepath.Join(globEscape(path), "*.safetensors"))
	if err != nil {
		return nil, fmt.Errorf("safetensors: %s: %w", path, err)
	}
	if len(files) == 0 {
		return nil, formatErr(path, "", "no .safetensors files and no %s in this directory", IndexName)
	}
	return openFiles(path, files)
}

func fileExists(p string) bool {
	st, err := os.Stat(p)
	return err == nil && !st.IsDir()
}

func globEscape(p string) string {
	r := strings.NewReplacer(`*`, `\*`, `?`, `\?`, `[`, `\[`, `\`, `\\`)
	if filepath.Separator == '\\' {
		r = strings.NewReplacer(`*`, `[*]`, `?`, `[?]`, `[`, `[[]`)
	}
	return r.Replace(p)
}

func baseNames(paths []string) []string {
	out := make([]string, len(paths))
	for i, p := range paths {
		out[i] = filepath.Base(p)
	}
	return out
}

// openFiles opens every file and merges their tensors.
func openFiles(dir string, paths []string) (*Checkpoint, error) {
	slices.Sort(paths)
	c := &Checkpoint{dir: dir, where: make(map[string]*File)}
	for _, p := range paths {
		f, err := Open(p)
		if err != nil {
			c.Close()
			return nil, err
		}
		c.files = append(c.files, f)
		for _, name := range f.names {
			if other, dup := c.where[name]; dup {
				c.Close()
				return nil, formatErr(p, name, "the tensor is also in %s; a checkpoint must hold each tensor once", other.path)
			}
			c.where[name] = f
		}
	}
	c.collectNames()
	return c, nil
}

// maxIndexSize bounds how much of an index file is read.
const maxIndexSize = MaxHeaderSize

type indexFile struct {
	Metadata  map[string]any    `json:"metadata"`
	WeightMap map[string]string `json:"weight_map"`
}

func openIndexed(indexPath string) (*Checkpoint, error) {
	raw, err := readLimited(indexPath, maxIndexSize)
	if err != nil {
		return nil, err
	}
	var idx indexFile
	if err := json.Unmarshal(raw, &idx); err != nil {
		return nil, formatErr(indexPath, "", "invalid index JSON: %v", err)
	}
	if idx.WeightMap == nil {
		return nil, formatErr(indexPath, "", "index has no weight_map object")
	}
	dir := filepath.Dir(indexPath)
	byFile := make(map[string][]string)
	for tensor, file := range idx.WeightMap {
		if !filepath.IsLocal(file) || strings.ContainsAny(file, `/\`) {
			return nil, formatErr(indexPath, tensor, "weight_map names file %q, which is not a plain file name in the index's directory", file)
		}
		byFile[file] = append(byFile[file], tensor)
	}
	shardNames := make([]string, 0, len(byFile))
	for f := range byFile {
		shardNames = append(shardNames, f)
	}
	slices.Sort(shardNames)
	c := &Checkpoint{dir: dir, indexPath: indexPath, indexMeta: idx.Metadata, where: make(map[string]*File)}
	for _, name := range shardNames {
		f, err := Open(filepath.Join(dir, name))
		if err != nil {
			c.Close()
			if errors.Is(err, fs.ErrNotExist) {
				return nil, formatErr(indexPath, "", "weight_map names shard %s, which does not exist: %v", name, err)
			}
			return nil, err
		}
		c.files = append(c.files, f)
		tensors := byFile[name]
		slices.Sort(tensors)
		for _, t := range tensors {
			if _, ok := f.entries[t]; !ok {
				c.Close()
				return nil, formatErr(indexPath, t, "weight_map puts this tensor in %s, which does not contain it", name)
			}
			c.where[t] = f
		}
	}
	c.collectNames()
	return c, nil
}

func readLimited(path string, limit int64) ([]byte, error) {
	fd, err := openRegular(path)
	if err != nil {
		return nil, err
	}
	defer fd.Close()
	raw, err := io.ReadAll(io.LimitReader(fd, limit+1))
	if err != nil {
		return nil, fmt.Errorf("safetensors: %s: %w", path, err)
	}
	if int64(len(raw)) > limit {
		return nil, formatErr(path, "", "index file is larger than %d bytes", limit)
	}
	return raw, nil
}

func (c *Checkpoint) collectNames() {
	c.names = make([]string, 0, len(c.where))
	for n := range c.where {
		c.names = append(c.names, n)
	}
	slices.Sort(c.names)
}

// Dir is the checkpoint's directory.
func (c *Checkpoint) Dir() string { return c.dir }

// IndexPath is the path of the index file, or "" for an unindexed checkpoint.
func (c *Checkpoint) IndexPath() string { return c.indexPath }

// IndexMetadata is the index's "metadata" object (total_size, total_parameters, ...); nil for
// an unindexed checkpoint.
func (c *Checkpoint) IndexMetadata() map[string]any { return c.indexMeta }

// Files returns the checkpoint's open files, sorted by path.
func (c *Checkpoint) Files() []*File { return slices.Clone(c.files) }

// Names returns the names of all tensors, sorted.
func (c *Checkpoint) Names() []string { return slices.Clone(c.names) }

// Len is the number of tensors.
func (c *Checkpoint) Len() int { return len(c.names) }

// Tensor returns the named tensor; ok is false if the checkpoint has no such tensor.
func (c *Checkpoint) Tensor(name string) (TensorInfo, bool) {
	f, ok := c.where[name]
	if !ok {
		return TensorInfo{}, false
	}
	return f.Tensor(name)
}

// Close releases every file; Data slices from the checkpoint must not be used afterwards.
func (c *Checkpoint) Close() error {
	var errs []error
	for _, f := range c.files {
		errs = append(errs, f.Close())
	}
	c.files = nil
	c.where = nil
	return errors.Join(errs...)
}
