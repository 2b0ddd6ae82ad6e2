//go:build !unix

package main

// lockSandbox is a no-op where router dev cannot run its shards anyway.
func lockSandbox(string) (func(), error) { return func() {}, nil }
