// Package suggest finds the known name nearest to a mistyped one, for "did you mean" hints in
// the errors of router.yaml and shardmap.yaml.
package suggest

import (
	"slices"
	"strings"
)

// Nearest returns the name of names nearest to typed, within two edits (Levenshtein), ignoring
// case and reading '-' as '_'; the first in sorted order among equally near ones; "" when none
// is near.
func Nearest(typed string, names []string) string {
	sorted := slices.Sorted(slices.Values(names))
	norm := strings.ReplaceAll(strings.ToLower(typed), "-", "_")
	best, bestD := "", 3
	for _, name := range sorted {
		if d := Distance(norm, name); d < bestD {
			best, bestD = name, d
		}
	}
	return best
}

// Distance is the Levenshtein distance between a and b, in bytes.
func Distance(a, b string) int {
	prev := make([]int, len(b)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(a); i++ {
		cur := make([]int, len(b)+1)
		cur[0] = i
		for j := 1; j <= len(b); j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}
			cur[j] = min(prev[j]+1, cur[j-1]+1, prev[j-1]+cost)
		}
		prev = cur
	}
	return prev[len(b)]
}
