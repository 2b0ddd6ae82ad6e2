package idem

import (
	"fmt"
	"testing"
)

// The parts of a moved range that no listed range covers are what a purge reads.
func TestUncovered(t *testing.T) {
	v := func(x int64) *int64 { return &x }
	r := func(lo int64, hi *int64) purgeRange { return purgeRange{lo: lo, hi: hi} }
	show := func(rs []purgeRange) string {
		out := ""
		for _, x := range rs {
			if x.hi == nil {
				out += fmt.Sprintf("[%d,∞)", x.lo)
			} else {
				out += fmt.Sprintf("[%d,%d)", x.lo, *x.hi)
			}
		}
		return out
	}
	for _, tc := range []struct {
		r    purgeRange
		held []purgeRange
		want string
	}{
		{r(0, v(100)), nil, "[0,100)"},
		{r(0, v(100)), []purgeRange{r(0, v(40))}, "[40,100)"},
		{r(0, nil), []purgeRange{r(0, v(40)), r(60, v(80))}, "[40,60)[80,∞)"},
		{r(0, v(100)), []purgeRange{r(-10, nil)}, ""},
		{r(10, v(20)), []purgeRange{r(30, v(40)), r(0, v(5))}, "[10,20)"},
	} {
		if got := show(uncovered(tc.r, tc.held)); got != tc.want {
			t.Errorf("uncovered(%s, %s) = %s, want %s", show([]purgeRange{tc.r}), show(tc.held), got, tc.want)
		}
	}
}
