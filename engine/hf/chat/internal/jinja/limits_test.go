package jinja

import (
	"errors"
	"strings"
	"testing"
)

// TestLimitsStopRunawayTemplates checks that templates that would run for very long, print
// without bound, recurse without end or allocate huge values fail with a clear error.
func TestLimitsStopRunawayTemplates(t *testing.T) {
	tests := []struct {
		name, src, kind, msg string
	}{
		{"steps", "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}", "RuntimeError", "steps"},
		{"string repeat", "{{ 'x' * 1000000000 }}", "RuntimeError", "too large"},
		{"output", "{% set s = 'x' * 40000000 %}{{ s }}{{ s }}", "RuntimeError", "exceeds"},
		{"recursion", "{% macro m() %}{{ m() }}{% endmacro %}{{ m() }}", "RecursionError", "depth"},
		{"range", "{{ range(1000000) | length }}", "OverflowError", "MAX_RANGE"},
		{"list repeat", "{{ ([1] * 100000000) | length }}", "RuntimeError", "too large"},
	}
	saved := maxSteps
	maxSteps = 200_000
	defer func() { maxSteps = saved }()
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tmpl, err := Compile(tt.src)
			if err != nil {
				t.Fatal(err)
			}
			_, _, err = tmpl.Render(nil)
			var e *Error
			if !errors.As(err, &e) || e.Kind != tt.kind || !strings.Contains(e.Msg, tt.msg) {
				t.Fatalf("got %v, want %s mentioning %q", err, tt.kind, tt.msg)
			}
		})
	}
}

// TestSyntaxErrorsNameTheLine checks that unparsable templates fail at compile time with the
// line of the problem.
func TestSyntaxErrorsNameTheLine(t *testing.T) {
	tests := []struct {
		src  string
		line int
		msg  string
	}{
		{"a\n{% if x %}\nb", 3, "unexpected end of template"},
		{"{{ x", 1, "not closed"},
		{"line1\n{% endfor %}", 2, "unexpected 'endfor'"},
		{"{% for x in %}{% endfor %}", 1, "expected an expression"},
		{"\n\n{% include 'x' %}", 3, "not supported"},
		{"{{ 'abc }}", 1, "not closed"},
		{"{% frobnicate %}", 1, "unknown statement"},
		{"{# never closed", 1, "comment is not closed"},
	}
	for _, tt := range tests {
		_, err := Compile(tt.src)
		var se *SyntaxError
		if !errors.As(err, &se) || se.Line != tt.line || !strings.Contains(se.Msg, tt.msg) {
			t.Errorf("Compile(%q) = %v; want a syntax error at line %d mentioning %q", tt.src, err, tt.line, tt.msg)
		}
	}
}
