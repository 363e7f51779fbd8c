package rendezvous

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func TestResolveConfig(t *testing.T) {
	dir := t.TempDir()
	tokFile := filepath.Join(dir, "tok")
	os.WriteFile(tokFile, []byte("  from-file\n"), 0o600)
	empty := filepath.Join(dir, "empty")
	os.WriteFile(empty, nil, 0o600)
	slurm := map[string]string{"SLURM_NNODES": "4", "SLURM_NODEID": "2", "SLURM_PROCID": "9", "SLURM_JOB_NODELIST": "gpu[07-10],cpu1", EnvToken: "env-tok"}
	with := func(f func(*Flags)) Flags { x := UnsetFlags(); f(&x); return x }
	cases := []struct {
		name  string
		flags Flags
		env   map[string]string
		want  Config
		err   string
	}{
		{"nothing: one node", UnsetFlags(), nil, Config{NNodes: 1}, ""},
		{"slurm only", UnsetFlags(), slurm, Config{NNodes: 4, NodeRank: 2, Addr: "gpu07:29510", Token: "env-tok"}, ""},
		{"flags override slurm", with(func(f *Flags) {
			f.NNodes, f.NodeRank, f.Rendezvous, f.Token, f.Timeout = 2, 1, "10.0.0.1:1234", "flag-tok", time.Second
		}), slurm, Config{NNodes: 2, NodeRank: 1, Addr: "10.0.0.1:1234", Token: "flag-tok", Timeout: time.Second}, ""},
		{"procid when no nodeid", UnsetFlags(), map[string]string{"SLURM_NNODES": "2", "SLURM_PROCID": "1", "SLURM_JOB_NODELIST": "n1,n2", EnvToken: "x"}, Config{NNodes: 2, NodeRank: 1, Addr: "n1:29510", Token: "x"}, ""},
		{"token file flag", with(func(f *Flags) { f.NNodes, f.NodeRank, f.Rendezvous, f.TokenFile = 2, 0, "h:1", tokFile }), nil, Config{NNodes: 2, Addr: "h:1", Token: "from-file"}, ""},
		{"token file env", with(func(f *Flags) { f.NNodes, f.Rendezvous = 2, "h:1" }), map[string]string{EnvTokenFile: tokFile}, Config{NNodes: 2, Addr: "h:1", Token: "from-file"}, ""},
		{"address env", with(func(f *Flags) { f.NNodes, f.Token = 2, "t" }), map[string]string{EnvAddr: "h:2"}, Config{NNodes: 2, Addr: "h:2", Token: "t"}, ""},
		{"empty token file", with(func(f *Flags) { f.NNodes, f.Rendezvous, f.TokenFile = 2, "h:1", empty }), nil, Config{}, "is empty"},
		{"missing token file", with(func(f *Flags) { f.NNodes, f.Rendezvous, f.TokenFile = 2, "h:1", filepath.Join(dir, "nope") }), nil, Config{}, "--rendezvous-token-file"},
		{"no token", with(func(f *Flags) { f.NNodes, f.Rendezvous = 2, "h:1" }), nil, Config{}, "no token"},
		{"no address", with(func(f *Flags) { f.NNodes, f.Token = 2, "t" }), nil, Config{}, "pass --rendezvous HOST:PORT"},
		{"bad address", with(func(f *Flags) { f.NNodes, f.Token, f.Rendezvous = 2, "t", "nohost" }), nil, Config{}, `address "nohost"`},
		{"rank too big", with(func(f *Flags) { f.NNodes, f.NodeRank, f.Token, f.Rendezvous = 2, 2, "t", "h:1" }), nil, Config{}, "node rank 2 is outside 0..1"},
		{"bad slurm number", UnsetFlags(), map[string]string{"SLURM_NNODES": "two"}, Config{}, `SLURM_NNODES="two"`},
		{"bad nodelist", UnsetFlags(), map[string]string{"SLURM_NNODES": "2", "SLURM_JOB_NODELIST": "gpu[1-", EnvToken: "t"}, Config{}, "SLURM_JOB_NODELIST"},
		{"negative nnodes", with(func(f *Flags) { f.NNodes = -1 }), nil, Config{}, "--nnodes -1"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			got, err := ResolveConfig(tc.flags, func(k string) string { return tc.env[k] })
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("got %+v, %v; want error containing %q", got, err, tc.err)
				}
				return
			}
			if err != nil || got != tc.want {
				t.Fatalf("got %+v, %v; want %+v", got, err, tc.want)
			}
		})
	}
}

func TestFirstHost(t *testing.T) {
	cases := []struct{ in, want, err string }{
		{"node1", "node1", ""},
		{"gpu[03-05,9],cpu1", "gpu03", ""},
		{"a[7]", "a7", ""},
		{"rack1-n[10-12]-ib", "rack1-n10-ib", ""},
		{"x1,y[1-2]", "x1", ""},
		{"", "", "empty node list"},
		{"gpu[1-2", "", "not closed"},
		{"gpu]1", "", "without '['"},
		{"gpu[[1]]", "", "nested"},
		{"gpu[-1]", "", "does not start with a number"},
		{"bad!host", "", "has '!'"},
	}
	for _, tc := range cases {
		got, err := FirstHost(tc.in)
		if tc.err != "" {
			if err == nil || !strings.Contains(err.Error(), tc.err) {
				t.Errorf("FirstHost(%q) = %q, %v; want error %q", tc.in, got, err, tc.err)
			}
			continue
		}
		if err != nil || got != tc.want {
			t.Errorf("FirstHost(%q) = %q, %v; want %q", tc.in, got, err, tc.want)
		}
	}
}

func FuzzFirstHost(f *testing.F) {
	for _, s := range []string{"gpu[03-05,9],cpu1", "a", "[", "x[1-2]y,z", "a[]"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		h, err := FirstHost(s)
		if err == nil && checkHost(h) != nil {
			t.Fatalf("FirstHost(%q) = %q, not a host name", s, h)
		}
	})
}
