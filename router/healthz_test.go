package router

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/shardgate/shardgate/internal/buildinfo"
)

// /healthz answers with the version the binary reports (`router version`, the image's labels).
func TestHealthzReportsVersion(t *testing.T) {
	defer func(r string) { buildinfo.Release = r }(buildinfo.Release)
	buildinfo.Release = "v9.8.7"
	s := offlineServer(t, offlineYAML)
	rec := httptest.NewRecorder()
	s.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/healthz", nil))
	var body struct{ Status, Version string }
	if err := json.Unmarshal(rec.Body.Bytes(), &body); err != nil || rec.Code != http.StatusOK {
		t.Fatalf("GET /healthz: %d %q (%v)", rec.Code, rec.Body, err)
	}
	if body.Status != "ok" || body.Version != "v9.8.7" {
		t.Errorf("GET /healthz = %+v, want status ok and version v9.8.7", body)
	}
}
