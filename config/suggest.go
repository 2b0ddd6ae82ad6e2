package config

import (
	"fmt"
	"maps"
	"slices"

	"github.com/shardgate/shardgate/internal/suggest"
)

// didYouMean words the key of fields nearest to a mistyped key (within two edits, ignoring
// case, '-' for '_'), as "; did you mean in_flight?", or "" when none is near.
func didYouMean[T any](key string, fields map[string]T) string {
	best := suggest.Nearest(key, slices.Collect(maps.Keys(fields)))
	if best == "" {
		return ""
	}
	return fmt.Sprintf("; did you mean %s?", best)
}
