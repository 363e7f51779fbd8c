package rendezvous

import (
	"fmt"
	"net"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/halo-shell/halo-shell/internal/switches"
)

// DefaultPort is the rendezvous port when the address comes from SLURM_JOB_NODELIST.
const DefaultPort = 29510

// Environment variables read by ResolveConfig besides SLURM's.
const (
	EnvToken     = "HALO_RENDEZVOUS_TOKEN"
	EnvTokenFile = "HALO_RENDEZVOUS_TOKEN_FILE"
	EnvAddr      = "HALO_RENDEZVOUS"
)

var (
	_ = switches.Register(switches.Switch{Name: EnvToken, Kind: switches.Path,
		Doc: "Shared secret of a multi-node rendezvous (prefer it or HALO_RENDEZVOUS_TOKEN_FILE to --rendezvous-token, which shows in ps)."})
	_ = switches.Register(switches.Switch{Name: EnvTokenFile, Kind: switches.Path,
		Doc: "File holding the multi-node rendezvous secret (trimmed of surrounding white space)."})
	_ = switches.Register(switches.Switch{Name: EnvAddr, Kind: switches.Path,
		Doc: "HOST:PORT of node 0's rendezvous (default: the first host of SLURM_JOB_NODELIST on port 29510)."})
)

// Flags are the command-line values; a zero value (NNodes 0, NodeRank -1, empty strings, zero
// Timeout) means "not given", so the environment or the default applies.
type Flags struct {
	NNodes     int
	NodeRank   int
	Rendezvous string // HOST:PORT of node 0
	Bind       string
	Token      string
	TokenFile  string
	Timeout    time.Duration
}

// UnsetFlags is Flags with nothing given.
func UnsetFlags() Flags { return Flags{NodeRank: -1} }

// ResolveConfig combines flags with the environment (getenv; os.Getenv when nil). Order, per
// value: the flag, then halo-shell's variable, then SLURM's:
//
//   - nodes: --nnodes, SLURM_NNODES, else 1;
//   - node rank: --node-rank, SLURM_NODEID, SLURM_PROCID (one task per node), else 0;
//   - address: --rendezvous, HALO_RENDEZVOUS, else the first host of SLURM_JOB_NODELIST on
//     DefaultPort;
//   - token: --rendezvous-token, --rendezvous-token-file, HALO_RENDEZVOUS_TOKEN,
//     HALO_RENDEZVOUS_TOKEN_FILE (a file's content is trimmed of surrounding white space).
//
// The result is validated (Config.Validate); errors name the flag or variable at fault.
func ResolveConfig(f Flags, getenv func(string) string) (Config, error) {
	if getenv == nil {
		getenv = os.Getenv
	}
	c := Config{NNodes: 1, Addr: f.Rendezvous, Bind: f.Bind, Timeout: f.Timeout}
	envInt := func(name string) (int, bool, error) {
		v := strings.TrimSpace(getenv(name))
		if v == "" {
			return 0, false, nil
		}
		n, err := strconv.Atoi(v)
		if err != nil || n < 0 {
			return 0, false, fmt.Errorf("rendezvous: %s=%q is not a non-negative integer", name, v)
		}
		return n, true, nil
	}
	switch {
	case f.NNodes > 0:
		c.NNodes = f.NNodes
	case f.NNodes < 0:
		return Config{}, fmt.Errorf("rendezvous: --nnodes %d: want 1 or more", f.NNodes)
	default:
		n, ok, err := envInt("SLURM_NNODES")
		if err != nil {
			return Config{}, err
		}
		if ok {
			c.NNodes = n
		}
	}
	if f.NodeRank >= 0 {
		c.NodeRank = f.NodeRank
	} else {
		for _, name := range []string{"SLURM_NODEID", "SLURM_PROCID"} {
			n, ok, err := envInt(name)
			if err != nil {
				return Config{}, err
			}
			if ok {
				c.NodeRank = n
				break
			}
		}
	}
	if c.Addr == "" {
		c.Addr = getenv(EnvAddr)
	}
	if c.Addr == "" && c.NNodes > 1 {
		if list := getenv("SLURM_JOB_NODELIST"); list != "" {
			h, err := FirstHost(list)
			if err != nil {
				return Config{}, fmt.Errorf("rendezvous: SLURM_JOB_NODELIST: %v; pass --rendezvous HOST:PORT", err)
			}
			c.Addr = net.JoinHostPort(h, strconv.Itoa(DefaultPort))
		}
	}
	if c.Addr == "" && c.NNodes > 1 {
		return Config{}, fmt.Errorf("rendezvous: %d nodes but no rendezvous address: pass --rendezvous HOST:PORT (node 0's address), set %s, or run under SLURM", c.NNodes, EnvAddr)
	}
	tok, err := resolveToken(f, getenv)
	if err != nil {
		return Config{}, err
	}
	c.Token = tok
	if err := c.Validate(); err != nil {
		return Config{}, err
	}
	return c, nil
}

func resolveToken(f Flags, getenv func(string) string) (string, error) {
	if f.Token != "" {
		return f.Token, nil
	}
	file, what := f.TokenFile, "--rendezvous-token-file"
	if file == "" {
		if t := getenv(EnvToken); t != "" {
			return t, nil
		}
		file, what = getenv(EnvTokenFile), EnvTokenFile
	}
	if file == "" {
		return "", nil
	}
	st, err := os.Stat(file)
	if err != nil {
		return "", fmt.Errorf("rendezvous: token file (%s) %v", what, err)
	}
	if st.Size() > 4096 {
		return "", fmt.Errorf("rendezvous: token file %s (%s) is %d bytes; a token is at most 4096", file, what, st.Size())
	}
	b, err := os.ReadFile(file)
	if err != nil {
		return "", fmt.Errorf("rendezvous: token file (%s): %v", what, err)
	}
	t := strings.TrimSpace(string(b))
	if t == "" {
		return "", fmt.Errorf("rendezvous: token file %s (%s) is empty", file, what)
	}
	return t, nil
}

// FirstHost returns the first host name of a SLURM node list such as "gpu[03-05,9],cpu1"
// (gpu03). Zero padding of the range's first number is kept.
func FirstHost(list string) (string, error) {
	list = strings.TrimSpace(list)
	if list == "" {
		return "", fmt.Errorf("empty node list")
	}
	// The first entry ends at a comma outside brackets.
	depth, end := 0, len(list)
	for i, r := range list {
		switch r {
		case '[':
			depth++
			if depth > 1 {
				return "", fmt.Errorf("node list %q: nested '[' at byte %d", list, i)
			}
		case ']':
			depth--
			if depth < 0 {
				return "", fmt.Errorf("node list %q: ']' without '[' at byte %d", list, i)
			}
		case ',':
			if depth == 0 && end == len(list) {
				end = i
			}
		}
	}
	if depth != 0 {
		return "", fmt.Errorf("node list %q: '[' not closed", list)
	}
	entry := list[:end]
	open := strings.IndexByte(entry, '[')
	if open < 0 {
		if err := checkHost(entry); err != nil {
			return "", fmt.Errorf("node list %q: %v", list, err)
		}
		return entry, nil
	}
	close := strings.IndexByte(entry, ']')
	prefix, ranges, suffix := entry[:open], entry[open+1:close], entry[close+1:]
	first := ranges
	if i := strings.IndexAny(first, ",-"); i >= 0 {
		first = first[:i]
	}
	if first == "" || strings.Trim(first, "0123456789") != "" {
		return "", fmt.Errorf("node list %q: range %q does not start with a number", list, ranges)
	}
	h := prefix + first + suffix
	if err := checkHost(h); err != nil {
		return "", fmt.Errorf("node list %q: %v", list, err)
	}
	return h, nil
}

func checkHost(h string) error {
	if h == "" {
		return fmt.Errorf("empty host name")
	}
	if len(h) > maxHost {
		return fmt.Errorf("host name of %d bytes is longer than %d", len(h), maxHost)
	}
	for i, r := range h {
		if !(r == '-' || r == '.' || r == '_' || r >= '0' && r <= '9' || r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z') {
			return fmt.Errorf("host name %q has %q at byte %d", h, r, i)
		}
	}
	return nil
}
