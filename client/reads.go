package client

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/url"
)

// GetTransfer returns the transfer with the given id (the last segment of a receipt's
// Location). A transfer of another client, or none, is a [*Problem] with status 404. Reads are
// retried like transfers; when retrying stops the error wraps the last failure.
func (c *Client) GetTransfer(ctx context.Context, id string) (*TransferRecord, error) {
	if id == "" {
		return nil, errors.New("shardgate: GetTransfer needs a transfer id, as returned in a receipt's Location")
	}
	var rec TransferRecord
	if err := c.getJSON(ctx, "/transfers/"+url.PathEscape(id), &rec); err != nil {
		return nil, err
	}
	return &rec, nil
}

// getJSON reads path, retrying, and decodes its 200 answer into v.
func (c *Client) getJSON(ctx context.Context, path string, v any) error {
	rep, err := c.do(ctx, call{method: http.MethodGet, path: path, answers: []int{http.StatusOK}})
	if err != nil {
		return err
	}
	if err := json.Unmarshal(rep.body, v); err != nil {
		return fmt.Errorf("shardgate: decoding the answer to GET %s: %w", path, err)
	}
	return nil
}

// Healthz reports whether the router process is alive (GET /healthz). It makes one attempt.
func (c *Client) Healthz(ctx context.Context) error {
	_, err := c.do(ctx, call{method: http.MethodGet, path: "/healthz", answers: []int{http.StatusOK}, once: true})
	return err
}

// Readiness is the answer of GET /readyz.
type Readiness struct {
	// Ready is true when the router answered 200.
	Ready           bool              `json:"-"`
	ShardMapVersion int64             `json:"shardmap_version"`
	Shards          map[string]string `json:"shards"` // shard name → "ok" or "unreachable"
}

// Readyz asks whether the router is ready (GET /readyz): its map is loaded and every shard
// answers — or, with partial, at least one. A router that is not ready is not an error: it is a
// Readiness with Ready false. It makes one attempt.
func (c *Client) Readyz(ctx context.Context, partial bool) (*Readiness, error) {
	path := "/readyz"
	if partial {
		path += "?partial=1"
	}
	rep, err := c.do(ctx, call{method: http.MethodGet, path: path, answers: []int{http.StatusOK, http.StatusServiceUnavailable}, once: true})
	if err != nil {
		return nil, err
	}
	r := &Readiness{Ready: rep.status == http.StatusOK}
	if err := json.Unmarshal(rep.body, r); err != nil {
		return nil, fmt.Errorf("shardgate: decoding the answer to GET %s (%d): %w", path, rep.status, err)
	}
	return r, nil
}
