package kernel

import (
	"regexp"
	"strings"

	"github.com/halo-shell/halo-shell/kernel/internal/wire"
)

// historyEntry is one stored cell of this kernel's session (session number 1 is this kernel
// process; earlier processes' history is not kept).
type historyEntry struct {
	line   int
	input  string
	output string
}

// historySession is the session number this kernel reports for its own history.
const historySession = 1

type historyRequest struct {
	Output         bool   `json:"output"`
	Raw            bool   `json:"raw"`
	HistAccessType string `json:"hist_access_type"`
	Session        int    `json:"session"`
	Start          int    `json:"start"`
	Stop           int    `json:"stop"`
	N              int    `json:"n"`
	Pattern        string `json:"pattern"`
	Unique         bool   `json:"unique"`
}

func (k *Kernel) historyRequest(m *wire.Message) result {
	var req historyRequest
	if err := decode(m, &req); err != nil {
		return result{content: errorReply(err)}
	}
	var sel []historyEntry
	switch req.HistAccessType {
	case "tail":
		sel = tail(k.history, req.N)
	case "range":
		// Session 0 or negative counts back from the current one; only this kernel's is kept.
		if req.Session <= 0 || req.Session == historySession {
			stop := req.Stop
			if stop <= 0 {
				stop = k.execCount + 1
			}
			for _, e := range k.history {
				if e.line >= req.Start && e.line < stop {
					sel = append(sel, e)
				}
			}
		}
	case "search":
		pat := req.Pattern
		if pat == "" {
			pat = "*"
		}
		re := globRegexp(pat)
		seen := map[string]bool{}
		for i := len(k.history) - 1; i >= 0; i-- {
			e := k.history[i]
			if !re.MatchString(e.input) {
				continue
			}
			if req.Unique {
				if seen[e.input] {
					continue
				}
				seen[e.input] = true
			}
			sel = append([]historyEntry{e}, sel...)
		}
		sel = tail(sel, req.N)
	default:
		return result{content: errorReply(&Error{Name: "ValueError",
			Value: "history_request: hist_access_type " + req.HistAccessType + " is not one of tail, range, search"})}
	}
	items := make([]any, 0, len(sel))
	for _, e := range sel {
		var v any = e.input
		if req.Output {
			v = []any{e.input, nilIfEmpty(e.output)}
		}
		items = append(items, []any{historySession, e.line, v})
	}
	return ok(map[string]any{"history": items})
}

// globRegexp compiles a history search pattern: a glob over the whole input (as IPython's
// history search), where * matches any text including newlines and ? one character.
func globRegexp(pat string) *regexp.Regexp {
	var b strings.Builder
	b.WriteString("(?s)^")
	for _, r := range pat {
		switch r {
		case '*':
			b.WriteString(".*")
		case '?':
			b.WriteString(".")
		default:
			b.WriteString(regexp.QuoteMeta(string(r)))
		}
	}
	b.WriteString("$")
	return regexp.MustCompile(b.String())
}

func nilIfEmpty(s string) any {
	if s == "" {
		return nil
	}
	return s
}

func tail(h []historyEntry, n int) []historyEntry {
	if n > 0 && len(h) > n {
		return h[len(h)-n:]
	}
	return h
}
