package kernel

import (
	"context"
	"encoding/json"
	"fmt"
	"runtime"
	"runtime/debug"
	"strings"
	"unicode/utf8"

	"github.com/halo-shell/halo-shell/kernel/internal/wire"
)

// handler answers one request type.
type handler struct {
	reply string // the reply's msg_type
	fn    func(m *wire.Message) result
}

// result is what a handler returns: the reply content (nil: no reply), an action to run after
// the reply is sent, and whether queued executions are to be aborted.
type result struct {
	content any
	after   func()
	abort   bool
}

// handlerTable builds the dispatch table from the list of request types.
func (k *Kernel) handlerTable() map[string]handler {
	list := []struct {
		request string
		fn      func(m *wire.Message) result
	}{
		{"kernel_info_request", k.kernelInfo},
		{"execute_request", k.execute},
		{"complete_request", k.complete},
		{"inspect_request", k.inspect},
		{"is_complete_request", k.isComplete},
		{"history_request", k.historyRequest},
		{"comm_info_request", k.commInfo},
		{"shutdown_request", k.shutdownRequest},
		{"interrupt_request", k.interrupt},
	}
	t := make(map[string]handler, len(list))
	for _, e := range list {
		t[e.request] = handler{reply: strings.TrimSuffix(e.request, "_request") + "_reply", fn: e.fn}
	}
	return t
}

// decode unmarshals a request's content; a failure becomes an error reply naming the field.
func decode(m *wire.Message, v any) error {
	if err := json.Unmarshal(m.Content, v); err != nil {
		return fmt.Errorf("%s: content: %v", m.Header.MsgType, err)
	}
	return nil
}

func ok(content map[string]any) result {
	content["status"] = "ok"
	return result{content: content}
}

func (k *Kernel) kernelInfo(*wire.Message) result {
	return ok(map[string]any{
		"protocol_version":       wire.ProtocolVersion,
		"implementation":         "halo-shell",
		"implementation_version": k.cfg.Version,
		"language_info": map[string]any{
			"name":               "go",
			"version":            strings.TrimPrefix(runtime.Version(), "go"),
			"mimetype":           "text/x-go",
			"file_extension":     ".go",
			"codemirror_mode":    "go",
			"pygments_lexer":     "go",
			"nbconvert_exporter": "script",
		},
		"banner":   k.cfg.Banner,
		"debugger": false,
		"help_links": []map[string]string{
			{"text": "halo-shell magics: %help", "url": "https://github.com/halo-shell/halo-shell"},
		},
	})
}

type executeRequest struct {
	Code            string         `json:"code"`
	Silent          bool           `json:"silent"`
	StoreHistory    *bool          `json:"store_history"`
	UserExpressions map[string]any `json:"user_expressions"`
	AllowStdin      bool           `json:"allow_stdin"`
	StopOnError     *bool          `json:"stop_on_error"`
}

func (k *Kernel) execute(m *wire.Message) result {
	var req executeRequest
	if err := decode(m, &req); err != nil {
		c := errorReply(err)
		c["execution_count"] = k.execCount
		return result{content: c}
	}
	store := req.StoreHistory == nil || *req.StoreHistory
	stopOnError := req.StopOnError == nil || *req.StopOnError
	if req.Silent {
		store = false
	}
	if store {
		k.execCount++
		k.history = append(k.history, historyEntry{line: k.execCount, input: req.Code})
	}
	count := k.execCount
	if !req.Silent {
		k.publish(m, "execute_input", map[string]any{"code": req.Code, "execution_count": count})
	}
	send := func(msgType string, content any) { k.publish(m, msgType, content) }
	if req.Silent {
		send = nil
	}
	out := newOutput(send)
	ctx, cancel := context.WithCancel(context.Background())
	k.runMu.Lock()
	k.cancelRun = cancel
	k.runMu.Unlock()
	res, err := k.runCell(ctx, req.Code, out)
	k.runMu.Lock()
	k.cancelRun = nil
	k.runMu.Unlock()
	interrupted := ctx.Err() != nil
	cancel()
	out.close()
	if err == nil && interrupted {
		err = context.Canceled
	}
	if err != nil {
		ename, evalue, tb := errorContent(err)
		if !req.Silent {
			k.publish(m, "error", map[string]any{"ename": ename, "evalue": evalue, "traceback": tb})
		}
		if store {
			k.history[len(k.history)-1].output = ename + ": " + evalue
		}
		return result{content: map[string]any{"status": "error", "execution_count": count,
			"ename": ename, "evalue": evalue, "traceback": tb}, abort: stopOnError}
	}
	if res != nil && !req.Silent {
		k.publish(m, "execute_result", map[string]any{"execution_count": count, "data": mimeData(res), "metadata": map[string]any{}})
	}
	if store && res != nil {
		if t, ok := res["text/plain"]; ok {
			k.history[len(k.history)-1].output = string(t)
		}
	}
	return ok(map[string]any{"execution_count": count, "payload": []any{}, "user_expressions": map[string]any{}})
}

// runCell calls the interpreter, turning a panic into an error with its stack.
func (k *Kernel) runCell(ctx context.Context, code string, out *Output) (b Bundle, err error) {
	defer func() {
		if p := recover(); p != nil {
			k.log.Error("kernel: interpreter panicked", "panic", p)
			err = &Error{Name: "panic", Value: fmt.Sprint(p),
				Traceback: append([]string{fmt.Sprintf("panic: %v", p)}, strings.Split(string(debug.Stack()), "\n")...)}
		}
	}()
	return k.cfg.Interp.Execute(ctx, code, out)
}

type cursorRequest struct {
	Code        string `json:"code"`
	CursorPos   *int   `json:"cursor_pos"`
	DetailLevel int    `json:"detail_level"`
}

// cursor converts the request's cursor (in Unicode code points, as the protocol says since 5.2)
// into a byte offset in code; a missing cursor means the end of the code.
func (r *cursorRequest) cursor() int {
	if r.CursorPos == nil {
		return len(r.Code)
	}
	n := *r.CursorPos
	if n <= 0 {
		return 0
	}
	i := 0
	for b := range r.Code {
		if i == n {
			return b
		}
		i++
	}
	return len(r.Code)
}

// runeOffset converts a byte offset in s to code points.
func runeOffset(s string, b int) int {
	if b > len(s) {
		b = len(s)
	}
	if b < 0 {
		b = 0
	}
	return utf8.RuneCountInString(s[:b])
}

func (k *Kernel) complete(m *wire.Message) result {
	var req cursorRequest
	if err := decode(m, &req); err != nil {
		return result{content: errorReply(err)}
	}
	cur := req.cursor()
	matches, start, end := []string{}, cur, cur
	if c, ok := k.cfg.Interp.(Completer); ok {
		var ms []string
		ms, start, end = c.Complete(req.Code, cur)
		if ms != nil {
			matches = ms
		}
	}
	return ok(map[string]any{"matches": matches, "cursor_start": runeOffset(req.Code, start),
		"cursor_end": runeOffset(req.Code, end), "metadata": map[string]any{}})
}

func (k *Kernel) inspect(m *wire.Message) result {
	var req cursorRequest
	if err := decode(m, &req); err != nil {
		return result{content: errorReply(err)}
	}
	data, found := Bundle(nil), false
	if in, ok := k.cfg.Interp.(Inspector); ok {
		data, found = in.Inspect(req.Code, req.cursor(), req.DetailLevel)
	}
	d := map[string]any{}
	if found {
		d = mimeData(data)
	}
	return ok(map[string]any{"found": found, "data": d, "metadata": map[string]any{}})
}

func (k *Kernel) isComplete(m *wire.Message) result {
	var req struct {
		Code string `json:"code"`
	}
	if err := decode(m, &req); err != nil {
		return result{content: errorReply(err)}
	}
	status, indent := "", ""
	if c, ok := k.cfg.Interp.(CompletenessChecker); ok {
		status, indent = c.IsComplete(req.Code)
	} else {
		status, indent = IsCompleteGo(req.Code)
	}
	c := map[string]any{"status": status}
	if status == "incomplete" {
		c["indent"] = indent
	}
	return result{content: c}
}

func (k *Kernel) commInfo(*wire.Message) result {
	return ok(map[string]any{"comms": map[string]any{}})
}

func (k *Kernel) shutdownRequest(m *wire.Message) result {
	var req struct {
		Restart bool `json:"restart"`
	}
	if err := decode(m, &req); err != nil {
		return result{content: errorReply(err)}
	}
	k.log.Info("kernel: shutdown requested", "restart", req.Restart)
	return result{content: map[string]any{"status": "ok", "restart": req.Restart}, after: func() {
		k.interruptRun()
		if s, ok := k.cfg.Interp.(ShutdownHook); ok {
			s.Shutdown(req.Restart)
		}
		k.requestShutdown()
	}}
}

func (k *Kernel) interrupt(*wire.Message) result {
	if k.interruptRun() {
		k.log.Info("kernel: interrupted the running cell")
	}
	return ok(map[string]any{})
}
