// Package dockerfile reads a Dockerfile into its build stages and instructions, for the test
// that checks the repository's Dockerfile against what halo-shell loads at run time: no image
// can be built where the tests run, so the file itself is what is checked.
//
// It reads what that Dockerfile uses: ARG (global and per stage), FROM ... AS, COPY and ADD
// with their --flags, ENV, USER and RUN, line continuations and comments, and ${VAR} or $VAR
// in FROM from the ARG defaults. It is not a general Dockerfile parser (no heredocs, no
// escape directive).
package dockerfile

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"strings"
)

// File is a parsed Dockerfile.
type File struct {
	// Args are the ARG defaults declared before the first FROM.
	Args   map[string]string
	Stages []*Stage
}

// Stage is one FROM and the instructions after it.
type Stage struct {
	Name  string // the AS name, "" when none
	Image string // the base image, ARGs expanded
	Line  int
	Insts []Instruction
}

// Instruction is one instruction of a stage.
type Instruction struct {
	Cmd   string            // upper case: COPY, RUN, ...
	Args  string            // the rest of the line, continuations joined
	Flags map[string]string // --name=value flags of COPY and ADD
	Words []string          // the arguments after the flags (COPY: sources then destination)
	Line  int
}

// Load parses the Dockerfile at path.
func Load(path string) (*File, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("dockerfile: %w", err)
	}
	defer f.Close()
	df, err := Parse(f)
	if err != nil {
		return nil, fmt.Errorf("dockerfile: %s: %w", path, err)
	}
	return df, nil
}

// Parse reads a Dockerfile.
func Parse(r io.Reader) (*File, error) {
	df := &File{Args: map[string]string{}}
	sc := bufio.NewScanner(r)
	line, start := 0, 0
	var cur strings.Builder
	flush := func() error {
		text := strings.TrimSpace(cur.String())
		cur.Reset()
		if text == "" {
			return nil
		}
		cmd, rest, _ := strings.Cut(text, " ")
		return df.add(strings.ToUpper(cmd), strings.TrimSpace(rest), start)
	}
	for sc.Scan() {
		line++
		l := sc.Text()
		t := strings.TrimSpace(l)
		if strings.HasPrefix(t, "#") {
			continue // comments, and parser directives, which this reader ignores
		}
		if cur.Len() == 0 {
			if t == "" {
				continue
			}
			start = line
		}
		if strings.HasSuffix(t, "\\") {
			cur.WriteString(strings.TrimSuffix(t, "\\"))
			cur.WriteByte(' ')
			continue
		}
		cur.WriteString(t)
		if err := flush(); err != nil {
			return nil, err
		}
	}
	if err := sc.Err(); err != nil {
		return nil, err
	}
	if cur.Len() > 0 {
		return nil, fmt.Errorf("line %d: the last instruction ends with a line continuation", start)
	}
	if len(df.Stages) == 0 {
		return nil, fmt.Errorf("no FROM")
	}
	return df, nil
}

func (df *File) add(cmd, rest string, line int) error {
	if cmd == "FROM" {
		w := strings.Fields(rest)
		var flags []string
		for len(w) > 0 && strings.HasPrefix(w[0], "--") {
			flags, w = append(flags, w[0]), w[1:]
		}
		st := &Stage{Line: line}
		switch {
		case len(w) == 1:
		case len(w) == 3 && strings.EqualFold(w[1], "AS"):
			st.Name = w[2]
		default:
			return fmt.Errorf("line %d: FROM %s: want FROM IMAGE [AS NAME]", line, rest)
		}
		st.Image = df.expand(w[0])
		df.Stages = append(df.Stages, st)
		return nil
	}
	if len(df.Stages) == 0 {
		if cmd != "ARG" {
			return fmt.Errorf("line %d: %s before the first FROM", line, cmd)
		}
		name, def, _ := strings.Cut(rest, "=")
		df.Args[strings.TrimSpace(name)] = strings.Trim(strings.TrimSpace(def), `"`)
		return nil
	}
	in := Instruction{Cmd: cmd, Args: rest, Line: line}
	if cmd == "COPY" || cmd == "ADD" {
		words, err := copyWords(rest)
		if err != nil {
			return fmt.Errorf("line %d: %s: %w", line, cmd, err)
		}
		in.Flags = map[string]string{}
		for len(words) > 0 && strings.HasPrefix(words[0], "--") {
			k, v, _ := strings.Cut(strings.TrimPrefix(words[0], "--"), "=")
			in.Flags[k] = v
			words = words[1:]
		}
		if len(words) < 2 {
			return fmt.Errorf("line %d: %s %s: want sources and a destination", line, cmd, rest)
		}
		in.Words = words
	}
	st := df.Stages[len(df.Stages)-1]
	st.Insts = append(st.Insts, in)
	return nil
}

// copyWords splits COPY's arguments, in the shell form or the JSON-array form.
func copyWords(rest string) ([]string, error) {
	w := strings.Fields(rest)
	var flags []string
	for len(w) > 0 && strings.HasPrefix(w[0], "--") {
		flags, w = append(flags, w[0]), w[1:]
	}
	tail := strings.Join(w, " ")
	if strings.HasPrefix(tail, "[") {
		var arr []string
		if err := json.Unmarshal([]byte(tail), &arr); err != nil {
			return nil, fmt.Errorf("bad JSON array %s: %v", tail, err)
		}
		w = arr
	}
	return append(flags, w...), nil
}

// expand replaces $NAME and ${NAME} with the global ARG defaults.
func (df *File) expand(s string) string {
	return os.Expand(s, func(k string) string { return df.Args[k] })
}

// Stage returns the stage called name, or nil.
func (df *File) Stage(name string) *Stage {
	for _, s := range df.Stages {
		if s.Name == name {
			return s
		}
	}
	return nil
}

// Final is the last stage: the image the build produces.
func (df *File) Final() *Stage { return df.Stages[len(df.Stages)-1] }

// All returns the stage's instructions of command cmd (upper case), in order.
func (s *Stage) All(cmd string) []Instruction {
	var out []Instruction
	for _, in := range s.Insts {
		if in.Cmd == cmd {
			out = append(out, in)
		}
	}
	return out
}

// Arg returns the default of the stage's ARG name and whether the stage declares it.
func (s *Stage) Arg(name string) (string, bool) {
	for _, in := range s.All("ARG") {
		k, v, _ := strings.Cut(in.Args, "=")
		if strings.TrimSpace(k) == name {
			return strings.Trim(strings.TrimSpace(v), `"`), true
		}
	}
	return "", false
}

// Env returns the value the stage's ENV instructions give name ("" and false when none does).
func (s *Stage) Env(name string) (string, bool) {
	val, ok := "", false
	for _, in := range s.All("ENV") {
		if k, v, found := strings.Cut(in.Args, "="); found && !strings.Contains(k, " ") {
			// ENV K=V [K2=V2 ...]
			for _, kv := range strings.Fields(in.Args) {
				if k, v, _ = strings.Cut(kv, "="); k == name {
					val, ok = strings.Trim(v, `"`), true
				}
			}
			continue
		}
		// ENV K V
		if k, v, _ := strings.Cut(in.Args, " "); k == name {
			val, ok = strings.TrimSpace(v), true
		}
	}
	return val, ok
}

// User is the stage's last USER, "" when it sets none.
func (s *Stage) User() string {
	u := ""
	for _, in := range s.All("USER") {
		u = strings.TrimSpace(in.Args)
	}
	return u
}
