package api

import (
	"context"
	"fmt"
	"net/http"

	"github.com/getkin/kin-openapi/openapi3"
	"github.com/getkin/kin-openapi/openapi3filter"
	"github.com/getkin/kin-openapi/routers"
	"github.com/getkin/kin-openapi/routers/legacy"
)

// load parses the document and checks it against OpenAPI 3.1.
func load(ctx context.Context) (*openapi3.T, error) {
	doc, err := openapi3.NewLoader().LoadFromData(document)
	if err != nil {
		return nil, fmt.Errorf("api/openapi.yaml: %w", err)
	}
	if err := doc.Validate(ctx); err != nil {
		return nil, fmt.Errorf("api/openapi.yaml is not valid OpenAPI: %w", err)
	}
	return doc, nil
}

// Validator checks responses against the document.
type Validator struct {
	router routers.Router
}

// NewResponseValidator returns a Validator for the embedded document. It fails only if the
// document itself is not valid.
func NewResponseValidator() (*Validator, error) {
	doc, err := load(context.Background())
	if err != nil {
		return nil, err
	}
	// Match requests by path alone, whatever host and port the router under test listens on.
	doc.Servers = nil
	r, err := legacy.NewRouter(doc)
	if err != nil {
		return nil, fmt.Errorf("api/openapi.yaml: %w", err)
	}
	return &Validator{router: r}, nil
}

// ValidateResponse reports how the response (status, header, body) to req departs from the
// document: an operation that is not documented, a status the operation does not list, a
// missing or malformed documented header, a Content-Type not documented for the status, or a
// body that does not match its schema. It returns nil for a conforming response.
func (v *Validator) ValidateResponse(req *http.Request, status int, header http.Header, body []byte) error {
	route, params, err := v.router.FindRoute(req)
	if err != nil {
		return fmt.Errorf("%s %s is not an operation of api/openapi.yaml: %w", req.Method, req.URL.Path, err)
	}
	in := &openapi3filter.ResponseValidationInput{
		RequestValidationInput: &openapi3filter.RequestValidationInput{Request: req, PathParams: params, Route: route},
		Status:                 status,
		Header:                 header,
		Options:                &openapi3filter.Options{IncludeResponseStatus: true, MultiError: true},
	}
	in.SetBodyBytes(body)
	if err := openapi3filter.ValidateResponse(context.Background(), in); err != nil {
		return fmt.Errorf("%s %s → %d does not match api/openapi.yaml: %w", req.Method, req.URL.Path, status, err)
	}
	return nil
}
