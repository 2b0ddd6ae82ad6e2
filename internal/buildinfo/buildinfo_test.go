package buildinfo

import (
	"runtime/debug"
	"testing"
)

// The link-time release wins; then the module version of `go install …@v1.2.3`; a build from a
// checkout is devel, with its revision when recorded.
func TestVersion(t *testing.T) {
	installed := &debug.BuildInfo{Main: debug.Module{Path: "github.com/shardgate/shardgate", Version: "v0.3.1"}}
	checkout := &debug.BuildInfo{Main: debug.Module{Version: "(devel)"}, Settings: []debug.BuildSetting{
		{Key: "vcs.revision", Value: "0123456789abcdef0123"}, {Key: "vcs.modified", Value: "true"},
	}}
	for _, tc := range []struct {
		release string
		info    *debug.BuildInfo
		want    string
	}{
		{"v1.2.3", installed, "v1.2.3"},
		{"", installed, "v0.3.1"},
		{"", checkout, "devel+0123456789ab-dirty"},
		{"", &debug.BuildInfo{Main: debug.Module{Version: "(devel)"}}, "devel"},
		{"", nil, "devel"},
	} {
		if got := version(tc.release, tc.info); got != tc.want {
			t.Errorf("version(%q, %+v) = %q, want %q", tc.release, tc.info, got, tc.want)
		}
	}
}

func TestValid(t *testing.T) {
	for v, want := range map[string]bool{
		"v0.1.0": true, "v1.22.333": true, "v0.2.0-rc.1": true, "v1.0.0+build.5": true,
		"0.1.0": false, "v1.2": false, "v1.2.3.4": false, "v01.2.3": false, "v1.2.3-": false, "vx.y.z": false, "": false,
	} {
		if got := Valid(v); got != want {
			t.Errorf("Valid(%q) = %t, want %t", v, got, want)
		}
	}
}
