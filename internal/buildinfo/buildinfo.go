// Package buildinfo says which version of shardgate is running: `router version`, the
// /healthz answer and the router image's labels all report Version.
package buildinfo

import "runtime/debug"

// Release is the version the binary was released as: the router command sets it from its
// link-time version (-ldflags "-X main.version=v1.2.3", which `make build` and the release
// script take from the git tag). Empty in a plain `go build`.
var Release string

// Version is Release when set; otherwise the module version Go recorded, which is the release
// for `go install github.com/shardgate/shardgate/cmd/router@v1.2.3`; otherwise "devel", with
// the VCS revision when the toolchain recorded one.
func Version() string {
	info, _ := debug.ReadBuildInfo()
	return version(Release, info)
}

func version(release string, info *debug.BuildInfo) string {
	if release != "" {
		return release
	}
	if info == nil {
		return "devel"
	}
	if v := info.Main.Version; v != "" && v != "(devel)" {
		return v
	}
	v := "devel"
	var rev, dirty string
	for _, s := range info.Settings {
		switch s.Key {
		case "vcs.revision":
			rev = s.Value
		case "vcs.modified":
			if s.Value == "true" {
				dirty = "-dirty"
			}
		}
	}
	if rev != "" {
		v += "+" + rev[:min(12, len(rev))] + dirty
	}
	return v
}

// GoVersion is the Go release the binary was built with.
func GoVersion() string {
	if info, ok := debug.ReadBuildInfo(); ok {
		return info.GoVersion
	}
	return "unknown"
}
