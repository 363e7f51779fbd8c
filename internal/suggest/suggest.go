// Package suggest finds the known name closest to a mistyped one, for the "did you mean"
// part of an error message (YAML keys, config.json keys, choices, environment switches).
package suggest

import "strings"

// Closest returns the candidate nearest to s by edit distance, compared without regard to
// case, or "" when none is within max(2, len(s)/3) edits. A candidate whose length differs
// from s's by more than that is skipped unmeasured, so a huge s costs nothing.
func Closest(s string, candidates []string) string {
	limit := max(2, len(s)/3)
	best, bestD := "", limit+1
	ls := strings.ToLower(s)
	for _, c := range candidates {
		if len(c)-len(s) > limit || len(s)-len(c) > limit {
			continue
		}
		if d := Distance(ls, strings.ToLower(c)); d < bestD {
			best, bestD = c, d
		}
	}
	return best
}

// Distance is the Levenshtein distance between a and b in bytes: the fewest insertions,
// deletions and substitutions that turn one into the other.
func Distance(a, b string) int {
	prev := make([]int, len(b)+1)
	cur := make([]int, len(b)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(a); i++ {
		cur[0] = i
		for j := 1; j <= len(b); j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}
			cur[j] = min(prev[j]+1, cur[j-1]+1, prev[j-1]+cost)
		}
		prev, cur = cur, prev
	}
	return prev[len(b)]
}
