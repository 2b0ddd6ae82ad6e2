// Package api holds shardgate's HTTP API description, openapi.yaml (OpenAPI 3.1): every
// operation, header, status and problem type, and the idempotency policy of POST /transfers.
// The router serves it at GET /openapi.yaml; tests validate responses against it.
package api

import (
	"bytes"
	_ "embed"
	"net/http"
	"strconv"
)

//go:embed openapi.yaml
var document []byte

// OpenAPI returns the OpenAPI 3.1 document, as YAML. The slice is the caller's own.
func OpenAPI() []byte { return bytes.Clone(document) }

// Handler serves the document, for GET /openapi.yaml.
func Handler() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		h := w.Header()
		h.Set("Content-Type", "application/yaml")
		h.Set("Content-Length", strconv.Itoa(len(document)))
		if r.Method != http.MethodHead {
			w.Write(document) //nolint:errcheck // the client went away
		}
	})
}
