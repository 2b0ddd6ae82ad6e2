package api

import (
	"context"
	"net/http"
	"net/http/httptest"
	"os"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/getkin/kin-openapi/openapi3"
)

const problemBase = "https://shardgate.dev/problems/"

func loadDoc(t *testing.T) *openapi3.T {
	t.Helper()
	doc, err := load(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	return doc
}

func TestDocumentIsValidOpenAPI31(t *testing.T) {
	doc := loadDoc(t)
	if doc.OpenAPI != "3.1.0" {
		t.Errorf("openapi: %s, want 3.1.0", doc.OpenAPI)
	}
	// The document describes the API that exists: every operation the router serves, and
	// nothing it does not serve yet.
	served := serverRoutes(t)
	for op := range served {
		method, path, _ := strings.Cut(op, " ")
		if item := doc.Paths.Find(path); item == nil || item.GetOperation(method) == nil {
			t.Errorf("%s is served by the router but not documented", op)
		}
	}
	for path, item := range doc.Paths.Map() {
		for method := range item.Operations() {
			if op := method + " " + path; !served[op] {
				t.Errorf("%s is documented but the router does not serve it", op)
			}
		}
	}
	if _, ok := doc.Components.Schemas["Transfer"].Value.Properties["status"]; ok {
		t.Error("Transfer documents status, which the router does not send yet")
	}
}

// routePattern matches a route the router registers on a mux, e.g.
// s.mux.HandleFunc("GET /transfers/{id}", s.getTransfer).
var routePattern = regexp.MustCompile(`\.Handle(?:Func)?\("([A-Z]+) (/[^"]*)"`)

// serverRoutes reads the operations the router serves ("GET /transfers/{id}") from its source,
// as serverProblems reads its problem table. A pattern ending in "/" only hands a subtree to
// the admin mux, whose own routes are read too.
func serverRoutes(t *testing.T) map[string]bool {
	t.Helper()
	src, err := os.ReadFile("../router/server.go")
	if err != nil {
		t.Fatalf("reading the router's routes: %v", err)
	}
	out := map[string]bool{}
	for _, m := range routePattern.FindAllStringSubmatch(string(src), -1) {
		if !strings.HasSuffix(m[2], "/") {
			out[m[1]+" "+m[2]] = true
		}
	}
	for _, op := range []string{"POST /transfers", "GET /transfers/{id}", "GET /metrics"} {
		if !out[op] {
			t.Fatalf("%s not found among the routes of router/server.go (%v); has the registration's form changed? Update routePattern", op, out)
		}
	}
	return out
}

// serverProblem is one row of the router's problem table.
type serverProblem struct {
	slug, title string
	status      int
}

// problemRow matches a row of router/problem.go's table, e.g.
// probNotFound = problemType{"transfer-not-found", http.StatusNotFound, "No such transfer"}.
var problemRow = regexp.MustCompile(`problemType\{"([a-z0-9-]+)",\s*http\.(Status\w+),\s*"((?:[^"\\]|\\.)*)"\}`)

// serverProblems reads the router's problem table from its source, so that the document
// cannot drift from it.
func serverProblems(t *testing.T) []serverProblem {
	t.Helper()
	src, err := os.ReadFile("../router/problem.go")
	if err != nil {
		t.Fatalf("reading the router's problem table: %v", err)
	}
	statusByName := map[string]int{}
	for code := 100; code < 600; code++ {
		name := "Status" + strings.Map(func(r rune) rune {
			if r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' {
				return r
			}
			return -1
		}, http.StatusText(code))
		statusByName[name] = code
	}
	var out []serverProblem
	for _, m := range problemRow.FindAllStringSubmatch(string(src), -1) {
		status, ok := statusByName[m[2]]
		if !ok {
			t.Fatalf("router/problem.go: status http.%s of %q is not known to this test; add it", m[2], m[1])
		}
		out = append(out, serverProblem{slug: m[1], status: status, title: m[3]})
	}
	if len(out) < 10 {
		t.Fatalf("found %d problem types in router/problem.go; has the table's format changed? Update problemRow", len(out))
	}
	return out
}

// docProblems returns x-problem-types by slug.
func docProblems(t *testing.T, doc *openapi3.T) map[string]map[string]any {
	t.Helper()
	list, ok := doc.Extensions["x-problem-types"].([]any)
	if !ok {
		t.Fatalf("x-problem-types is missing or not a list: %T", doc.Extensions["x-problem-types"])
	}
	out := map[string]map[string]any{}
	for _, e := range list {
		row, _ := e.(map[string]any)
		slug, _ := row["slug"].(string)
		if _, dup := out[slug]; dup || slug == "" {
			t.Errorf("x-problem-types: slug %q is empty or listed twice", slug)
		}
		out[slug] = row
	}
	return out
}

func TestEveryProblemTypeIsDocumented(t *testing.T) {
	doc := loadDoc(t)
	documented := docProblems(t, doc)
	problemSchema := doc.Components.Schemas["Problem"].Value
	enum := problemSchema.Properties["type"].Value.Enum
	inResponses := responseProblemTypes(doc)
	server := map[string]bool{}
	for _, p := range serverProblems(t) {
		server[p.slug] = true
		uri := problemBase + p.slug
		row := documented[p.slug]
		switch {
		case row == nil:
			t.Errorf("%s: not in x-problem-types", p.slug)
		case row["type"] != uri || toInt(row["status"]) != p.status || row["title"] != p.title:
			t.Errorf("%s: x-problem-types says type %v, status %v, title %q; the router sends %s, %d, %q",
				p.slug, row["type"], row["status"], row["title"], uri, p.status, p.title)
		case row["meaning"] == nil || len(row["meaning"].(string)) < 20:
			t.Errorf("%s: x-problem-types has no meaning", p.slug)
		}
		if !slices.Contains(enum, any(uri)) {
			t.Errorf("%s: not in the Problem schema's type enum", p.slug)
		}
		if !strings.Contains(problemSchema.Description, "| "+p.slug+" | "+strconv.Itoa(p.status)+" |") {
			t.Errorf("%s: not in the Problem schema's table with status %d", p.slug, p.status)
		}
		if !inResponses[uri] {
			t.Errorf("%s: no operation's response lists it", p.slug)
		}
	}
	for slug := range documented {
		if !server[slug] {
			t.Errorf("x-problem-types lists %q, which the router does not send", slug)
		}
	}
	for _, uri := range append(enum, mapKeys(inResponses)...) {
		if !server[strings.TrimPrefix(uri.(string), problemBase)] {
			t.Errorf("the document names problem type %v, which the router does not send", uri)
		}
	}
}

// responseProblemTypes collects the problem types each operation's problem responses allow
// (the enum or const of "type" in the allOf that narrows Problem).
func responseProblemTypes(doc *openapi3.T) map[string]bool {
	out := map[string]bool{}
	for _, item := range doc.Paths.Map() {
		for _, op := range item.Operations() {
			for _, resp := range op.Responses.Map() {
				mt := resp.Value.Content.Get("application/problem+json")
				if mt == nil {
					continue
				}
				for _, part := range mt.Schema.Value.AllOf {
					if typ := part.Value.Properties["type"]; typ != nil {
						for _, v := range append(slices.Clone(typ.Value.Enum), typ.Value.Const) {
							if s, ok := v.(string); ok {
								out[s] = true
							}
						}
					}
				}
			}
		}
	}
	return out
}

func TestIdempotencyPolicyIsPublished(t *testing.T) {
	key := loadDoc(t).Components.Parameters["IdempotencyKey"].Value
	if key.In != "header" || key.Name != "Idempotency-Key" || !key.Required {
		t.Fatalf("Idempotency-Key parameter: %+v", key)
	}
	for _, must := range []string{"draft-ietf-httpapi-idempotency-key-header", "1–255 visible ASCII", "sf-string", "720h",
		"SHA-256", "409", "422 `idempotency-key-reused`", "`idempotency-key-expired`", "Retry-After", "UUIDv7", "Uniqueness scope"} {
		if !strings.Contains(key.Description, must) {
			t.Errorf("the Idempotency-Key description does not mention %q", must)
		}
	}
	pattern := regexp.MustCompile(key.Schema.Value.Pattern)
	for header, want := range map[string]bool{
		"0196f1c2-7c1e-7abc-8def-0123456789ab":   true,
		`"0196f1c2-7c1e-7abc-8def-0123456789ab"`: true,
		`"a\"b\\c"`:                              true,
		strings.Repeat("k", 255):                 true,
		`"` + strings.Repeat("k", 255) + `"`:     true,
		`a"b`:                                    true, // a quote inside a bare key is just a character
		`abc;x=1`:                                true, // so is a semicolon
		`"abc";x=1`:                              true, // RFC 8941 parameters, ignored by the router
		`"abc";v;w=?0`:                           true,
		`"abc"; a="s p";b=-1.5;c=tok/x:y;d=:aGk=:`: true,
		`"abc";X=1`:                          false,
		`"abc";x=`:                           false,
		`"abc" ;x=1`:                         false,
		`"abc";x=1.2345`:                     false,
		strings.Repeat("k", 256):             false,
		`"` + strings.Repeat("k", 256) + `"`: false,
		"":                                   false,
		`""`:                                 false,
		`"abc`:                               false,
		`"a"b"`:                              false,
		`"a\nb"`:                             false,
		"has space":                          false,
		`"has space"`:                        false,
		"ключ":                               false,
	} {
		if got := pattern.MatchString(header); got != want {
			t.Errorf("pattern matches %q: %t, want %t", header, got, want)
		}
	}
}

func TestHandlerServesTheDocument(t *testing.T) {
	rec := httptest.NewRecorder()
	req := httptest.NewRequest(http.MethodGet, "/openapi.yaml", nil)
	Handler().ServeHTTP(rec, req)
	if rec.Code != http.StatusOK || rec.Header().Get("Content-Type") != "application/yaml" || rec.Body.String() != string(document) {
		t.Fatalf("%d %q, %d bytes", rec.Code, rec.Header().Get("Content-Type"), rec.Body.Len())
	}
	v, err := NewResponseValidator()
	if err != nil {
		t.Fatal(err)
	}
	if err := v.ValidateResponse(req, rec.Code, rec.Header(), rec.Body.Bytes()); err != nil {
		t.Error(err)
	}
	b := OpenAPI()
	b[0] = 'X'
	if document[0] == 'X' {
		t.Error("OpenAPI returned the embedded document itself")
	}
}

func toInt(v any) int {
	switch n := v.(type) {
	case int:
		return n
	case float64:
		return int(n)
	case uint64:
		return int(n)
	case int64:
		return int(n)
	}
	return -1
}

func mapKeys(m map[string]bool) []any {
	var out []any
	for k := range m {
		out = append(out, k)
	}
	return out
}
