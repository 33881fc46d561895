// Package buildinfo names the build a binary is: the module version and the
// VCS revision the Go toolchain recorded. `oncekey version` prints it and the
// service's home page (GET /) shows it, so that both say the same thing.
package buildinfo

import "runtime/debug"

// Version is "oncekey VERSION revision REV [(modified)] of TIME, GOVERSION",
// or says what is missing (no revision under go run or outside the
// repository).
func Version() string {
	info, ok := debug.ReadBuildInfo()
	if !ok {
		return "oncekey (no build information)"
	}
	v := "oncekey " + info.Main.Version
	settings := map[string]string{}
	for _, s := range info.Settings {
		settings[s.Key] = s.Value
	}
	if rev := settings["vcs.revision"]; rev != "" {
		v += " revision " + rev
		if settings["vcs.modified"] == "true" {
			v += " (modified)"
		}
		if at := settings["vcs.time"]; at != "" {
			v += " of " + at
		}
	} else {
		v += " (no VCS revision: built by go run, or outside the repository)"
	}
	return v + ", " + info.GoVersion
}
