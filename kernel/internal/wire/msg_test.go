package wire

import (
	"bytes"
	"encoding/json"
	"errors"
	"strings"
	"testing"
)

func sample() *Message {
	return &Message{
		Identities: [][]byte{[]byte("client-1")},
		Header:     NewHeader("execute_request", "sess", "user"),
		Parent:     json.RawMessage(`{}`),
		Metadata:   json.RawMessage(`{}`),
		Content:    json.RawMessage(`{"code":"1+1","silent":false}`),
		Buffers:    [][]byte{{0, 1, 2}},
	}
}

func TestRoundTripKeepsEveryPart(t *testing.T) {
	for _, key := range []string{"", "secret-key"} {
		s := NewSigner(key)
		in := sample()
		frames, err := in.Frames(s)
		if err != nil {
			t.Fatal(err)
		}
		out, err := Parse(frames, s)
		if err != nil {
			t.Fatalf("key %q: %v", key, err)
		}
		if out.Header != in.Header || !bytes.Equal(out.Content, in.Content) || string(out.Identities[0]) != "client-1" ||
			len(out.Buffers) != 1 || !bytes.Equal(out.Buffers[0], in.Buffers[0]) {
			t.Fatalf("key %q: round trip changed the message: %+v", key, out)
		}
	}
}

// The signature is HMAC-SHA256 over header, parent, metadata and content, hex encoded; the
// expected value was computed independently with
// python3 -c 'import hmac,hashlib;print(hmac.new(b"k",b"{}{}{}{}",hashlib.sha256).hexdigest())'
// (jupyter_client's Session.sign does exactly this).
func TestSignMatchesHMACSHA256(t *testing.T) {
	got := NewSigner("k").Sign([]byte("{}"), []byte("{}"), []byte("{}"), []byte("{}"))
	const want = "6f7c3dea506a2fb840fc9377d65462646f8e8df4acfafa710cf0c50bb2db8de2"
	if got != want {
		t.Fatalf("Sign = %s, want %s", got, want)
	}
	if !NewSigner("k").Verify([]byte(want), []byte("{}"), []byte("{}"), []byte("{}"), []byte("{}")) {
		t.Fatal("Verify refused its own signature")
	}
}

func TestTamperedMessagesAreRejected(t *testing.T) {
	s := NewSigner("secret-key")
	frames, err := sample().Frames(s)
	if err != nil {
		t.Fatal(err)
	}
	d := 1 // index of the delimiter
	cases := []struct {
		name   string
		change func(f [][]byte)
	}{
		{"signature flipped", func(f [][]byte) { f[d+1][0] ^= 1 }},
		{"signature not hex", func(f [][]byte) { f[d+1] = []byte("zz") }},
		{"signature empty", func(f [][]byte) { f[d+1] = nil }},
		{"header changed", func(f [][]byte) { f[d+2] = bytes.Replace(f[d+2], []byte("execute"), []byte("shutdown"), 1) }},
		{"content changed", func(f [][]byte) { f[d+5] = []byte(`{"code":"os.Exit(1)"}`) }},
		{"metadata changed", func(f [][]byte) { f[d+4] = []byte(`{"a":1}`) }},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			f := clone(frames)
			c.change(f)
			_, err := Parse(f, s)
			if !errors.Is(err, ErrBadSignature) {
				t.Fatalf("Parse = %v, want ErrBadSignature", err)
			}
		})
	}
	t.Run("wrong key", func(t *testing.T) {
		if _, err := Parse(frames, NewSigner("other")); !errors.Is(err, ErrBadSignature) {
			t.Fatalf("Parse with another key = %v, want ErrBadSignature", err)
		}
	})
}

func clone(f [][]byte) [][]byte {
	out := make([][]byte, len(f))
	for i := range f {
		out[i] = append([]byte(nil), f[i]...)
	}
	return out
}

func TestMalformedFramesGetErrorsNamingTheProblem(t *testing.T) {
	s := NewSigner("")
	ok := func(h, p, m, c string) [][]byte {
		return [][]byte{[]byte("id"), []byte(Delimiter), nil, []byte(h), []byte(p), []byte(m), []byte(c)}
	}
	hdr := `{"msg_id":"1","msg_type":"kernel_info_request","session":"s","username":"u","date":"","version":"5.3"}`
	cases := []struct {
		name   string
		frames [][]byte
		want   string
	}{
		{"no frames", nil, "no \"<IDS|MSG>\" delimiter"},
		{"no delimiter", [][]byte{[]byte("a"), []byte("b")}, "delimiter"},
		{"too few frames", [][]byte{[]byte(Delimiter), nil, []byte("{}")}, "2 frames after the delimiter"},
		{"header not JSON", ok("{", "{}", "{}", "{}"), "header frame"},
		{"header without type", ok(`{"msg_id":"1"}`, "{}", "{}", "{}"), "no msg_type"},
		{"header wrong type", ok(`{"msg_id":1,"msg_type":"x"}`, "{}", "{}", "{}"), "header frame"},
		{"parent not object", ok(hdr, "[]", "{}", "{}"), "parent header frame"},
		{"metadata not JSON", ok(hdr, "{}", "{x", "{}"), "metadata frame"},
		{"content empty", ok(hdr, "{}", "{}", ""), "content frame"},
		{"content trailing garbage", ok(hdr, "{}", "{}", "{} {}"), "content frame"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, err := Parse(c.frames, s)
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("Parse = %v, want an error containing %q", err, c.want)
			}
		})
	}
	t.Run("valid", func(t *testing.T) {
		m, err := Parse(ok(hdr, "{}", "{}", `{"x":1}`), s)
		if err != nil || m.Header.MsgType != "kernel_info_request" {
			t.Fatalf("Parse = %+v, %v", m, err)
		}
	})
}

func TestTooManyBuffersRefused(t *testing.T) {
	m := sample()
	m.Buffers = make([][]byte, MaxBuffers+1)
	f, _ := m.Frames(NewSigner(""))
	if _, err := Parse(f, NewSigner("")); err == nil || !strings.Contains(err.Error(), "buffers") {
		t.Fatalf("Parse = %v, want a buffers error", err)
	}
}

func TestConnectionInfo(t *testing.T) {
	good := `{"transport":"tcp","ip":"127.0.0.1","shell_port":1,"control_port":2,"stdin_port":3,"iopub_port":4,"hb_port":5,"key":"k","signature_scheme":"hmac-sha256"}`
	ci, err := ParseConnectionInfo([]byte(good))
	if err != nil {
		t.Fatal(err)
	}
	if got := ci.Endpoint(ci.IOPubPort); got != "tcp://127.0.0.1:4" {
		t.Fatalf("Endpoint = %q", got)
	}
	bad := []struct{ json, want string }{
		{`{`, "not valid JSON"},
		{`{"ip":"127.0.0.1"}`, `"transport" missing`},
		{`{"transport":"udp"}`, `"udp" is not supported`},
		{strings.Replace(good, `"hb_port":5`, `"hb_port":70000`, 1), `"hb_port"`},
		{strings.Replace(good, `"127.0.0.1"`, `"not an ip"`, 1), `"ip"`},
		{strings.Replace(good, `hmac-sha256`, `hmac-md5`, 1), `"signature_scheme"`},
	}
	for _, b := range bad {
		if _, err := ParseConnectionInfo([]byte(b.json)); err == nil || !strings.Contains(err.Error(), b.want) {
			t.Errorf("ParseConnectionInfo(%s) = %v, want error containing %s", b.json, err, b.want)
		}
	}
}

func FuzzParse(f *testing.F) {
	s := NewSigner("fuzz")
	good, _ := sample().Frames(s)
	f.Add(bytes.Join(good, []byte{0}), true)
	f.Add([]byte("<IDS|MSG>\x00\x00{}\x00{}\x00{}\x00{}"), false)
	f.Add([]byte{}, false)
	f.Fuzz(func(t *testing.T, data []byte, signed bool) {
		frames := bytes.Split(data, []byte{0})
		signer := NewSigner("")
		if signed {
			signer = s
		}
		m, err := Parse(frames, signer)
		if err != nil {
			return
		}
		// Whatever parses must encode and parse again to the same message.
		out, err := m.Frames(signer)
		if err != nil {
			t.Fatalf("Frames of a parsed message: %v", err)
		}
		m2, err := Parse(out, signer)
		if err != nil {
			t.Fatalf("re-parse: %v", err)
		}
		if m2.Header != m.Header || !bytes.Equal(m2.Content, m.Content) {
			t.Fatalf("re-parse changed the message")
		}
	})
}

func FuzzParseConnectionInfo(f *testing.F) {
	f.Add([]byte(`{"transport":"tcp","ip":"127.0.0.1","shell_port":1,"control_port":2,"stdin_port":3,"iopub_port":4,"hb_port":5,"key":"k","signature_scheme":"hmac-sha256"}`))
	f.Add([]byte(`{"transport":"ipc","ip":"/tmp/k"}`))
	f.Add([]byte(`[]`))
	f.Fuzz(func(t *testing.T, b []byte) {
		ci, err := ParseConnectionInfo(b)
		if err != nil {
			if err.Error() == "" {
				t.Fatal("empty error")
			}
			return
		}
		if err := ci.Validate(); err != nil {
			t.Fatalf("a parsed connection info does not validate: %v", err)
		}
		_ = ci.Endpoint(ci.ShellPort)
	})
}
