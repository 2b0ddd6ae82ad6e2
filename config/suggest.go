package config

import (
	"fmt"
	"sort"
	"strings"
)

// didYouMean words the key of fields nearest to a mistyped key (within two edits, ignoring
// case, '-' for '_'), as "; did you mean in_flight?", or "" when none is near.
func didYouMean[T any](key string, fields map[string]T) string {
	names := make([]string, 0, len(fields))
	for name := range fields {
		names = append(names, name)
	}
	sort.Strings(names)
	norm := strings.ReplaceAll(strings.ToLower(key), "-", "_")
	best, bestD := "", 3
	for _, name := range names {
		if d := editDistance(norm, name); d < bestD {
			best, bestD = name, d
		}
	}
	if best == "" {
		return ""
	}
	return fmt.Sprintf("; did you mean %s?", best)
}

// editDistance is the Levenshtein distance between a and b.
func editDistance(a, b string) int {
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
