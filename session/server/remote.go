package server

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"regexp"
	"strings"

	"connectrpc.com/connect/v2"

	"github.com/halo-shell/halo-shell/session"
)

// Remote clients.
//
// A session binds loopback addresses only, unless Options.AllowRemote says otherwise; then it
// warns, and serves TLS when Options.TLSCert and TLSKey name a certificate and key (clients
// dial with the CA file that signed it: session.Options.CAFile or HALO_SESSION_CA), else
// plaintext (an SSH tunnel to a loopback bind is the other way). Calls that come over TCP may
// only name files inside the session's directories (its working directory and SaveOnStop), and
// no error about a file quotes the file's contents, for any client.

// CheckListen checks a --listen address as a session with o would bind it: an address other
// machines can reach is refused unless o.AllowRemote, and then comes with a warning to show.
func CheckListen(o Options) (warning string, err error) {
	addr, err := session.ParseListen(o.Listen)
	if err != nil {
		return "", err
	}
	return checkBind(o.Listen, addr, o)
}

// checkBind refuses a TCP address that other machines can reach unless the remote bind was
// asked for, and returns a warning for one that was.
func checkBind(listen, addr string, o Options) (warning string, err error) {
	if session.IsLoopback(addr) {
		return "", nil
	}
	_, port, _ := net.SplitHostPort(addr)
	if !o.AllowRemote {
		return "", fmt.Errorf("session: --listen %s binds an address other machines can reach; pass --allow-remote to serve it (with --tls-cert and --tls-key for TLS), or listen on tcp://127.0.0.1:%s and reach it through an SSH tunnel (ssh -N -L %s:127.0.0.1:%s HOST)", listen, port, port, port)
	}
	if o.TLSCert == "" {
		return fmt.Sprintf("serving %s to other machines in plaintext: the bearer token and all traffic can be read on the network; use --tls-cert and --tls-key, or an SSH tunnel to a loopback address", listen), nil
	}
	return fmt.Sprintf("serving %s to other machines over TLS; clients need the bearer token and the CA file of the certificate (HALO_SESSION_CA)", listen), nil
}

// tlsConfig loads the certificate and key of a TLS listener.
func tlsConfig(o Options) (*tls.Config, error) {
	if o.TLSCert == "" && o.TLSKey == "" {
		return nil, nil
	}
	if o.TLSCert == "" || o.TLSKey == "" {
		return nil, errors.New("session: TLS needs both --tls-cert and --tls-key")
	}
	if o.Listen == "" {
		return nil, errors.New("session: --tls-cert and --tls-key serve the --listen address; give one")
	}
	cert, err := tls.LoadX509KeyPair(o.TLSCert, o.TLSKey)
	if err != nil {
		return nil, fmt.Errorf("session: TLS certificate %s and key %s: %w", o.TLSCert, o.TLSKey, err)
	}
	return &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12, NextProtos: []string{"h2", "http/1.1"}}, nil
}

func isTCP(ctx context.Context) bool {
	tcp, _ := ctx.Value(keyTCP).(bool)
	return tcp
}

// confine checks that a path a remote client named lies inside the session's directories
// (after symbolic links), and returns it absolute. what names the path for the error.
func (s *Server) confine(what, path string) (string, error) {
	if path == "" {
		return path, nil
	}
	abs := path
	if !filepath.IsAbs(abs) {
		abs = filepath.Join(s.workDir, abs)
	}
	real := resolveExisting(filepath.Clean(abs))
	for _, root := range s.roots() {
		if rel, err := filepath.Rel(root, real); err == nil && rel != ".." && !strings.HasPrefix(rel, ".."+string(filepath.Separator)) {
			return abs, nil
		}
	}
	return "", connect.Errorf(connect.CodePermissionDenied, "session: %s %q is outside the session's directories (%s); clients over TCP may only use paths inside them", what, path, strings.Join(s.roots(), ", "))
}

// roots are the directories remote clients may name paths in, symbolic links resolved.
func (s *Server) roots() []string {
	out := []string{resolveExisting(s.workDir)}
	if s.o.SaveOnStop != "" {
		d := s.o.SaveOnStop
		if !filepath.IsAbs(d) {
			d = filepath.Join(s.workDir, d)
		}
		out = append(out, resolveExisting(filepath.Clean(d)))
	}
	return out
}

// resolveExisting resolves the symbolic links of the longest existing prefix of an absolute,
// clean path and appends the rest, so that a path to be created is judged by where it lands.
func resolveExisting(p string) string {
	rest := ""
	for {
		if r, err := filepath.EvalSymlinks(p); err == nil {
			return filepath.Join(r, rest)
		}
		parent := filepath.Dir(p)
		if parent == p {
			return filepath.Join(p, rest)
		}
		rest = filepath.Join(filepath.Base(p), rest)
		p = parent
	}
}

var quotedRE = regexp.MustCompile(`"([^"\\]|\\.)*"`)

// keyRE is what a configuration key or a plain word looks like.
var keyRE = regexp.MustCompile(`^[A-Za-z0-9_.\-]*`)

// plainRE is a quoted string an error may keep whole: words, paths, spaces.
var plainRE = regexp.MustCompile(`^[A-Za-z0-9_.\-/ ]*$`)

// maxQuoted bounds the start of a key kept in an error; maxPlain a plain quoted string
// (a word or a path) kept whole.
const (
	maxQuoted = 40
	maxPlain  = 512
)

// scrubContents rewrites the quoted strings of an error about a file so that it never
// carries the file's contents: a quoted string that is not a plain word or path (a line of
// another file read as a key, a value) is cut to its leading key characters and "...".
func scrubContents(msg string) string {
	return quotedRE.ReplaceAllStringFunc(msg, func(q string) string {
		inner := q[1 : len(q)-1]
		if len(inner) <= maxPlain && plainRE.MatchString(inner) {
			return q
		}
		key := keyRE.FindString(inner)
		if len(key) > maxQuoted {
			key = key[:maxQuoted]
		}
		return `"` + key + `..."`
	})
}

// scrubError is scrubContents on a connect error, keeping its code.
func scrubError(err error) error {
	if err == nil {
		return nil
	}
	var ce *connect.Error
	if errors.As(err, &ce) {
		if ce.Code() == connect.CodePermissionDenied {
			return err // a refused path, named by the client itself
		}
		return connect.NewError(ce.Code(), scrubContents(ce.Message()))
	}
	return errors.New(scrubContents(err.Error()))
}

// workDirOf is the server's working directory ("/" when it cannot be found).
func workDirOf() string {
	d, err := os.Getwd()
	if err != nil {
		return "/"
	}
	return d
}
