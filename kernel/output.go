package kernel

import (
	"encoding/base64"
	"encoding/json"
	"io"
	"slices"
	"strings"
	"sync"
	"unicode/utf8"
)

// Output is where a running cell sends what the notebook shows: stream text, displays, updates
// of earlier displays and clear_output. Its methods may be called from any goroutine while the
// cell runs; after Execute returns they do nothing.
type Output struct {
	mu     sync.Mutex
	send   func(msgType string, content any) // nil once the cell has finished, or when silent
	stdout io.Writer
	stderr io.Writer
}

func newOutput(send func(msgType string, content any)) *Output {
	o := &Output{send: send}
	o.stdout = streamWriter{o, "stdout"}
	o.stderr = streamWriter{o, "stderr"}
	return o
}

// close stops further output (a goroutine the cell left behind cannot write into the next cell).
func (o *Output) close() {
	o.mu.Lock()
	o.send = nil
	o.mu.Unlock()
}

func (o *Output) publish(msgType string, content any) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.send != nil {
		o.send(msgType, content)
	}
}

// Stdout is a writer whose writes become stdout stream messages.
func (o *Output) Stdout() io.Writer { return o.stdout }

// Stderr is a writer whose writes become stderr stream messages.
func (o *Output) Stderr() io.Writer { return o.stderr }

type streamWriter struct {
	o    *Output
	name string
}

func (w streamWriter) Write(p []byte) (int, error) {
	if len(p) > 0 {
		w.o.publish("stream", map[string]any{"name": w.name, "text": string(p)})
	}
	return len(p), nil
}

// Display shows b as a display_data output. A non-empty displayID lets later UpdateDisplay
// calls replace it in place.
func (o *Output) Display(b Bundle, displayID string) {
	o.publish("display_data", displayContent(b, displayID))
}

// UpdateDisplay replaces the output shown earlier with displayID (update_display_data).
func (o *Output) UpdateDisplay(b Bundle, displayID string) {
	o.publish("update_display_data", displayContent(b, displayID))
}

// Clear clears the cell's output; with wait, only when the next output arrives.
func (o *Output) Clear(wait bool) {
	o.publish("clear_output", map[string]any{"wait": wait})
}

func displayContent(b Bundle, displayID string) map[string]any {
	c := map[string]any{"data": mimeData(b), "metadata": map[string]any{}}
	if displayID != "" {
		c["transient"] = map[string]any{"display_id": displayID}
	} else {
		c["transient"] = map[string]any{}
	}
	return c
}

// mimeData encodes a bundle as the "data" of a display message: text types as strings, binary
// types base64, JSON types as JSON values; text/plain is always present.
func mimeData(b Bundle) map[string]any {
	d := make(map[string]any, len(b)+1)
	for mime, v := range b {
		switch {
		case isJSONMime(mime) && json.Valid(v):
			d[mime] = json.RawMessage(v)
		case isTextMime(mime) && utf8.Valid(v):
			d[mime] = string(v)
		default:
			d[mime] = base64.StdEncoding.EncodeToString(v)
		}
	}
	if _, ok := d["text/plain"]; !ok {
		var kinds []string
		for mime := range b {
			kinds = append(kinds, mime)
		}
		slices.Sort(kinds)
		d["text/plain"] = "<" + strings.Join(kinds, ", ") + ">"
	}
	return d
}

func isJSONMime(m string) bool {
	return m == "application/json" || strings.HasSuffix(m, "+json")
}

func isTextMime(m string) bool {
	return strings.HasPrefix(m, "text/") || strings.HasSuffix(m, "+xml") || m == "application/javascript"
}
