// Package inspect summarises a Hugging Face checkpoint: its config.json (model type and the
// sizes that matter), and every tensor's name, dtype and shape, with parameter and byte totals.
// It backs `halo-shell run inspect`.
//
// It reads headers only: tensor data is memory mapped by engine/hf/safetensors and never
// touched. It does not check that the tensors match the config; loading a model does that.
package inspect

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"

	"github.com/halo-shell/halo-shell/engine/hf/config"
	"github.com/halo-shell/halo-shell/engine/hf/safetensors"
)

// Report is what Inspect finds. Its JSON form is the `--json` output of the command.
type Report struct {
	// Path is the inspected path as given.
	Path string `json:"path"`
	// Index is the checkpoint's index file name, empty when it has none.
	Index string `json:"index,omitempty"`
	// Files are the safetensors files, sorted by name.
	Files []File `json:"files"`
	// Config summarises config.json; nil when the checkpoint has none.
	Config *Config `json:"config,omitempty"`
	// Tensors are all tensors, in natural name order (layers.2 before layers.10).
	Tensors []Tensor `json:"tensors"`
	// Parameters is the total number of elements of all tensors.
	Parameters int64 `json:"parameters"`
	// Bytes is the total size of all tensors' data.
	Bytes int64 `json:"bytes"`
	// DTypes totals parameters and bytes per dtype, in decreasing byte order.
	DTypes []DTypeTotal `json:"dtypes"`
}

// File is one safetensors file of the checkpoint.
type File struct {
	Name     string            `json:"name"` // base name
	Tensors  int               `json:"tensors"`
	Bytes    int64             `json:"bytes"` // file size: header and data
	Metadata map[string]string `json:"metadata,omitempty"`
}

// Tensor is one tensor's header entry.
type Tensor struct {
	Name       string `json:"name"`
	DType      string `json:"dtype"`
	Shape      []int  `json:"shape"`
	Parameters int64  `json:"parameters"`
	Bytes      int64  `json:"bytes"`
	File       string `json:"file"` // base name of the file holding it
}

// DTypeTotal totals the tensors of one dtype.
type DTypeTotal struct {
	DType      string `json:"dtype"`
	Tensors    int    `json:"tensors"`
	Parameters int64  `json:"parameters"`
	Bytes      int64  `json:"bytes"`
}

// Config is the part of config.json worth a glance. Sizes are element counts.
type Config struct {
	ModelType         string   `json:"model_type"`
	Architectures     []string `json:"architectures,omitempty"`
	DType             string   `json:"dtype,omitempty"`
	Vocab             int      `json:"vocab_size,omitempty"`
	Hidden            int      `json:"hidden_size,omitempty"`
	Intermediate      int      `json:"intermediate_size,omitempty"`
	Layers            int      `json:"num_hidden_layers,omitempty"`
	Heads             int      `json:"num_attention_heads,omitempty"`
	KVHeads           int      `json:"num_key_value_heads,omitempty"`
	HeadDim           int      `json:"head_dim,omitempty"`
	MaxPositions      int      `json:"max_position_embeddings,omitempty"`
	TieWordEmbeddings bool     `json:"tie_word_embeddings"`
	RopeType          string   `json:"rope_type,omitempty"`
	RopeTheta         float64  `json:"rope_theta,omitempty"`
	Experts           int      `json:"num_experts,omitempty"`
	ExpertsPerToken   int      `json:"num_experts_per_tok,omitempty"`
	ExpertWidth       int      `json:"expert_intermediate_size,omitempty"`
	// Typed is true when engine/hf/config understood the file (with Hugging Face's defaults
	// for absent keys); false when only the keys present were read, in which case Note says why.
	Typed bool   `json:"typed"`
	Note  string `json:"note,omitempty"`
}

// Inspect reads the checkpoint at path: a .safetensors file, an index file, or a directory
// (sharded or not). config.json is looked for in the same directory.
func Inspect(path string) (*Report, error) {
	ckpt, err := safetensors.OpenCheckpoint(path)
	if err != nil {
		return nil, err
	}
	defer ckpt.Close()
	r := &Report{Path: path}
	if ip := ckpt.IndexPath(); ip != "" {
		r.Index = filepath.Base(ip)
	}
	for _, f := range ckpt.Files() {
		r.Files = append(r.Files, File{
			Name:     filepath.Base(f.Path()),
			Tensors:  f.Len(),
			Bytes:    f.HeaderSize() + f.DataSize(),
			Metadata: f.Metadata(),
		})
	}
	totals := map[string]*DTypeTotal{}
	for _, name := range ckpt.Names() {
		t, _ := ckpt.Tensor(name)
		row := Tensor{
			Name: name, DType: t.DType.String(), Shape: t.Shape,
			Parameters: t.NumElements(), Bytes: int64(len(t.Data)), File: filepath.Base(t.File),
		}
		r.Tensors = append(r.Tensors, row)
		r.Parameters += row.Parameters
		r.Bytes += row.Bytes
		dt := totals[row.DType]
		if dt == nil {
			dt = &DTypeTotal{DType: row.DType}
			totals[row.DType] = dt
		}
		dt.Tensors++
		dt.Parameters += row.Parameters
		dt.Bytes += row.Bytes
	}
	slices.SortStableFunc(r.Tensors, func(a, b Tensor) int { return naturalCompare(a.Name, b.Name) })
	for _, dt := range totals {
		r.DTypes = append(r.DTypes, *dt)
	}
	slices.SortFunc(r.DTypes, func(a, b DTypeTotal) int {
		if a.Bytes != b.Bytes {
			return int(sign(b.Bytes - a.Bytes))
		}
		return strings.Compare(a.DType, b.DType)
	})
	cfgPath := filepath.Join(ckpt.Dir(), config.FileName)
	if r.Config, err = readConfig(cfgPath); err != nil {
		return nil, err
	}
	return r, nil
}

func sign(x int64) int64 {
	switch {
	case x < 0:
		return -1
	case x > 0:
		return 1
	}
	return 0
}

// readConfig summarises config.json with the typed reader when it understands the file, and
// from the raw keys otherwise (other model families, or files the typed reader rejects).
func readConfig(path string) (*Config, error) {
	if _, err := os.Stat(path); errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	c, typedErr := config.Load(path)
	if typedErr == nil {
		d := c.Shape()
		return &Config{
			ModelType: c.ModelType, Architectures: c.Architectures, DType: c.DType,
			Vocab: d.Vocab, Hidden: d.Hidden, Intermediate: d.Intermediate, Layers: d.Layers,
			Heads: d.Heads, KVHeads: d.KVHeads, HeadDim: d.HeadDim, MaxPositions: c.MaxPositionEmbeddings,
			TieWordEmbeddings: c.TieWordEmbeddings, RopeType: c.Rope.Type, RopeTheta: c.Rope.Theta,
			Experts: d.Experts, ExpertsPerToken: d.TopK, ExpertWidth: d.ExpertIntermediate,
			Typed: true,
		}, nil
	}
	if st, err := os.Stat(path); err == nil && !st.Mode().IsRegular() {
		return nil, fmt.Errorf("inspect: %w", typedErr)
	}
	raw, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("inspect: %w", err)
	}
	var m map[string]any
	if err := json.Unmarshal(raw, &m); err != nil {
		return nil, fmt.Errorf("inspect: %s: invalid JSON: %v", path, err)
	}
	out := &Config{Note: typedErr.Error()}
	str := func(keys ...string) string {
		for _, k := range keys {
			if s, ok := m[k].(string); ok {
				return s
			}
		}
		return ""
	}
	num := func(keys ...string) int {
		for _, k := range keys {
			if f, ok := m[k].(float64); ok && f == float64(int(f)) {
				return int(f)
			}
		}
		return 0
	}
	out.ModelType = str("model_type")
	if a, ok := m["architectures"].([]any); ok {
		for _, x := range a {
			if s, ok := x.(string); ok {
				out.Architectures = append(out.Architectures, s)
			}
		}
	}
	out.DType = str("dtype", "torch_dtype")
	out.Vocab = num("vocab_size")
	out.Hidden = num("hidden_size", "n_embd", "d_model")
	out.Intermediate = num("intermediate_size", "n_inner", "ffn_dim")
	out.Layers = num("num_hidden_layers", "n_layer", "num_layers")
	out.Heads = num("num_attention_heads", "n_head")
	out.KVHeads = num("num_key_value_heads")
	out.HeadDim = num("head_dim")
	out.MaxPositions = num("max_position_embeddings", "n_positions")
	out.TieWordEmbeddings, _ = m["tie_word_embeddings"].(bool)
	out.Experts = num("num_local_experts", "num_experts", "n_routed_experts")
	out.ExpertsPerToken = num("num_experts_per_tok")
	out.ExpertWidth = num("moe_intermediate_size")
	if f, ok := m["rope_theta"].(float64); ok {
		out.RopeTheta = f
	}
	if rp, ok := m["rope_parameters"].(map[string]any); ok {
		if f, ok := rp["rope_theta"].(float64); ok {
			out.RopeTheta = f
		}
		out.RopeType, _ = rp["rope_type"].(string)
	}
	return out, nil
}

// naturalCompare orders strings with runs of digits compared as numbers, so that
// "model.layers.2.x" sorts before "model.layers.10.x".
func naturalCompare(a, b string) int {
	for a != "" && b != "" {
		da, db := digitRun(a), digitRun(b)
		if da > 0 && db > 0 {
			na, nb := strings.TrimLeft(a[:da], "0"), strings.TrimLeft(b[:db], "0")
			if len(na) != len(nb) {
				return len(na) - len(nb)
			}
			if c := strings.Compare(na, nb); c != 0 {
				return c
			}
			if da != db { // equal values, fewer leading zeros first
				return da - db
			}
			a, b = a[da:], b[db:]
			continue
		}
		if a[0] != b[0] {
			return int(a[0]) - int(b[0])
		}
		a, b = a[1:], b[1:]
	}
	return len(a) - len(b)
}

func digitRun(s string) int {
	i := 0
	for i < len(s) && s[i] >= '0' && s[i] <= '9' {
		i++
	}
	return i
}

// WriteJSON writes the report as indented JSON.
func (r *Report) WriteJSON(w io.Writer) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(r)
}

// WriteText writes the report for a terminal: the checkpoint's files, the config summary, a
// table of tensors and the totals.
func (r *Report) WriteText(w io.Writer) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	files := fmt.Sprintf("%d file", len(r.Files))
	if len(r.Files) != 1 {
		files += "s"
	}
	if r.Index != "" {
		files += ", index " + r.Index
	}
	fmt.Fprintf(tw, "checkpoint\t%s (%s)\n", r.Path, files)
	if c := r.Config; c != nil {
		head := c.ModelType
		if head == "" {
			head = "(no model_type)"
		}
		if len(c.Architectures) > 0 {
			head += " (" + strings.Join(c.Architectures, ", ") + ")"
		}
		if c.DType != "" {
			head += ", dtype " + c.DType
		}
		fmt.Fprintf(tw, "config\t%s\n", head)
		var lines [][]string
		lines = append(lines, fields(
			"hidden", c.Hidden, "intermediate", c.Intermediate, "layers", c.Layers,
			"heads", c.Heads, "kv heads", c.KVHeads, "head dim", c.HeadDim))
		l2 := fields("vocab", c.Vocab, "max positions", c.MaxPositions)
		if c.TieWordEmbeddings {
			l2 = append(l2, "tied embeddings")
		}
		if c.RopeType != "" || c.RopeTheta != 0 {
			rope := "rope"
			if c.RopeType != "" {
				rope += " " + c.RopeType
			}
			if c.RopeTheta != 0 {
				rope += " theta " + strconv.FormatFloat(c.RopeTheta, 'f', -1, 64)
			}
			l2 = append(l2, rope)
		}
		lines = append(lines, l2)
		lines = append(lines, fields("experts", c.Experts, "top-k", c.ExpertsPerToken, "expert intermediate", c.ExpertWidth))
		for _, l := range lines {
			if len(l) > 0 {
				fmt.Fprintf(tw, "\t%s\n", strings.Join(l, ", "))
			}
		}
		if !c.Typed {
			fmt.Fprintf(tw, "\t(read as plain JSON: %s)\n", c.Note)
		}
	}
	fmt.Fprintln(tw)
	multi := len(r.Files) > 1
	if multi {
		fmt.Fprintln(tw, "NAME\tDTYPE\tSHAPE\tPARAMS\tFILE")
	} else {
		fmt.Fprintln(tw, "NAME\tDTYPE\tSHAPE\tPARAMS")
	}
	for _, t := range r.Tensors {
		dims := make([]string, len(t.Shape))
		for i, d := range t.Shape {
			dims[i] = strconv.Itoa(d)
		}
		fmt.Fprintf(tw, "%s\t%s\t[%s]\t%s", t.Name, t.DType, strings.Join(dims, ", "), strconv.FormatInt(t.Parameters, 10))
		if multi {
			fmt.Fprintf(tw, "\t%s", t.File)
		}
		fmt.Fprintln(tw)
	}
	fmt.Fprintln(tw)
	fmt.Fprintf(tw, "tensors\t%d\n", len(r.Tensors))
	fmt.Fprintf(tw, "parameters\t%s (%s)\n", groupDigits(r.Parameters), humanCount(r.Parameters))
	fmt.Fprintf(tw, "bytes\t%s (%s)\n", groupDigits(r.Bytes), humanBytes(r.Bytes))
	for _, d := range r.DTypes {
		fmt.Fprintf(tw, "  %s\t%s, %s parameters, %s\n", d.DType, plural(d.Tensors, "tensor"), groupDigits(d.Parameters), humanBytes(d.Bytes))
	}
	return tw.Flush()
}

// fields formats name/value pairs, leaving out zero values.
func fields(kv ...any) []string {
	var out []string
	for i := 0; i+1 < len(kv); i += 2 {
		if v := kv[i+1].(int); v != 0 {
			out = append(out, fmt.Sprintf("%s %d", kv[i], v))
		}
	}
	return out
}

func groupDigits(n int64) string {
	s := strconv.FormatInt(n, 10)
	neg := strings.HasPrefix(s, "-")
	s = strings.TrimPrefix(s, "-")
	var b strings.Builder
	for i, c := range s {
		if i > 0 && (len(s)-i)%3 == 0 {
			b.WriteByte(',')
		}
		b.WriteRune(c)
	}
	if neg {
		return "-" + b.String()
	}
	return b.String()
}

func humanCount(n int64) string {
	switch {
	case n >= 1e9:
		return strconv.FormatFloat(float64(n)/1e9, 'f', 2, 64) + "B"
	case n >= 1e6:
		return strconv.FormatFloat(float64(n)/1e6, 'f', 2, 64) + "M"
	case n >= 1e3:
		return strconv.FormatFloat(float64(n)/1e3, 'f', 2, 64) + "K"
	}
	return strconv.FormatInt(n, 10)
}

func humanBytes(n int64) string {
	const unit = 1024
	if n < unit {
		return strconv.FormatInt(n, 10) + " B"
	}
	v, suffix := float64(n), []string{"KiB", "MiB", "GiB", "TiB", "PiB", "EiB"}
	i := -1
	for v >= unit && i < len(suffix)-1 {
		v /= unit
		i++
	}
	return strconv.FormatFloat(v, 'f', 2, 64) + " " + suffix[i]
}

func plural(n int, word string) string {
	if n == 1 {
		return "1 " + word
	}
	return strconv.Itoa(n) + " " + word + "s"
}
