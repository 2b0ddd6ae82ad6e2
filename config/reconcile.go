package config

import (
	"fmt"
	"time"
)

// Reconcile is the periodic check of the ledgers that `router serve` runs (package reconcile):
// one router of a fleet at a time checks the transfers debited in the last Window, every
// Interval, and exports what it found as metrics.
type Reconcile struct {
	Enabled  bool
	Interval time.Duration // between the end of one check and the start of the next
	Window   time.Duration // transfers debited this long before a check are checked
}

// reconcileFile is the reconcile section as router.yaml spells it.
type reconcileFile struct {
	Enabled  *bool     `yaml:"enabled"`
	Interval *duration `yaml:"interval"`
	Window   *duration `yaml:"window"`
}

func (f reconcileFile) withDefaults() Reconcile {
	return Reconcile{
		Enabled:  deref(f.Enabled, true),
		Interval: durOr(f.Interval, 5*time.Minute),
		Window:   durOr(f.Window, time.Hour),
	}
}

func (r Reconcile) validate() []string {
	var problems []string
	if r.Interval < 10*time.Second || r.Interval > 24*time.Hour {
		problems = append(problems, fmt.Sprintf("reconcile.interval: %s must be between 10s and 24h", r.Interval))
	}
	if r.Window < r.Interval {
		problems = append(problems, fmt.Sprintf("reconcile.window: %s must be at least reconcile.interval (%s), or a transfer could fall between two checks", r.Window, r.Interval))
	}
	return problems
}
