package suggest

import (
	"strings"
	"testing"
)

func TestDistance(t *testing.T) {
	for _, c := range []struct {
		a, b string
		want int
	}{
		{"", "", 0}, {"abc", "", 3}, {"", "ab", 2}, {"kitten", "sitting", 3},
		{"learnig_rate", "learning_rate", 1}, {"same", "same", 0}, {"ab", "ba", 2},
	} {
		if got := Distance(c.a, c.b); got != c.want {
			t.Errorf("Distance(%q, %q) = %d, want %d", c.a, c.b, got, c.want)
		}
	}
}

func TestClosest(t *testing.T) {
	keys := []string{"learning_rate", "max_steps", "max_length", "HALO_CUDA_ATTENTION"}
	for _, c := range []struct{ s, want string }{
		{"learnig_rate", "learning_rate"},
		{"LEARNING_RATE", "learning_rate"},
		{"max_step", "max_steps"},
		{"HALO_CUDA_ATENTION", "HALO_CUDA_ATTENTION"},
		{"zzz", ""},
		{"completely_different_key", ""},
		{strings.Repeat("x", 1<<20), ""}, // a huge input is skipped, not measured
	} {
		if got := Closest(c.s, keys); got != c.want {
			t.Errorf("Closest(%.30q) = %q, want %q", c.s, got, c.want)
		}
	}
}
