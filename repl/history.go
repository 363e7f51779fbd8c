package repl

import (
	"bufio"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"

	"github.com/halo-shell/halo-shell/internal/switches"
)

// MaxHistory is how many entries the history keeps.
const MaxHistory = 2000

var swHistory = switches.Register(switches.Switch{Name: "HALO_HISTORY", Kind: switches.Path,
	Doc: "File of the REPL's line history (default: $XDG_STATE_HOME/halo-shell/repl_history, else under the user cache directory)."})

// DefaultHistoryFile is $HALO_HISTORY when set, else the repl_history file under
// $XDG_STATE_HOME/halo-shell, else under the user's cache directory.
func DefaultHistoryFile() (string, error) {
	if p, ok := swHistory.Lookup(); ok {
		return p, nil
	}
	if d := os.Getenv("XDG_STATE_HOME"); d != "" {
		return filepath.Join(d, "halo-shell", "repl_history"), nil
	}
	d, err := os.UserCacheDir()
	if err != nil {
		return "", fmt.Errorf("repl: no directory for the history: set HALO_HISTORY or XDG_STATE_HOME (%v)", err)
	}
	return filepath.Join(d, "halo-shell", "repl_history"), nil
}

// History is the line history, kept in a file across runs (one entry per line, quoted when
// it holds a newline or leading quote). It implements golang.org/x/term's History.
type History struct {
	mu      sync.Mutex
	path    string
	entries []string // oldest first
}

// LoadHistory reads the history file at path (a missing file is an empty history). Lines
// that cannot be read back are skipped.
func LoadHistory(path string) (*History, error) {
	h := &History{path: path}
	if path == "" {
		return h, nil
	}
	f, err := os.Open(path)
	if os.IsNotExist(err) {
		return h, nil
	}
	if err != nil {
		return h, fmt.Errorf("repl: history %s: %w", path, err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if strings.HasPrefix(line, `"`) {
			s, err := strconv.Unquote(line)
			if err != nil {
				continue
			}
			line = s
		}
		if line != "" {
			h.entries = append(h.entries, line)
		}
	}
	if len(h.entries) > MaxHistory {
		h.entries = h.entries[len(h.entries)-MaxHistory:]
	}
	return h, nil
}

// Add records an entry (blank lines and repeats of the last entry are skipped) and appends
// it to the file. It rewrites the file when it has grown to twice MaxHistory.
func (h *History) Add(entry string) {
	if strings.TrimSpace(entry) == "" {
		return
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if n := len(h.entries); n > 0 && h.entries[n-1] == entry {
		return
	}
	h.entries = append(h.entries, entry)
	if len(h.entries) > MaxHistory {
		h.entries = h.entries[len(h.entries)-MaxHistory:]
	}
	if h.path == "" {
		return
	}
	if err := os.MkdirAll(filepath.Dir(h.path), 0o700); err != nil {
		return
	}
	if st, err := os.Stat(h.path); err == nil && st.Size() > int64(2*MaxHistory*80) {
		h.rewrite()
		return
	}
	f, err := os.OpenFile(h.path, os.O_CREATE|os.O_RDWR|os.O_APPEND, 0o600)
	if err != nil {
		return
	}
	defer f.Close()
	line := encodeEntry(entry) + "\n"
	if st, err := f.Stat(); err == nil && st.Size() > 0 {
		// A file that does not end in a newline would glue the entry to its last line.
		last := make([]byte, 1)
		if _, err := f.ReadAt(last, st.Size()-1); err == nil && last[0] != '\n' {
			line = "\n" + line
		}
	}
	f.WriteString(line)
}

func (h *History) rewrite() {
	tmp := h.path + ".tmp"
	var b strings.Builder
	for _, e := range h.entries {
		b.WriteString(encodeEntry(e) + "\n")
	}
	if err := os.WriteFile(tmp, []byte(b.String()), 0o600); err == nil {
		os.Rename(tmp, h.path)
	}
}

func encodeEntry(e string) string {
	if strings.ContainsAny(e, "\n\r") || strings.HasPrefix(e, `"`) {
		return strconv.Quote(e)
	}
	return e
}

// Len is the number of entries.
func (h *History) Len() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return len(h.entries)
}

// At returns an entry; 0 is the most recent.
func (h *History) At(i int) string {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.entries[len(h.entries)-1-i]
}

// Entries returns the entries, oldest first.
func (h *History) Entries() []string {
	h.mu.Lock()
	defer h.mu.Unlock()
	return append([]string(nil), h.entries...)
}
