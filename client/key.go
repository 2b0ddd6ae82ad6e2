package client

import (
	"errors"
	"fmt"
	"strings"

	"github.com/google/uuid"
)

// maxKeyLen is the longest Idempotency-Key the API accepts, in characters.
const maxKeyLen = 255

// ErrNoKey is returned by [Client.Send] for a [Transfer] without a key. The key must be minted
// when the operation is created (see [NewKey]) and stored with it before the first attempt;
// Send never mints one, because a key minted at send time is new on every retry after a crash.
var ErrNoKey = errors.New("shardgate: the transfer has no Idempotency-Key; mint it with client.NewKey when the operation is created and store it with the operation before sending")

// NewKey mints an Idempotency-Key for one new operation: a UUIDv7 in its canonical lower-case
// form. Call it once per business operation, when the operation is decided, and store the key
// with the operation before sending it; every retry, in this process or after a restart, must
// send the same key.
//
// A UUIDv7 carries its creation time. The server reads it and refuses, with [ErrKeyExpired],
// a key older than its retention (720h by default) rather than risk executing the operation a
// second time, and refuses as invalid a key more than a minute in the future: keep the
// clock of the machine minting keys synchronised.
//
// NewKey panics only if the system's secure random source fails, which crypto/rand already
// treats as fatal.
func NewKey() string {
	k, err := uuid.NewV7()
	if err != nil {
		panic(fmt.Sprintf("shardgate: minting a UUIDv7 idempotency key: %v", err))
	}
	return k.String()
}

// checkKey reports whether key is a key the API accepts: 1 to 255 visible ASCII characters.
func checkKey(key string) error {
	if key == "" {
		return ErrNoKey
	}
	if len(key) > maxKeyLen {
		return fmt.Errorf("shardgate: the Idempotency-Key is %d characters; at most %d are allowed", len(key), maxKeyLen)
	}
	for i := 0; i < len(key); i++ {
		if key[i] < 0x21 || key[i] > 0x7e {
			return fmt.Errorf("shardgate: character %d of the Idempotency-Key is not visible ASCII (allowed: ! to ~, no spaces)", i+1)
		}
	}
	return nil
}

// keyHeader renders key as an RFC 8941 sf-string, the form the IETF Idempotency-Key draft
// defines. The quoted form is unambiguous: a bare key that happens to start with a double quote
// would be read by the server as a quoted one.
func keyHeader(key string) string {
	return `"` + sfEscaper.Replace(key) + `"`
}

var sfEscaper = strings.NewReplacer(`\`, `\\`, `"`, `\"`)
