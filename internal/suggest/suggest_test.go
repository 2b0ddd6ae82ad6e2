package suggest

import "testing"

func TestNearest(t *testing.T) {
	names := []string{"in_flight", "max_batch", "max_wait", "version", "shards"}
	for _, c := range []struct{ typed, want string }{
		{"in_fligth", "in_flight"},
		{"In-Flight", "in_flight"},
		{"max_wiat", "max_wait"},
		{"verison", "version"},
		{"shard", "shards"},
		{"retention", ""},
		{"", ""},
	} {
		if got := Nearest(c.typed, names); got != c.want {
			t.Errorf("Nearest(%q) = %q, want %q", c.typed, got, c.want)
		}
	}
}

func TestDistance(t *testing.T) {
	for _, c := range []struct {
		a, b string
		want int
	}{{"", "", 0}, {"abc", "", 3}, {"kitten", "sitting", 3}, {"flaw", "lawn", 2}, {"same", "same", 0}} {
		if got := Distance(c.a, c.b); got != c.want {
			t.Errorf("Distance(%q, %q) = %d, want %d", c.a, c.b, got, c.want)
		}
	}
}
