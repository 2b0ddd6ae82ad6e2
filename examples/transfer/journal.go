package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"runtime"
	"time"

	"github.com/shardgate/shardgate/client"
)

// The states of an operation. Only pending operations are ever sent.
const (
	statePending  = "pending"  // not answered yet, or its outcome is unknown: send it again
	stateApplied  = "applied"  // the router applied it (now or earlier: replayed)
	stateRejected = "rejected" // the router refused it for good; nothing was applied
	stateExpired  = "expired"  // its key outlived the router's retention: reconcile by hand
)

// operation is one transfer the user asked for, with its key, and what became of it.
type operation struct {
	Transfer   client.Transfer `json:"transfer"`
	State      string          `json:"state"`
	CreatedAt  time.Time       `json:"created_at"`
	Sends      int             `json:"sends"` // Send calls made, over every run
	TransferID string          `json:"transfer_id,omitempty"`
	Replayed   bool            `json:"replayed,omitempty"`
	LastError  string          `json:"last_error,omitempty"`
}

// journal is the state file: every operation, rewritten whole and atomically on each change.
// One process at a time may use a state file.
type journal struct {
	path       string
	Operations []*operation `json:"operations"`
}

// openJournal reads the journal at path; a missing file is an empty journal.
func openJournal(path string) (*journal, error) {
	j := &journal{path: path}
	b, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		return j, nil
	}
	if err != nil {
		return nil, err
	}
	if err := json.Unmarshal(b, j); err != nil {
		return nil, fmt.Errorf("state file %s is not a transfer journal: %w", path, err)
	}
	return j, nil
}

// pending returns the operations still to send, oldest first.
func (j *journal) pending() []*operation {
	var out []*operation
	for _, op := range j.Operations {
		if op.State == statePending {
			out = append(out, op)
		}
	}
	return out
}

// save makes the journal durable: it writes a temporary file next to the state file, syncs
// it, renames it over the state file and syncs the directory, so that a crash at any point
// leaves either the old journal or the new one, never a mix.
func (j *journal) save() error {
	b, err := json.MarshalIndent(j, "", "  ")
	if err != nil {
		return err
	}
	dir := filepath.Dir(j.path)
	tmp, err := os.CreateTemp(dir, "."+filepath.Base(j.path)+".*")
	if err != nil {
		return err
	}
	defer os.Remove(tmp.Name()) // after a successful rename there is nothing left to remove
	_, err = tmp.Write(append(b, '\n'))
	if err == nil {
		err = tmp.Sync()
	}
	if cerr := tmp.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp.Name(), j.path)
	}
	if err == nil {
		err = syncDir(dir)
	}
	if err != nil {
		return fmt.Errorf("saving state file %s: %w", j.path, err)
	}
	return nil
}

// syncDir makes a rename in dir durable. Windows cannot sync a directory, and makes renames
// durable by itself.
func syncDir(dir string) error {
	if runtime.GOOS == "windows" {
		return nil
	}
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	return d.Sync()
}
