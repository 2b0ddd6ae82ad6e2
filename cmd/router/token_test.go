package main

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"strings"
	"testing"

	"github.com/shardgate/shardgate/config"
)

// token new prints a fresh token once and router.yaml lines that the router accepts, holding
// the token's SHA-256 under the given name; two runs never give the same token.
func TestTokenNew(t *testing.T) {
	tokens := map[string]bool{}
	for range 2 {
		var stdout, stderr bytes.Buffer
		if status := run([]string{"token", "new", "--name", "payments"}, &stdout, &stderr); status != 0 {
			t.Fatalf("router token new: status %d, stderr %q", status, stderr.String())
		}
		out := stdout.String()
		head, yml, ok := strings.Cut(out, "\nauth:\n")
		if !ok {
			t.Fatalf("no router.yaml lines in:\n%s", out)
		}
		var token string
		for _, l := range strings.Split(head, "\n") {
			if strings.HasPrefix(l, "  ") && len(strings.TrimSpace(l)) >= 26 {
				token = strings.TrimSpace(l)
			}
		}
		if token == "" || tokens[token] {
			t.Fatalf("token %q missing or repeated in:\n%s", token, out)
		}
		tokens[token] = true
		cfg, err := config.Parse("router.yaml", []byte("listen: 127.0.0.1:8080\nshardmap: shardmap.yaml\nauth:\n"+yml))
		if err != nil {
			t.Fatalf("the printed lines do not parse: %v\n%s", err, yml)
		}
		sum := sha256.Sum256([]byte(token))
		if c := cfg.Auth.Clients; len(c) != 1 || c[0].Name != "payments" || c[0].TokenSHA256 != sum {
			t.Errorf("clients %+v, want payments with sha256 %s", c, hex.EncodeToString(sum[:]))
		}
	}
}

// A name the router would refuse is refused before a token is printed, with the rule.
func TestTokenNewRefusals(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"token", "new"}, "--name is required"},
		{[]string{"token", "new", "--name", "Payments Team"}, "must be 1-63 of a-z 0-9 . _ -"},
		{[]string{"token", "new", "--name", "a #b"}, "must be 1-63 of a-z 0-9 . _ -"},
		{[]string{"token"}, "router token new --name NAME"},
	} {
		var stdout, stderr bytes.Buffer
		status := run(tc.args, &stdout, &stderr)
		if status != 2 || !strings.Contains(stderr.String(), tc.want) || stdout.Len() > 0 {
			t.Errorf("router %q: status %d, stdout %q, stderr %q; want 2, nothing, and %q", tc.args, status, stdout.String(), stderr.String(), tc.want)
		}
	}
}
