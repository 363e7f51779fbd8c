package server

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"io"
	"log/slog"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect/v2"

	"github.com/halo-shell/halo-shell/engine/train"
	"github.com/halo-shell/halo-shell/session"
)

func TestListenRefusesRemoteBindsWithoutOptIn(t *testing.T) {
	tests := []struct {
		listen string
		allow  bool
		err    string // "" when it binds
		log    string
	}{
		{"tcp://127.0.0.1:0", false, "", ""},
		{"tcp://localhost:0", false, "", ""},
		{"tcp://[::1]:0", false, "", ""},
		{"tcp://:0", false, "", ""}, // HOST empty means 127.0.0.1
		{"tcp://0.0.0.0:0", false, "binds an address other machines can reach; pass --allow-remote", ""},
		{"tcp://[::]:0", false, "--allow-remote", ""},
		{"tcp://0.0.0.0:0", true, "", "in plaintext"},
	}
	for _, tc := range tests {
		t.Run(tc.listen, func(t *testing.T) {
			dir := t.TempDir()
			t.Setenv("HALO_SESSION_DIR", dir)
			logs := &syncBuffer{}
			s, err := New(Options{Name: "bind", Socket: filepath.Join(dir, "s.sock"), Listen: tc.listen, AllowRemote: tc.allow,
				Logger: slog.New(slog.NewTextHandler(logs, nil))})
			if tc.err != "" {
				mustContain(t, err, tc.err, "ssh -N -L")
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			s.unixLn.Close()
			s.tcpLn.Close()
			if !strings.Contains(logs.String(), tc.log) {
				t.Errorf("log %q lacks %q", logs.String(), tc.log)
			}
			if tc.log == "" && strings.Contains(logs.String(), "level=WARN") {
				t.Errorf("a loopback bind warned: %s", logs.String())
			}
		})
	}
}

// writeCert writes a self-signed certificate for 127.0.0.1 (its own CA) and its key.
func writeCert(t *testing.T, dir string) (cert, key string) {
	t.Helper()
	k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "halo test"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IPAddresses: []net.IP{net.ParseIP("127.0.0.1")}, IsCA: true, BasicConstraintsValid: true,
		KeyUsage: x509.KeyUsageDigitalSignature | x509.KeyUsageCertSign, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &k.PublicKey, k)
	if err != nil {
		t.Fatal(err)
	}
	kd, err := x509.MarshalECPrivateKey(k)
	if err != nil {
		t.Fatal(err)
	}
	cert, key = filepath.Join(dir, "cert.pem"), filepath.Join(dir, "key.pem")
	if err := os.WriteFile(cert, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(key, pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kd}), 0o600); err != nil {
		t.Fatal(err)
	}
	return cert, key
}

// TestTLSListener serves TCP over TLS: a client with the CA file (option or HALO_SESSION_CA)
// talks to it, one without gets no answer, and a bad key pair is refused at start.
func TestTLSListener(t *testing.T) {
	cert, key := writeCert(t, t.TempDir())
	s := startServer(t, Options{Listen: "tcp://127.0.0.1:0", TLSCert: cert, TLSKey: key})
	ctx := ctxT(t)
	c, err := session.Dial(s.TCPAddr(), session.Options{Token: s.Token(), CAFile: cert})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if _, err := c.Status(ctx); err != nil {
		t.Fatalf("Status over TLS: %v", err)
	}
	plain, err := session.Dial(s.TCPAddr(), session.Options{Token: s.Token()})
	if err != nil {
		t.Fatal(err)
	}
	defer plain.Close()
	if _, err := plain.Status(ctx); err == nil {
		t.Fatal("a plaintext client got an answer from a TLS listener")
	}
	t.Setenv("HALO_SESSION_CA", cert)
	viaEnv, err := session.Dial(s.TCPAddr(), session.Options{Token: s.Token()})
	if err != nil {
		t.Fatal(err)
	}
	defer viaEnv.Close()
	if _, err := viaEnv.Status(ctx); err != nil {
		t.Fatalf("Status over TLS with HALO_SESSION_CA: %v", err)
	}
	dir := t.TempDir()
	_, err = New(Options{Name: "badtls", Socket: filepath.Join(dir, "s.sock"), Listen: "tcp://127.0.0.1:0", TLSCert: key, TLSKey: cert,
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	mustContain(t, err, "TLS certificate")
}

// TestRemoteClientsAreConfined: over TCP, Load and Save may only name paths inside the
// session's working directory (symbolic links followed), and a config's output_dir too;
// clients on the unix socket are not confined.
func TestRemoteClientsAreConfined(t *testing.T) {
	work := t.TempDir()
	raw, err := os.ReadFile(tinyConfig)
	if err != nil {
		t.Fatal(err)
	}
	// The tokenizer a remote config names must lie inside the session's directories too.
	tok := filepath.Join(work, "tokenizer")
	if err := os.CopyFS(tok, os.DirFS("../../examples/quickstart/tokenizer")); err != nil {
		t.Fatal(err)
	}
	outsideTok, _ := filepath.Abs("../../examples/quickstart/tokenizer")
	cfg := strings.ReplaceAll(string(raw), "../../examples/quickstart/tokenizer", tok)
	cfg = strings.ReplaceAll(cfg, "/tmp/halo-session-test-out", "out")
	if err := os.WriteFile(filepath.Join(work, "tiny.yaml"), []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	outside := t.TempDir()
	if err := os.Symlink(outside, filepath.Join(work, "escape")); err != nil {
		t.Fatal(err)
	}
	t.Chdir(work)
	s := startServer(t, Options{Listen: "tcp://127.0.0.1:0"})
	ctx := ctxT(t)
	remote, err := session.Dial(s.TCPAddr(), session.Options{Token: s.Token(), ClientName: "remote"})
	if err != nil {
		t.Fatal(err)
	}
	defer remote.Close()
	for _, tc := range []struct {
		path      string
		overrides []string
		err       string
	}{
		{"/etc/passwd", nil, `config "/etc/passwd" is outside the session's directories`},
		{"../tiny.yaml", nil, "is outside"},
		{"escape/tiny.yaml", nil, "is outside"},
		{"tiny.yaml", []string{"--output_dir=" + outside}, `output_dir "` + outside + `" is outside`},
		{"tiny.yaml", []string{"--tokenizer_name_or_path=" + outsideTok}, `tokenizer_name_or_path "` + outsideTok + `" is outside`},
		{"tiny.yaml", []string{"--resume_from_checkpoint=/etc"}, `resume_from_checkpoint "/etc" is outside`},
		{"tiny.yaml", nil, ""},
	} {
		_, err := remote.Load(ctx, tc.path, "sft", tc.overrides...)
		if tc.err == "" {
			if err != nil {
				t.Errorf("Load %s: %v", tc.path, err)
			}
			continue
		}
		if connect.CodeOf(err) != connect.CodePermissionDenied {
			t.Errorf("Load %s %v: %v, want permission_denied", tc.path, tc.overrides, err)
			continue
		}
		mustContain(t, err, tc.err)
	}
	for _, tc := range []struct{ dir, err string }{
		{filepath.Join(outside, "ckpt"), "is outside"},
		{"escape/ckpt", "is outside"},
		{"../ckpt", "is outside"},
		{"ckpt", ""},
	} {
		_, err := remote.Save(ctx, tc.dir)
		if tc.err == "" {
			if err != nil {
				t.Errorf("Save %s: %v", tc.dir, err)
			}
			continue
		}
		if connect.CodeOf(err) != connect.CodePermissionDenied {
			t.Errorf("Save %s: %v, want permission_denied", tc.dir, err)
			continue
		}
		mustContain(t, err, tc.err)
	}
	if _, err := os.Stat(filepath.Join(outside, "ckpt")); err == nil {
		t.Error("a refused Save wrote outside the session's directories")
	}
	local := dial(t, s.Socket(), "local")
	if _, err := local.TakeOver(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := local.Save(ctx, filepath.Join(outside, "local")); err != nil {
		t.Fatalf("a unix-socket client's Save outside the working directory: %v", err)
	}
}

// TestLoadErrorsNeverQuoteFileContents loads files that are not configs: the error names the
// file, line and column and at most the start of a key, never the rest of the line.
func TestLoadErrorsNeverQuoteFileContents(t *testing.T) {
	s := startServer(t, Options{})
	c := dial(t, s.Socket(), "c")
	ctx := ctxT(t)
	dir := t.TempDir()
	secret := filepath.Join(dir, "shadow")
	if err := os.WriteFile(secret, []byte("root:$6$saltsalt$hashhashhash:19000:0:99999:7:::\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	_, err := c.Load(ctx, secret, "sft")
	mustContain(t, err, secret+":1:1", `"root..."`)
	for _, leak := range []string{"saltsalt", "hashhash", "19000"} {
		if strings.Contains(err.Error(), leak) {
			t.Errorf("the error quotes the file's contents (%q): %v", leak, err)
		}
	}
}

func TestScrubContents(t *testing.T) {
	for _, tc := range []struct{ in, want string }{
		{`f:3:1: unknown key "bin:*:19000:0:99999:7:::"`, `f:3:1: unknown key "bin..."`},
		{`f:1:1: unknown key "learnng_rate" (did you mean "learning_rate"?)`, `f:1:1: unknown key "learnng_rate" (did you mean "learning_rate"?)`},
		{`config "/etc/passwd" is outside`, `config "/etc/passwd" is outside`},
		{`value "` + strings.Repeat("ab:", 30) + `"`, `value "ab..."`},
		{`key "` + strings.Repeat("k", 60) + `:x"`, `key "` + strings.Repeat("k", 40) + `..."`},
		{`key "a\"b:c"`, `key "a..."`},
		{`no quotes at all`, `no quotes at all`},
	} {
		if got := scrubContents(tc.in); got != tc.want {
			t.Errorf("scrubContents(%q) = %q, want %q", tc.in, got, tc.want)
		}
	}
}

// TestConfigPathsListsEveryPath: confinement sees each file and directory a config names.
func TestConfigPathsListsEveryPath(t *testing.T) {
	var cfg train.Config
	cfg.Model.ModelNameOrPath, cfg.Model.TokenizerNameOrPath = "/m", "/tok"
	cfg.Dataset.Path = train.StringList{"/d1", "/d2"}
	cfg.Dataset.EvalPath = train.StringList{"/e"}
	cfg.Run.ResumeFromCheckpoint, cfg.Run.OutputDir = "/ck", "/out"
	var got []string
	for _, p := range configPaths(&cfg) {
		got = append(got, p.what+"="+p.path)
	}
	want := "model_name_or_path=/m tokenizer_name_or_path=/tok resume_from_checkpoint=/ck output_dir=/out dataset.path=/d1 dataset.path=/d2 dataset.eval_path=/e"
	if strings.Join(got, " ") != want {
		t.Fatalf("configPaths = %s\nwant %s", strings.Join(got, " "), want)
	}
}
