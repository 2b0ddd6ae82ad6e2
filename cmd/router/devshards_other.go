//go:build !linux

package main

import (
	"context"
	"errors"
	"io"
)

// startDevShards needs Linux: the local shards are PostgreSQL processes tied to this one by
// Linux's parent-death signal, so a crashed sandbox never leaves servers behind.
func startDevShards(context.Context, int, string, bool, io.Writer) ([]string, func(), error) {
	return nil, nil, errors.New("dev: the local sandbox needs Linux; elsewhere run shards yourself (or with deploy/compose) and use `router migrate` and `router serve`")
}
