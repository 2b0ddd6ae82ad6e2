package main

import (
	"errors"
	"fmt"
	iofs "io/fs"
	"os"
)

// missingConfig words a router.yaml that is not there: which flag names it, and the sandbox
// that needs none. Any other error is returned as it is.
func missingConfig(path string, err error) error {
	if !errors.Is(err, iofs.ErrNotExist) {
		return err
	}
	if _, statErr := os.Stat(path); !errors.Is(statErr, iofs.ErrNotExist) {
		return err // router.yaml is there: what is missing is a file it names
	}
	return fmt.Errorf("%w: no configuration at %s: name the router's router.yaml with --config FILE (docs/configuration.md); for a first try, router dev starts a local sandbox that needs none", err, path)
}
