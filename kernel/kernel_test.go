package kernel

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/go-zeromq/zmq4"

	"github.com/halo-shell/halo-shell/kernel/internal/wire"
)

// lineInterp is a small interpreter for tests: each cell is one command.
type lineInterp struct {
	started chan struct{}
	before  func() // runs at the start of "failslow"
}

func (li *lineInterp) Execute(ctx context.Context, code string, out *Output) (Bundle, error) {
	cmd, arg, _ := strings.Cut(strings.TrimSpace(code), " ")
	switch cmd {
	case "print":
		fmt.Fprint(out.Stdout(), arg)
	case "eprint":
		fmt.Fprint(out.Stderr(), arg)
	case "result":
		return Bundle{"text/plain": []byte(arg)}, nil
	case "display":
		out.Display(Bundle{"image/png": []byte{0x89, 'P', 'N', 'G'}}, "d1")
		out.UpdateDisplay(Bundle{"text/plain": []byte("updated")}, "d1")
	case "fail":
		return nil, errors.New(arg)
	case "failslow":
		if li.before != nil {
			li.before()
		}
		return nil, errors.New(arg)
	case "wait":
		if li.started != nil {
			li.started <- struct{}{}
		}
		<-ctx.Done()
		return nil, ctx.Err()
	case "panic":
		panic(arg)
	}
	return nil, nil
}

func (li *lineInterp) Complete(code string, cursor int) ([]string, int, int) {
	if code == "explode" {
		panic("completion exploded")
	}
	start := strings.LastIndexAny(code[:cursor], " \n") + 1
	var out []string
	for _, w := range []string{"print", "panic", "result"} {
		if strings.HasPrefix(w, code[start:cursor]) {
			out = append(out, w)
		}
	}
	return out, start, cursor
}

// client is a minimal Jupyter client over zmq4, for driving the kernel from Go.
type client struct {
	t                testing.TB
	signer           *wire.Signer
	shell, control   zmq4.Socket
	iopub, hb        zmq4.Socket
	iopubMsgs        chan *wire.Message
	shellR, controlR chan *wire.Message
}

func startKernel(t testing.TB, interp Interpreter) (*client, *Kernel, chan error) {
	t.Helper()
	return startKernelWith(t, interp, WireLimits{})
}

// startKernelWith starts a kernel whose sockets take the given wire limits.
func startKernelWith(t testing.TB, interp Interpreter, lim WireLimits) (*client, *Kernel, chan error) {
	t.Helper()
	ci := &ConnectionInfo{Transport: "tcp", IP: "127.0.0.1", Key: "test-key", SignatureScheme: "hmac-sha256"}
	ctx, cancel := context.WithCancel(context.Background())
	logger := slog.New(slog.NewTextHandler(io.Discard, nil))
	if testing.Verbose() {
		logger = slog.New(slog.NewTextHandler(testWriter{t}, nil))
	}
	k, err := New(ctx, Config{Conn: ci, Interp: interp, Logger: logger, Limits: lim})
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- k.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			t.Error("kernel did not stop")
		}
	})
	c, err := newClient(t, k.Conn())
	if err != nil {
		t.Fatal(err)
	}
	return c, k, done
}

// newClient connects a client to the kernel's shell, control, iopub and heartbeat ports and
// waits until iopub delivers (kernel_info until a status arrives).
func newClient(t testing.TB, conn ConnectionInfo) (*client, error) {
	t.Helper()
	c := &client{t: t, signer: wire.NewSigner(conn.Key), iopubMsgs: make(chan *wire.Message, 256),
		shellR: make(chan *wire.Message, 16), controlR: make(chan *wire.Message, 16)}
	cctx, ccancel := context.WithCancel(context.Background())
	c.shell = zmq4.NewDealer(cctx, zmq4.WithID(zmq4.SocketIdentity("client-shell-"+wire.NewID())))
	c.control = zmq4.NewDealer(cctx, zmq4.WithID(zmq4.SocketIdentity("client-control-"+wire.NewID())))
	c.iopub = zmq4.NewSub(cctx)
	c.hb = zmq4.NewReq(cctx)
	t.Cleanup(func() {
		ccancel()
		for _, s := range []zmq4.Socket{c.shell, c.control, c.iopub, c.hb} {
			s.Close()
		}
	})
	for _, d := range []struct {
		s    zmq4.Socket
		port int
	}{{c.shell, conn.ShellPort}, {c.control, conn.ControlPort}, {c.iopub, conn.IOPubPort}, {c.hb, conn.HBPort}} {
		if err := d.s.Dial(conn.Endpoint(d.port)); err != nil {
			return nil, err
		}
	}
	if err := c.iopub.SetOption(zmq4.OptionSubscribe, ""); err != nil {
		return nil, err
	}
	go c.pump(c.iopub, c.iopubMsgs)
	go c.pump(c.shell, c.shellR)
	go c.pump(c.control, c.controlR)
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		c.send(c.shell, "kernel_info_request", map[string]any{})
		c.recv(c.shellR, "kernel_info_reply")
		select {
		case <-c.iopubMsgs:
			c.drainIOPub()
			return c, nil
		case <-time.After(200 * time.Millisecond):
		}
	}
	return nil, errors.New("iopub never connected")
}

type testWriter struct{ t testing.TB }

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimSpace(string(p)))
	return len(p), nil
}

func (c *client) pump(s zmq4.Socket, ch chan<- *wire.Message) {
	for {
		raw, err := s.Recv()
		if err != nil {
			return
		}
		m, err := wire.Parse(raw.Frames, c.signer)
		if err != nil {
			c.t.Errorf("client got a bad message: %v", err)
			continue
		}
		ch <- m
	}
}

func (c *client) message(msgType string, content any) *wire.Message {
	b, _ := json.Marshal(content)
	return &wire.Message{Header: wire.NewHeader(msgType, "client-session", "test"), Content: b}
}

func (c *client) send(s zmq4.Socket, msgType string, content any) string {
	m := c.message(msgType, content)
	c.sendMsg(s, m, c.signer)
	return m.Header.MsgID
}

func (c *client) sendMsg(s zmq4.Socket, m *wire.Message, signer *wire.Signer) {
	frames, err := m.Frames(signer)
	if err != nil {
		c.t.Fatal(err)
	}
	if err := s.Send(zmq4.NewMsgFrom(frames...)); err != nil {
		c.t.Fatal(err)
	}
}

// replyWait is how long a test waits for a kernel's reply or status: a cell that loads the
// quickstart takes a second alone and ten times that under the race detector on a loaded
// 2-core machine. A kernel that hangs still fails the test.
const replyWait = 60 * time.Second

func (c *client) recv(ch chan *wire.Message, msgType string) map[string]any {
	c.t.Helper()
	select {
	case m := <-ch:
		if m.Header.MsgType != msgType {
			c.t.Fatalf("got %s, want %s: %s", m.Header.MsgType, msgType, m.Content)
		}
		var v map[string]any
		if err := json.Unmarshal(m.Content, &v); err != nil {
			c.t.Fatal(err)
		}
		return v
	case <-time.After(replyWait):
		c.t.Fatalf("no %s within %v", msgType, replyWait)
	}
	return nil
}

// iopubUntilIdle collects the iopub messages of request id up to its idle status.
func (c *client) iopubUntilIdle(id string) []*wire.Message {
	c.t.Helper()
	var out []*wire.Message
	for {
		select {
		case m := <-c.iopubMsgs:
			p, _ := m.ParentHeader()
			if p.MsgID != id {
				continue
			}
			out = append(out, m)
			if m.Header.MsgType == "status" && strings.Contains(string(m.Content), `"idle"`) {
				return out
			}
		case <-time.After(replyWait):
			c.t.Fatalf("no idle status for %s within %v; got %d messages", id, replyWait, len(out))
		}
	}
}

func (c *client) drainIOPub() {
	for {
		select {
		case <-c.iopubMsgs:
		case <-time.After(100 * time.Millisecond):
			return
		}
	}
}

func types(ms []*wire.Message) []string {
	var out []string
	for _, m := range ms {
		t := m.Header.MsgType
		if t == "status" {
			var c struct {
				State string `json:"execution_state"`
			}
			json.Unmarshal(m.Content, &c)
			t += ":" + c.State
		}
		out = append(out, t)
	}
	return out
}

func (c *client) execute(code string, opts map[string]any) (map[string]any, []*wire.Message) {
	c.t.Helper()
	content := map[string]any{"code": code, "silent": false, "store_history": true, "user_expressions": map[string]any{}, "allow_stdin": false, "stop_on_error": true}
	for k, v := range opts {
		content[k] = v
	}
	id := c.send(c.shell, "execute_request", content)
	reply := c.recv(c.shellR, "execute_reply")
	return reply, c.iopubUntilIdle(id)
}

func TestKernelInfoReply(t *testing.T) {
	c, _, _ := startKernel(t, &lineInterp{})
	id := c.send(c.shell, "kernel_info_request", map[string]any{})
	r := c.recv(c.shellR, "kernel_info_reply")
	li := r["language_info"].(map[string]any)
	if r["protocol_version"] != "5.3" || r["status"] != "ok" || li["name"] != "go" || li["file_extension"] != ".go" ||
		li["mimetype"] != "text/x-go" || li["codemirror_mode"] != "go" {
		t.Fatalf("kernel_info_reply = %v", r)
	}
	if got := strings.Join(types(c.iopubUntilIdle(id)), " "); got != "status:busy status:idle" {
		t.Fatalf("iopub around kernel_info = %s", got)
	}
}

func TestExecuteOutputsAndCounts(t *testing.T) {
	c, _, _ := startKernel(t, &lineInterp{})
	cases := []struct {
		code      string
		opts      map[string]any
		wantTypes string
		wantCount float64
		status    string
	}{
		{"print hello", nil, "status:busy execute_input stream status:idle", 1, "ok"},
		{"result 42", nil, "status:busy execute_input execute_result status:idle", 2, "ok"},
		{"display", nil, "status:busy execute_input display_data update_display_data status:idle", 3, "ok"},
		{"print quiet", map[string]any{"silent": true}, "status:busy status:idle", 3, "ok"},
		{"result 7", map[string]any{"store_history": false}, "status:busy execute_input execute_result status:idle", 3, "ok"},
		{"fail boom", nil, "status:busy execute_input error status:idle", 4, "error"},
		{"panic oops", nil, "status:busy execute_input error status:idle", 5, "error"},
		{"eprint warn", nil, "status:busy execute_input stream status:idle", 6, "ok"},
	}
	for _, tc := range cases {
		reply, msgs := c.execute(tc.code, tc.opts)
		if got := strings.Join(types(msgs), " "); got != tc.wantTypes {
			t.Errorf("%q: iopub = %s, want %s", tc.code, got, tc.wantTypes)
		}
		if reply["execution_count"] != tc.wantCount || reply["status"] != tc.status {
			t.Errorf("%q: reply = %v, want count %v status %s", tc.code, reply, tc.wantCount, tc.status)
		}
	}
	// Contents of the typical messages.
	_, msgs := c.execute("result 42", nil)
	var res struct {
		Count float64           `json:"execution_count"`
		Data  map[string]string `json:"data"`
	}
	json.Unmarshal(msgs[2].Content, &res)
	if res.Count != 7 || res.Data["text/plain"] != "42" {
		t.Errorf("execute_result = %s", msgs[2].Content)
	}
	_, msgs = c.execute("fail boom", nil)
	var e struct {
		Ename, Evalue string
		Traceback     []string
	}
	json.Unmarshal(msgs[2].Content, &e)
	if e.Evalue != "boom" || len(e.Traceback) == 0 {
		t.Errorf("error = %s", msgs[2].Content)
	}
	_, msgs = c.execute("display", nil)
	var d struct {
		Data      map[string]string `json:"data"`
		Transient map[string]string `json:"transient"`
	}
	json.Unmarshal(msgs[2].Content, &d)
	if d.Data["image/png"] != "iVBORw==" || d.Data["text/plain"] == "" || d.Transient["display_id"] != "d1" {
		t.Errorf("display_data = %s (png must be base64, text/plain added, display_id kept)", msgs[2].Content)
	}
}

func TestStopOnErrorAbortsQueuedCells(t *testing.T) {
	li := &lineInterp{}
	c, k, _ := startKernel(t, li)
	// The failing cell ends once the two cells after it are queued in the kernel.
	li.before = func() {
		deadline := time.Now().Add(10 * time.Second)
		for len(k.shellQ) < 2 && time.Now().Before(deadline) {
			time.Sleep(time.Millisecond)
		}
	}
	base := map[string]any{"silent": false, "store_history": true, "user_expressions": map[string]any{}, "allow_stdin": false}
	with := func(code string, stop bool) map[string]any {
		m := map[string]any{"code": code, "stop_on_error": stop}
		for k, v := range base {
			m[k] = v
		}
		return m
	}
	// Queue three cells at once; the first fails.
	c.send(c.shell, "execute_request", with("failslow first", true))
	c.send(c.shell, "execute_request", with("print second", true))
	c.send(c.shell, "execute_request", with("print third", true))
	got := []string{c.recv(c.shellR, "execute_reply")["status"].(string),
		c.recv(c.shellR, "execute_reply")["status"].(string), c.recv(c.shellR, "execute_reply")["status"].(string)}
	if strings.Join(got, " ") != "error aborted aborted" {
		t.Fatalf("statuses = %v, want error aborted aborted", got)
	}
	c.drainIOPub()
	// Without stop_on_error the next cell runs.
	c.send(c.shell, "execute_request", with("fail first", false))
	c.send(c.shell, "execute_request", with("print second", true))
	got = []string{c.recv(c.shellR, "execute_reply")["status"].(string), c.recv(c.shellR, "execute_reply")["status"].(string)}
	if strings.Join(got, " ") != "error ok" {
		t.Fatalf("statuses = %v, want error ok", got)
	}
}

func TestBadSignatureAndMalformedMessagesAreDropped(t *testing.T) {
	c, _, _ := startKernel(t, &lineInterp{})
	bad := c.message("execute_request", map[string]any{"code": "print tampered"})
	c.sendMsg(c.shell, bad, wire.NewSigner("wrong-key"))
	frames, _ := c.message("kernel_info_request", map[string]any{}).Frames(c.signer)
	frames[len(frames)-1] = []byte(`{"tampered":true}`) // content changed after signing
	c.shell.Send(zmq4.NewMsgFrom(frames...))
	c.shell.Send(zmq4.NewMsgFrom([]byte("garbage"), []byte("frames")))
	c.shell.Send(zmq4.NewMsgFrom([]byte(wire.Delimiter), []byte("x")))
	select {
	case m := <-c.shellR:
		t.Fatalf("kernel answered a bad message: %s %s", m.Header.MsgType, m.Content)
	case m := <-c.iopubMsgs:
		t.Fatalf("kernel published for a bad message: %s %s", m.Header.MsgType, m.Content)
	case <-time.After(500 * time.Millisecond):
	}
	// The kernel is still there.
	reply, _ := c.execute("print ok", nil)
	if reply["status"] != "ok" || reply["execution_count"] != 1.0 {
		t.Fatalf("after bad messages: %v", reply)
	}
}

func TestInterruptStopsTheCellAndTheKernelGoesOn(t *testing.T) {
	li := &lineInterp{started: make(chan struct{}, 1)}
	c, _, _ := startKernel(t, li)
	c.send(c.shell, "execute_request", map[string]any{"code": "wait", "silent": false, "store_history": true})
	select {
	case <-li.started:
	case <-time.After(10 * time.Second):
		t.Fatal("cell did not start")
	}
	c.send(c.control, "interrupt_request", map[string]any{})
	if r := c.recv(c.controlR, "interrupt_reply"); r["status"] != "ok" {
		t.Fatalf("interrupt_reply = %v", r)
	}
	r := c.recv(c.shellR, "execute_reply")
	if r["status"] != "error" || r["ename"] != "Interrupted" {
		t.Fatalf("interrupted cell reply = %v", r)
	}
	reply, _ := c.execute("result after", nil)
	if reply["status"] != "ok" {
		t.Fatalf("cell after interrupt: %v", reply)
	}
}

func TestHeartbeatEchoes(t *testing.T) {
	c, _, _ := startKernel(t, &lineInterp{})
	for i := range 3 {
		ping := fmt.Sprintf("ping-%d", i)
		if err := c.hb.Send(zmq4.NewMsgString(ping)); err != nil {
			t.Fatal(err)
		}
		m, err := c.hb.Recv()
		if err != nil || string(m.Frames[0]) != ping {
			t.Fatalf("heartbeat = %v, %v; want %s", m, err, ping)
		}
	}
}

func TestShutdownRequestStopsRun(t *testing.T) {
	c, _, done := startKernel(t, &lineInterp{})
	c.send(c.control, "shutdown_request", map[string]any{"restart": true})
	if r := c.recv(c.controlR, "shutdown_reply"); r["status"] != "ok" || r["restart"] != true {
		t.Fatalf("shutdown_reply = %v", r)
	}
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("Run = %v after shutdown, want nil", err)
		}
		done <- nil // for the cleanup
	case <-time.After(10 * time.Second):
		t.Fatal("Run did not return after shutdown_request")
	}
}

func TestCompleteInspectIsCompleteHistoryCommInfo(t *testing.T) {
	c, _, _ := startKernel(t, &lineInterp{})
	c.send(c.shell, "complete_request", map[string]any{"code": "x := pr", "cursor_pos": 7})
	r := c.recv(c.shellR, "complete_reply")
	if fmt.Sprint(r["matches"]) != "[print]" || r["cursor_start"] != 5.0 || r["cursor_end"] != 7.0 {
		t.Errorf("complete_reply = %v", r)
	}
	// Cursor positions count code points, not bytes.
	c.send(c.shell, "complete_request", map[string]any{"code": "é pa", "cursor_pos": 4})
	r = c.recv(c.shellR, "complete_reply")
	if fmt.Sprint(r["matches"]) != "[panic]" || r["cursor_start"] != 2.0 || r["cursor_end"] != 4.0 {
		t.Errorf("complete_reply (unicode) = %v", r)
	}
	c.send(c.shell, "inspect_request", map[string]any{"code": "print", "cursor_pos": 2, "detail_level": 0})
	if r = c.recv(c.shellR, "inspect_reply"); r["status"] != "ok" || r["found"] != false {
		t.Errorf("inspect_reply without an Inspector = %v", r)
	}
	c.send(c.shell, "is_complete_request", map[string]any{"code": "for {"})
	if r = c.recv(c.shellR, "is_complete_reply"); r["status"] != "incomplete" || r["indent"] != "\t" {
		t.Errorf("is_complete_reply = %v", r)
	}
	c.send(c.shell, "comm_info_request", map[string]any{})
	if r = c.recv(c.shellR, "comm_info_reply"); r["status"] != "ok" {
		t.Errorf("comm_info_reply = %v", r)
	}
	for _, code := range []string{"result 1", "result 2", "result 1"} {
		c.execute(code, nil)
	}
	hist := func(req map[string]any) string {
		c.send(c.shell, "history_request", req)
		r := c.recv(c.shellR, "history_reply")
		return fmt.Sprint(r["history"])
	}
	if got := hist(map[string]any{"output": false, "raw": true, "hist_access_type": "tail", "n": 2}); got != "[[1 2 result 2] [1 3 result 1]]" {
		t.Errorf("tail 2 = %s", got)
	}
	if got := hist(map[string]any{"output": true, "raw": true, "hist_access_type": "range", "session": 1, "start": 2, "stop": 3}); got != "[[1 2 [result 2 2]]]" {
		t.Errorf("range 2..3 with output = %s", got)
	}
	if got := hist(map[string]any{"output": false, "raw": true, "hist_access_type": "search", "pattern": "result 1*", "unique": true}); got != "[[1 3 result 1]]" {
		t.Errorf("search unique = %s", got)
	}
	c.send(c.shell, "history_request", map[string]any{"hist_access_type": "sideways"})
	if r = c.recv(c.shellR, "history_reply"); r["status"] != "error" || !strings.Contains(fmt.Sprint(r["evalue"]), "sideways") {
		t.Errorf("bad history_request = %v", r)
	}
	// A handler that panics gives an error reply, and the kernel goes on.
	c.send(c.shell, "complete_request", map[string]any{"code": "explode", "cursor_pos": 7})
	if r = c.recv(c.shellR, "complete_reply"); r["status"] != "error" || !strings.Contains(fmt.Sprint(r["evalue"]), "completion exploded") {
		t.Errorf("complete_reply of a panicking completer = %v", r)
	}
	// A request whose content does not decode gets an error reply naming the request.
	c.send(c.shell, "complete_request", map[string]any{"code": 12})
	if r = c.recv(c.shellR, "complete_reply"); r["status"] != "error" || !strings.Contains(fmt.Sprint(r["evalue"]), "complete_request") {
		t.Errorf("bad complete_request = %v", r)
	}
}

func TestIsCompleteGo(t *testing.T) {
	cases := []struct{ code, status, indent string }{
		{"", "complete", ""},
		{"x := 1", "complete", ""},
		{"%step 5", "complete", ""},
		{"for i := 0; i < 3; i++ {", "incomplete", "\t"},
		{"f(g(", "incomplete", "\t\t"},
		{"s := `raw", "incomplete", ""},
		{"/* open comment", "incomplete", ""},
		{"x := (1]", "invalid", ""},
		{"}", "invalid", ""},
		{"func f() {\n\treturn\n}", "complete", ""},
	}
	for _, c := range cases {
		s, ind := IsCompleteGo(c.code)
		if s != c.status || ind != c.indent {
			t.Errorf("IsCompleteGo(%q) = %q, %q; want %q, %q", c.code, s, ind, c.status, c.indent)
		}
	}
}

// BenchmarkExecuteRoundTrip measures one execute_request of a trivial cell through the
// kernel: request, busy, execute_input, stream, idle and reply over loopback TCP.
func BenchmarkExecuteRoundTrip(b *testing.B) {
	c, _, _ := startKernel(b, &lineInterp{})
	for b.Loop() {
		c.execute("print x", nil)
	}
}
