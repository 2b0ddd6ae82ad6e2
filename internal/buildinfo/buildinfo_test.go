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
