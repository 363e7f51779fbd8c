package server

import (
	"bytes"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"sync"
	"testing"

	"google.golang.org/protobuf/proto"

	"github.com/halo-shell/halo-shell/session"
	halov1 "github.com/halo-shell/halo-shell/session/proto/halo/v1"
)

// fuzzServer is one loaded session shared by the fuzz iterations.
var fuzzServer struct {
	once sync.Once
	s    *Server
	h    http.Handler
	err  error
}

// FuzzRequests sends arbitrary bytes as the protobuf body of the RPCs that parse and validate
// fields (Inspect, SetHyper, Control, Eval, Status, GetHyper, Events) to a session with the
// tiny model loaded: every answer must be a well-formed reply or error, never an internal
// error, and the session must go on answering.
func FuzzRequests(f *testing.F) {
	procs := []string{"Inspect", "SetHyper", "Control", "Status", "GetHyper", "Eval"}
	seed := func(i int, m proto.Message) {
		b, _ := proto.Marshal(m)
		f.Add(uint8(i), b)
	}
	lr, accum := 1e-3, int32(0)
	seed(0, &halov1.InspectRequest{Name: "model.layers.0.mlp.up_proj.weight", Offset: 3, Count: 4})
	seed(0, &halov1.InspectRequest{Name: "model.norm.weight", Kind: "grad", Offset: -5, Count: 1 << 40})
	seed(1, &halov1.SetHyperRequest{LearningRate: &lr})
	seed(1, &halov1.SetHyperRequest{GradientAccumulationSteps: &accum})
	seed(2, &halov1.ControlRequest{Action: 7})
	seed(3, &halov1.StatusRequest{})
	f.Add(uint8(0), []byte{0xff, 0xff, 0xff})
	f.Fuzz(func(t *testing.T, which uint8, body []byte) {
		fuzzServer.once.Do(func() {
			dir, err := mkdirTemp()
			if err != nil {
				fuzzServer.err = err
				return
			}
			s, err := New(Options{Name: "fuzz", Socket: dir + "/f.sock", Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
			if err != nil {
				fuzzServer.err = err
				return
			}
			go s.eng.loop()
			fuzzServer.s, fuzzServer.h = s, s.httpHandler()
			req := httptest.NewRequest("POST", "/halo.v1.SessionService/Load", bytes.NewReader(mustMarshal(&halov1.LoadRequest{ConfigPath: tinyConfig})))
			req.Header.Set("Content-Type", "application/proto")
			req.Header.Set(session.HeaderClientID, "fuzzer")
			w := httptest.NewRecorder()
			fuzzServer.h.ServeHTTP(w, req)
			if w.Code != 200 {
				fuzzServer.err = io.ErrUnexpectedEOF
			}
		})
		if fuzzServer.err != nil {
			t.Fatal(fuzzServer.err)
		}
		proc := procs[int(which)%len(procs)]
		req := httptest.NewRequest("POST", "/halo.v1.SessionService/"+proc, bytes.NewReader(body))
		req.Header.Set("Content-Type", "application/proto")
		req.Header.Set(session.HeaderClientID, "fuzzer")
		w := httptest.NewRecorder()
		fuzzServer.h.ServeHTTP(w, req)
		if w.Code == http.StatusInternalServerError || strings.Contains(w.Body.String(), "internal error") {
			t.Fatalf("%s(%x): HTTP %d %s", proc, body, w.Code, w.Body.String())
		}
		if w.Code != 200 && !strings.Contains(w.Body.String(), "message") {
			t.Fatalf("%s(%x): HTTP %d without a message: %s", proc, body, w.Code, w.Body.String())
		}
		// The session still answers.
		st := httptest.NewRequest("POST", "/halo.v1.SessionService/Status", bytes.NewReader(nil))
		st.Header.Set("Content-Type", "application/proto")
		sw := httptest.NewRecorder()
		fuzzServer.h.ServeHTTP(sw, st)
		if sw.Code != 200 {
			t.Fatalf("Status after %s(%x): HTTP %d", proc, body, sw.Code)
		}
	})
}

func mustMarshal(m proto.Message) []byte {
	b, err := proto.Marshal(m)
	if err != nil {
		panic(err)
	}
	return b
}

func mkdirTemp() (string, error) { return os.MkdirTemp("", "halo-fuzz-") }
