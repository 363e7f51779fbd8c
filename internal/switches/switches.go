// Package switches is the one list of halo-shell's environment switches: every HALO_*
// variable that changes what the program does (tuning and debugging switches, library and
// directory overrides, the plumbing between a process and the children it starts, and the
// switches of the test suites). A package that reads one declares it here with Register, at
// package level, with its default and a sentence of documentation, and reads it with Value.
//
// The declarations are also read statically: TestEveryNameIsRegistered scans the tree's Go
// sources, fails on a HALO_* name that is not registered or is read with os.Getenv, and keeps
// SWITCHES.md at the repository root (the documented list, with defaults) equal to the
// declarations (go test ./internal/switches -update rewrites it).
package switches

import (
	"fmt"
	"os"
	"regexp"
	"sort"
	"strings"
	"sync"

	"github.com/halo-shell/halo-shell/internal/suggest"
)

// Kind groups switches in the documentation.
type Kind int

const (
	// Tuning switches choose between implementations that compute the same result (or the
	// same within a stated tolerance); the default is the measured fastest.
	Tuning Kind = iota
	// Debug switches add logging or checks, or make asynchronous work synchronous.
	Debug
	// Path switches move a file or directory the program reads or writes, or name a shared
	// library to load.
	Path
	// Plumbing switches are set by halo-shell for processes it starts (test re-executions,
	// launched ranks, session helpers); a person does not set them.
	Plumbing
	// Testing switches change what the test suites do (fail instead of skip, write reports).
	Testing
	// Script switches are read by the shell and Python scripts under scripts/, not by the
	// program; they are declared so that the program knows them (no warning when a script's
	// caller sets one) and SWITCHES.md lists them.
	Script
)

var kindNames = [...]string{Tuning: "tuning", Debug: "debug", Path: "path", Plumbing: "plumbing", Testing: "testing", Script: "script"}

func (k Kind) String() string {
	if k >= 0 && int(k) < len(kindNames) {
		return kindNames[k]
	}
	return fmt.Sprintf("Kind(%d)", int(k))
}

// Switch is one environment variable.
type Switch struct {
	// Name is the variable, HALO_ and upper-case letters, digits and underscores.
	Name string
	// Default is what an unset (or empty) variable means, as Value returns it; "" when unset
	// means "off" or "none".
	Default string
	// Values lists the accepted values when the switch takes one of a few words; empty means
	// free-form (a number, a path). Check reports a value outside the list.
	Values []string
	// Kind places the switch in the documentation.
	Kind Kind
	// Doc says what the switch does, in one or two sentences.
	Doc string
}

var (
	mu       sync.Mutex
	registry = map[string]*Switch{}
	nameRE   = regexp.MustCompile(`^HALO_[A-Z0-9_]+$`)
)

// Register declares a switch and returns it. It panics on an invalid or repeated name, or a
// default outside Values: those are mistakes in the program, found by any test of the package.
func Register(s Switch) *Switch {
	if !nameRE.MatchString(s.Name) {
		panic(fmt.Sprintf("switches: invalid name %q (want HALO_ and upper-case letters, digits, underscores)", s.Name))
	}
	if s.Doc == "" {
		panic(fmt.Sprintf("switches: %s has no documentation", s.Name))
	}
	if s.Default != "" && len(s.Values) > 0 && !contains(s.Values, s.Default) {
		panic(fmt.Sprintf("switches: %s: default %q is not one of %v", s.Name, s.Default, s.Values))
	}
	mu.Lock()
	defer mu.Unlock()
	if _, dup := registry[s.Name]; dup {
		panic(fmt.Sprintf("switches: %s registered twice", s.Name))
	}
	p := &s
	registry[s.Name] = p
	return p
}

// Lookup returns the variable's value and whether it is set to something non-empty.
func (s *Switch) Lookup() (string, bool) {
	v := os.Getenv(s.Name)
	return v, v != ""
}

// Value returns the variable's value, or Default when it is unset or empty.
func (s *Switch) Value() string {
	if v, ok := s.Lookup(); ok {
		return v
	}
	return s.Default
}

// Is reports whether Value equals v.
func (s *Switch) Is(v string) bool { return s.Value() == v }

// On reports whether the switch is set to a true value: 1, true, yes or on (any case).
func (s *Switch) On() bool {
	switch strings.ToLower(s.Value()) {
	case "1", "true", "yes", "on":
		return true
	}
	return false
}

// Check returns an error when the variable is set to a value outside Values.
func (s *Switch) Check() error {
	v, ok := s.Lookup()
	if !ok || len(s.Values) == 0 || contains(s.Values, v) {
		return nil
	}
	return fmt.Errorf("switches: %s=%q is not one of %s (unset it for the default %q)", s.Name, v, strings.Join(s.Values, ", "), s.Default)
}

// All returns a copy of every switch registered in this program, sorted by name.
func All() []Switch {
	mu.Lock()
	defer mu.Unlock()
	out := make([]Switch, 0, len(registry))
	for _, s := range registry {
		out = append(out, *s)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out
}

// Problems lists what is wrong with the HALO_* variables of environ (os.Environ's form): a
// registered switch with a value outside its list, and a HALO_* variable that no switch of
// this program declares, with the closest known name. A program calls it once at start and
// warns; nothing is refused, since a variable may belong to another version of halo-shell.
func Problems(environ []string) []string {
	all := All()
	known := make(map[string]*Switch, len(all))
	names := make([]string, len(all))
	for i := range all {
		known[all[i].Name] = &all[i]
		names[i] = all[i].Name
	}
	var out []string
	for _, kv := range environ {
		name, val, _ := strings.Cut(kv, "=")
		if !strings.HasPrefix(name, "HALO_") {
			continue
		}
		s, ok := known[name]
		if !ok {
			msg := fmt.Sprintf("%s is not a halo-shell switch", name)
			if near := suggest.Closest(name, names); near != "" {
				msg += fmt.Sprintf(" (did you mean %s?)", near)
			}
			out = append(out, msg+"; SWITCHES.md lists them")
			continue
		}
		if val != "" && len(s.Values) > 0 && !contains(s.Values, val) {
			out = append(out, fmt.Sprintf("%s=%q is not one of %s; the default %q applies only when it is unset", name, val, strings.Join(s.Values, ", "), s.Default))
		}
	}
	sort.Strings(out)
	return out
}

func contains(list []string, v string) bool {
	for _, x := range list {
		if x == v {
			return true
		}
	}
	return false
}
