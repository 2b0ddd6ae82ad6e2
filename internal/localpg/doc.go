// Package localpg starts and controls real local PostgreSQL servers, for
// `router dev` and for integration tests that stop, crash or hang a shard.
//
// Each server is a postmaster started directly from the installed server
// binaries (see BinDir) as a child of this process, so Stop, Kill and Pause
// act on a process we own and its exit is observed, not guessed. When this
// process runs as root, initdb and postgres run as the postgres user (or
// nobody), because PostgreSQL refuses to run as root.
//
// Servers don't outlive a process that dies without calling Close: each
// postmaster gets SIGQUIT (immediate shutdown) from the kernel when this
// process exits, and while a server is paused a small watchdog process
// un-stops it so that it can act on that signal. Postmasters run in their
// own process group, so a terminal's Ctrl-C reaches only this process, which
// decides how to shut its servers down.
//
// It needs Linux (parent-death signals, /proc): on other systems the package is empty, and
// `router dev` says so.
package localpg
