package main

import (
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"flag"
	"fmt"
	"io"
	"strings"

	"github.com/shardgate/shardgate/config"
)

// tokenCommand runs `router token new --name NAME`: a fresh random bearer token, printed once,
// and the router.yaml lines that configure a client with its SHA-256. The token is stored
// nowhere; the router only ever sees its hash.
func tokenCommand(args []string, stdout io.Writer) error {
	if len(args) == 0 || args[0] != "new" {
		if len(args) > 0 && (args[0] == "-h" || args[0] == "--help" || args[0] == "help") {
			fmt.Fprint(stdout, tokenUsage)
			return errHelp
		}
		return fmt.Errorf("%w: token: the subcommand is new (router token new --name NAME)", errUsage)
	}
	fs := flag.NewFlagSet("token new", flag.ContinueOnError)
	name := fs.String("name", "", "the client's name in router.yaml (1-63 of a-z 0-9 . _ -)")
	if err := parseFlags(fs, args[1:], stdout); err != nil {
		return err
	}
	if *name == "" {
		return fmt.Errorf("%w: token new: --name is required: the name the client gets in router.yaml, e.g. --name payments", errUsage)
	}
	token := rand.Text() // 26 base32 characters: 130 random bits from crypto/rand
	sum := sha256.Sum256([]byte(token))
	lines := fmt.Sprintf("  - name: %s\n    token_sha256: %s\n", *name, hex.EncodeToString(sum[:]))
	if err := checkClientLines(*name, lines); err != nil {
		return fmt.Errorf("%w: token new: --name %q: %v", errUsage, *name, err)
	}
	fmt.Fprintf(stdout, `Token for client %q (shown only this once; give it to the client, which sends
Authorization: Bearer <token>; shardgate keeps only its hash):

  %s

Add the client to router.yaml under auth.clients (mode: tokens), then restart the routers:

auth:
  mode: tokens
  clients:
%s`, *name, token, lines)
	return nil
}

const tokenUsage = `usage: router token new --name NAME

Prints a new random bearer token once, and the router.yaml lines of a client holding its
SHA-256 (auth.clients). The same hash also fits admin.token_sha256.
`

// checkClientLines parses the client lines as router.yaml would, so that a name the router
// would refuse is refused here, in the same words.
func checkClientLines(name, lines string) error {
	yml := "listen: 127.0.0.1:8080\nshardmap: shardmap.yaml\nauth:\n  mode: tokens\n  clients:\n" + lines
	cfg, err := config.Parse("router.yaml", []byte(yml))
	if err == nil && (len(cfg.Auth.Clients) != 1 || cfg.Auth.Clients[0].Name != name) {
		return fmt.Errorf("%q must be 1-63 of a-z 0-9 . _ -", name)
	}
	if err != nil {
		msg := err.Error()
		if i := strings.Index(msg, "auth.clients[0].name: "); i >= 0 {
			msg = strings.TrimPrefix(strings.SplitN(msg[i:], "\n", 2)[0], "auth.clients[0].name: ")
		}
		return fmt.Errorf("%s", msg)
	}
	return nil
}
