package nbrun

import (
	"bytes"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
)

// Notebook is an nbformat 4 notebook. Parse keeps every field it does not interpret as it
// was read, so that a notebook written back differs from the one read only in what a run
// changed: the outputs and execution counts of code cells, ids given to cells that had none
// (nbformat 4.5 requires them) and the kernel's language_info in the metadata.
type Notebook struct {
	// Cells in notebook order.
	Cells []*Cell
	// Minor is nbformat_minor.
	Minor int
	// Metadata is the notebook's metadata object.
	Metadata map[string]json.RawMessage
	// rest holds the other top-level fields (nbformat, nbformat_minor, any others).
	rest map[string]json.RawMessage
}

// Cell is one cell of a notebook.
type Cell struct {
	// Type is "code", "markdown" or "raw".
	Type string
	// ID is the cell's id (nbformat 4.5); empty for notebooks older than 4.5 that have none.
	ID string
	// Source is the cell's text.
	Source string
	// Outputs and ExecutionCount are what the last run of this cell produced; they replace
	// the cell's outputs and execution_count when the notebook is written, once the run has
	// reset the cell (every code cell of a notebook given to Run).
	Outputs        []*Output
	ExecutionCount *int
	// Timing holds, once the cell has run, when the kernel's messages about it were sent
	// (their header dates), under nbclient's names: iopub.status.busy, iopub.execute_input,
	// shell.execute_reply, iopub.status.idle. It is written as the metadata's "execution".
	Timing map[string]string
	// Tags are the cell's metadata tags: "skip-execution" skips the cell and
	// "raises-exception" lets it fail without stopping the run, as with nbclient.
	Tags []string
	// fields are the cell's JSON fields as read.
	fields map[string]json.RawMessage
	// reset says that Outputs and ExecutionCount replace the fields read.
	reset bool
}

// Output is one output of a code cell, in nbformat 4's terms.
type Output struct {
	// Type is the output_type: "stream", "display_data", "execute_result" or "error".
	Type string
	// Name and Text are a stream's name ("stdout" or "stderr") and text.
	Name, Text string
	// Data and Metadata are a display_data's or execute_result's MIME bundle (each value
	// as the kernel sent it: a string, or JSON for JSON types) and its metadata.
	Data     map[string]json.RawMessage
	Metadata json.RawMessage
	// ExecutionCount is an execute_result's count.
	ExecutionCount int
	// Ename, Evalue and Traceback describe an error.
	Ename, Evalue string
	Traceback     []string
	// displayID is the display this output shows (transient, never written), for
	// update_display_data.
	displayID string
}

// Errors of Parse. Each is wrapped with what was found and what to do.
var (
	ErrNotJSON     = errors.New("nbrun: not a notebook: not JSON")
	ErrNotNotebook = errors.New("nbrun: not an nbformat 4 notebook")
)

// Parse reads an nbformat 4 notebook. Anything that is not JSON, not an nbformat 4 notebook
// (nbformat missing or not 4, no cells list), or a cell that nbformat would refuse (an
// unknown cell_type, a source that is neither a string nor a list of strings, a repeated
// id) is an error saying what is wrong; ids missing from an nbformat 4.5 notebook are made
// up, as nbformat's validator does.
func Parse(b []byte) (*Notebook, error) {
	var top map[string]json.RawMessage
	if err := json.Unmarshal(b, &top); err != nil {
		var se *json.SyntaxError
		if errors.As(err, &se) {
			return nil, fmt.Errorf("%w: %v at byte %d", ErrNotJSON, se, se.Offset)
		}
		var te *json.UnmarshalTypeError
		if errors.As(err, &te) {
			return nil, fmt.Errorf("%w: the file is a JSON %s, not an object with cells, metadata and nbformat", ErrNotNotebook, te.Value)
		}
		return nil, fmt.Errorf("%w: %v", ErrNotJSON, err)
	}
	if top == nil {
		return nil, fmt.Errorf("%w: the file is JSON null", ErrNotNotebook)
	}
	rawFormat, ok := top["nbformat"]
	if !ok {
		return nil, fmt.Errorf("%w: no \"nbformat\" key (a notebook has \"nbformat\": 4)", ErrNotNotebook)
	}
	var major int
	if err := json.Unmarshal(rawFormat, &major); err != nil {
		return nil, fmt.Errorf("%w: \"nbformat\" is %s, want the number 4", ErrNotNotebook, clip(rawFormat))
	}
	if major != 4 {
		return nil, fmt.Errorf("%w: nbformat %d; only version 4 is read (convert it with `jupyter nbconvert --to notebook --nbformat 4`)", ErrNotNotebook, major)
	}
	nb := &Notebook{rest: top}
	if raw, ok := top["nbformat_minor"]; ok {
		if err := json.Unmarshal(raw, &nb.Minor); err != nil || nb.Minor < 0 {
			return nil, fmt.Errorf("%w: \"nbformat_minor\" is %s, want a number >= 0", ErrNotNotebook, clip(raw))
		}
	} else {
		return nil, fmt.Errorf("%w: no \"nbformat_minor\" key", ErrNotNotebook)
	}
	nb.Metadata = map[string]json.RawMessage{}
	if raw, ok := top["metadata"]; ok {
		if err := json.Unmarshal(raw, &nb.Metadata); err != nil || nb.Metadata == nil {
			return nil, fmt.Errorf("%w: \"metadata\" is %s, want an object", ErrNotNotebook, clip(raw))
		}
	}
	rawCells, ok := top["cells"]
	if !ok {
		return nil, fmt.Errorf("%w: no \"cells\" list", ErrNotNotebook)
	}
	var cells []json.RawMessage
	if err := json.Unmarshal(rawCells, &cells); err != nil || cells == nil {
		return nil, fmt.Errorf("%w: \"cells\" is %s, want a list of cells", ErrNotNotebook, clip(rawCells))
	}
	delete(top, "cells")
	delete(top, "metadata")
	ids := map[string]int{}
	for i, raw := range cells {
		c, err := parseCell(raw)
		if err != nil {
			return nil, fmt.Errorf("%w: cell %d: %v", ErrNotNotebook, i+1, err)
		}
		if c.ID == "" && nb.Minor >= 5 {
			c.ID = newCellID(ids)
		}
		if c.ID != "" {
			if j, dup := ids[c.ID]; dup {
				return nil, fmt.Errorf("%w: cell %d: id %q is cell %d's too; ids must be unique", ErrNotNotebook, i+1, c.ID, j)
			}
			ids[c.ID] = i + 1
		}
		nb.Cells = append(nb.Cells, c)
	}
	return nb, nil
}

func parseCell(raw json.RawMessage) (*Cell, error) {
	c := &Cell{}
	if err := json.Unmarshal(raw, &c.fields); err != nil || c.fields == nil {
		return nil, fmt.Errorf("%s is not an object", clip(raw))
	}
	rt, ok := c.fields["cell_type"]
	if !ok {
		return nil, errors.New("no \"cell_type\"")
	}
	if err := json.Unmarshal(rt, &c.Type); err != nil {
		return nil, fmt.Errorf("\"cell_type\" is %s, want a string", clip(rt))
	}
	switch c.Type {
	case "code", "markdown", "raw":
	default:
		return nil, fmt.Errorf("\"cell_type\" %q; want code, markdown or raw", c.Type)
	}
	if rid, ok := c.fields["id"]; ok {
		if err := json.Unmarshal(rid, &c.ID); err != nil || c.ID == "" {
			return nil, fmt.Errorf("\"id\" is %s, want a non-empty string", clip(rid))
		}
	}
	rs, ok := c.fields["source"]
	if !ok {
		return nil, errors.New("no \"source\"")
	}
	src, err := multiline(rs)
	if err != nil {
		return nil, fmt.Errorf("\"source\": %v", err)
	}
	c.Source = src
	if rm, ok := c.fields["metadata"]; ok {
		var m map[string]json.RawMessage
		if err := json.Unmarshal(rm, &m); err != nil || m == nil {
			return nil, fmt.Errorf("\"metadata\" is %s, want an object", clip(rm))
		}
		if rt, ok := m["tags"]; ok {
			if err := json.Unmarshal(rt, &c.Tags); err != nil {
				return nil, fmt.Errorf("metadata \"tags\" is %s, want a list of strings", clip(rt))
			}
		}
	}
	return c, nil
}

// multiline decodes nbformat's multiline string: a string or a list of strings.
func multiline(raw json.RawMessage) (string, error) {
	var s string
	if err := json.Unmarshal(raw, &s); err == nil {
		return s, nil
	}
	var parts []string
	if err := json.Unmarshal(raw, &parts); err != nil {
		return "", fmt.Errorf("%s is neither a string nor a list of strings", clip(raw))
	}
	return strings.Join(parts, ""), nil
}

// newCellID makes an id no cell of ids has: 8 hex digits, as nbformat makes them.
func newCellID(ids map[string]int) string {
	for {
		var b [4]byte
		_, _ = rand.Read(b[:])
		id := hex.EncodeToString(b[:])
		if _, taken := ids[id]; !taken {
			return id
		}
	}
}

// clip shortens a JSON value for an error message.
func clip(raw json.RawMessage) string {
	s := string(bytes.TrimSpace(raw))
	if len(s) > 40 {
		s = s[:40] + "..."
	}
	return s
}

// Marshal writes the notebook as nbformat writes it: JSON with sorted keys and one-space
// indentation, multiline text as lists of lines, a final newline.
func (nb *Notebook) Marshal() ([]byte, error) {
	top := make(map[string]any, len(nb.rest)+2)
	for k, v := range nb.rest {
		top[k] = v
	}
	top["metadata"] = nb.Metadata
	cells := make([]any, len(nb.Cells))
	for i, c := range nb.Cells {
		cells[i] = c.object()
	}
	top["cells"] = cells
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	enc.SetIndent("", " ")
	if err := enc.Encode(top); err != nil {
		return nil, fmt.Errorf("nbrun: encoding the notebook: %w", err)
	}
	return buf.Bytes(), nil
}

// object is the cell as nbformat writes it.
func (c *Cell) object() map[string]any {
	m := make(map[string]any, len(c.fields)+3)
	for k, v := range c.fields {
		m[k] = v
	}
	if c.ID != "" {
		m["id"] = c.ID
	}
	meta := map[string]json.RawMessage{}
	if rm, ok := c.fields["metadata"]; ok {
		_ = json.Unmarshal(rm, &meta) // an object: Parse checked it
	}
	if c.reset {
		// This run's timings replace an earlier run's.
		delete(meta, "execution")
		if c.Timing != nil {
			t, _ := json.Marshal(c.Timing)
			meta["execution"] = t
		}
	}
	m["metadata"] = meta
	m["source"] = lines(c.Source)
	if c.Type == "code" {
		if c.reset {
			outs := make([]any, len(c.Outputs))
			for i, o := range c.Outputs {
				outs[i] = o.object()
			}
			m["outputs"] = outs
			m["execution_count"] = c.ExecutionCount
		}
		if _, ok := m["outputs"]; !ok {
			m["outputs"] = []any{}
		}
		if _, ok := m["execution_count"]; !ok {
			m["execution_count"] = nil
		}
	}
	return m
}

// object is the output as nbformat writes it.
func (o *Output) object() map[string]any {
	m := map[string]any{"output_type": o.Type}
	switch o.Type {
	case "stream":
		m["name"] = o.Name
		m["text"] = lines(o.Text)
	case "display_data", "execute_result":
		data := make(map[string]any, len(o.Data))
		for mime, v := range o.Data {
			data[mime] = splitMime(mime, v)
		}
		m["data"] = data
		meta := o.Metadata
		if len(bytes.TrimSpace(meta)) == 0 || meta[0] != '{' {
			meta = json.RawMessage("{}")
		}
		m["metadata"] = meta
		if o.Type == "execute_result" {
			m["execution_count"] = o.ExecutionCount
		}
	case "error":
		m["ename"] = o.Ename
		m["evalue"] = o.Evalue
		tb := o.Traceback
		if tb == nil {
			tb = []string{}
		}
		m["traceback"] = tb
	}
	return m
}

// splitMime writes text MIME types (text/*, SVG, JavaScript) given as strings as lists of
// lines, as nbformat does; other values (base64 images, JSON) are kept as they are.
func splitMime(mime string, v json.RawMessage) any {
	if !strings.HasPrefix(mime, "text/") && mime != "image/svg+xml" && mime != "application/javascript" {
		return v
	}
	var s string
	if err := json.Unmarshal(v, &s); err != nil {
		return v
	}
	return lines(s)
}

// lines splits s after each newline, keeping the newlines (Python's splitlines(True) for
// text with "\n" line ends).
func lines(s string) []string {
	out := []string{}
	for s != "" {
		i := strings.IndexByte(s, '\n')
		if i < 0 {
			out = append(out, s)
			break
		}
		out = append(out, s[:i+1])
		s = s[i+1:]
	}
	return out
}

// Runnable is the number of cells a run executes: code cells with a source that is not blank.
func (nb *Notebook) Runnable() int {
	n := 0
	for _, c := range nb.Cells {
		if c.runnable() {
			n++
		}
	}
	return n
}

func (c *Cell) runnable() bool {
	return c.Type == "code" && strings.TrimSpace(c.Source) != "" && !c.tagged("skip-execution")
}

func (c *Cell) tagged(tag string) bool {
	for _, t := range c.Tags {
		if t == tag {
			return true
		}
	}
	return false
}

// CellOutputs returns the outputs of code cell c: this run's once a run has reset it, else
// those read from the notebook (an output that is not an object is an error).
func (c *Cell) CellOutputs() ([]*Output, error) {
	if c.reset || c.Type != "code" {
		return c.Outputs, nil
	}
	raw, ok := c.fields["outputs"]
	if !ok {
		return nil, nil
	}
	var list []json.RawMessage
	if err := json.Unmarshal(raw, &list); err != nil {
		return nil, fmt.Errorf("nbrun: \"outputs\" is %s, want a list", clip(raw))
	}
	var outs []*Output
	for i, r := range list {
		var o struct {
			Type           string                     `json:"output_type"`
			Name           string                     `json:"name"`
			Text           json.RawMessage            `json:"text"`
			Data           map[string]json.RawMessage `json:"data"`
			Metadata       json.RawMessage            `json:"metadata"`
			ExecutionCount int                        `json:"execution_count"`
			Ename          string                     `json:"ename"`
			Evalue         string                     `json:"evalue"`
			Traceback      []string                   `json:"traceback"`
		}
		if err := json.Unmarshal(r, &o); err != nil {
			return nil, fmt.Errorf("nbrun: output %d: %s is not an nbformat output: %v", i+1, clip(r), err)
		}
		out := &Output{Type: o.Type, Name: o.Name, Data: map[string]json.RawMessage{}, Metadata: o.Metadata,
			ExecutionCount: o.ExecutionCount, Ename: o.Ename, Evalue: o.Evalue, Traceback: o.Traceback}
		if len(o.Text) > 0 {
			var err error
			if out.Text, err = multiline(o.Text); err != nil {
				return nil, fmt.Errorf("nbrun: output %d: \"text\": %v", i+1, err)
			}
		}
		// Multiline MIME values are joined back into one string, as the kernel sent them.
		for mime, v := range o.Data {
			if s, err := multiline(v); err == nil {
				v, _ = json.Marshal(s)
			}
			out.Data[mime] = v
		}
		outs = append(outs, out)
	}
	return outs, nil
}

// PlainText is the output as text: a stream's text, a result's or display's text/plain,
// an error's "ENAME: EVALUE".
func (o *Output) PlainText() string {
	switch o.Type {
	case "stream":
		return o.Text
	case "error":
		return o.Ename + ": " + o.Evalue
	}
	var s string
	if v, ok := o.Data["text/plain"]; ok && json.Unmarshal(v, &s) == nil {
		return s
	}
	return ""
}

// KernelName is the name of the notebook's kernelspec (metadata.kernelspec.name), or "".
func (nb *Notebook) KernelName() string {
	var ks struct {
		Name string `json:"name"`
	}
	if raw, ok := nb.Metadata["kernelspec"]; ok {
		_ = json.Unmarshal(raw, &ks)
	}
	return ks.Name
}
