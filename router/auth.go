package router

import (
	"crypto/sha256"
	"crypto/subtle"
	"errors"
	"fmt"
	"net/http"
	"strings"

	"github.com/shardgate/shardgate/config"
)

// The realms of the two bearer tokens: a client's (the API) and the admin's.
const (
	clientRealm = "shardgate"
	adminRealm  = "shardgate-admin"
)

// bearerToken returns the token of r's Authorization header. The scheme is matched in any case
// (RFC 9110 §11.1: "bearer" and "BEARER" are Bearer) and is followed by one or more spaces and a
// non-empty token. The error says what is wrong, for the 401's detail; it never quotes the header.
//
// Two Authorization headers are refused, with 401 like any unusable credentials, rather than
// one of them taken: a proxy that adds its own credentials, or a request crafted to be read one
// way here and another way elsewhere, must not be authenticated as whichever came first.
func bearerToken(h http.Header) (string, error) {
	values := h.Values("Authorization")
	switch {
	case len(values) == 0:
		return "", errors.New("the Authorization header is missing")
	case len(values) > 1:
		return "", errors.New("send exactly one Authorization header")
	}
	scheme, token, _ := strings.Cut(values[0], " ")
	if !strings.EqualFold(scheme, "Bearer") {
		return "", errors.New("the Authorization scheme is not Bearer")
	}
	if token = strings.TrimLeft(token, " "); token == "" {
		return "", errors.New("the bearer token is empty")
	}
	return token, nil
}

// authenticate returns the client's name, or why the request is not authenticated. Every
// configured hash is compared, in constant time, so the time taken does not reveal which client
// or how much of a token matched.
func (s *Server) authenticate(r *http.Request) (string, error) {
	if s.cfg.Auth.Mode == "none" {
		return config.AnonymousClient, nil
	}
	token, err := bearerToken(r.Header)
	if err != nil {
		return "", fmt.Errorf("%w; send Authorization: Bearer <token> with a token configured for your client", err)
	}
	sum := sha256.Sum256([]byte(token))
	match := -1
	for i := range s.cfg.Auth.Clients {
		if subtle.ConstantTimeCompare(sum[:], s.cfg.Auth.Clients[i].TokenSHA256[:]) == 1 {
			match = i
		}
	}
	if match < 0 {
		return "", errors.New("the bearer token is not one configured for any client")
	}
	return s.cfg.Auth.Clients[match].Name, nil
}

// requireToken lets through only requests bearing the token whose SHA-256 is want.
func requireToken(want [32]byte, next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		token, err := bearerToken(r.Header)
		sum := sha256.Sum256([]byte(token))
		if err != nil || subtle.ConstantTimeCompare(sum[:], want[:]) != 1 {
			reason := "the bearer token is not the admin token"
			if err != nil {
				reason = err.Error()
			}
			challenge(w, adminRealm)
			writeProblem(w, probUnauthorized, reason+"; admin endpoints need Authorization: Bearer <admin token>", 0)
			return
		}
		next.ServeHTTP(w, r)
	})
}

// challenge adds the WWW-Authenticate header a 401 must carry (RFC 9110 §11.6.1).
func challenge(w http.ResponseWriter, realm string) {
	w.Header().Set("WWW-Authenticate", `Bearer realm="`+realm+`"`)
}
