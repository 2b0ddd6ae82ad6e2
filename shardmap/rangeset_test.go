package shardmap

import "testing"

func ranges(t *testing.T, specs ...string) []KeyRange {
	t.Helper()
	var rs []KeyRange
	for _, s := range specs {
		r, err := ParseKeyRange(s)
		if err != nil {
			t.Fatal(err)
		}
		rs = append(rs, r)
	}
	return SortRanges(rs)
}

func TestCovers(t *testing.T) {
	tests := []struct {
		set  []string
		r    string
		want bool
	}{
		{[]string{"-"}, "40-80", true},
		{[]string{"-40", "40-80"}, "20-60", true},
		{[]string{"-40", "50-80"}, "20-60", false},
		{[]string{"80-", "-80"}, "-", true},
		{[]string{"-80"}, "-", false},
		{[]string{"c0-"}, "d0-", true},
		{nil, "-80", false},
	}
	for _, tt := range tests {
		if got := Covers(ranges(t, tt.set...), ranges(t, tt.r)[0]); got != tt.want {
			t.Errorf("Covers(%v, %s) = %t, want %t", tt.set, tt.r, got, tt.want)
		}
	}
	if !CoversAll(ranges(t, "-"), ranges(t, "-40", "c0-")) || CoversAll(ranges(t, "-80"), ranges(t, "-40", "c0-")) {
		t.Error("CoversAll")
	}
}

func TestSameRanges(t *testing.T) {
	if !SameRanges(ranges(t, "-80", "80-"), ranges(t, "80-", "-80")) || SameRanges(ranges(t, "-80"), ranges(t, "-40")) ||
		SameRanges(ranges(t, "-80"), nil) {
		t.Error("SameRanges")
	}
}
