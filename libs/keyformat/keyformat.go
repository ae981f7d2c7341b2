// Package keyformat is the one definition of an API key's text, shared by the
// dispatcher, which makes keys, and the gateway, which checks them. A key is
// flo_<id>_<secret>: id is 12 lowercase base32 characters and names the key
// (it is listed and revoked by id), secret is 32 random bytes in hex. Only
// Hash(secret) is stored, so a copy of the table cannot authenticate.
package keyformat

import (
	"crypto/rand"
	"crypto/sha256"
	"encoding/base32"
	"encoding/hex"
	"errors"
	"strings"
)

const (
	prefix    = "flo_"
	idLen     = 12
	secretLen = 64 // hex of 32 bytes
)

var idEncoding = base32.NewEncoding("abcdefghijklmnopqrstuvwxyz234567").WithPadding(base32.NoPadding)

// ErrMalformed says a string is not an API key.
var ErrMalformed = errors.New("malformed API key")

// Key is a newly made key.
type Key struct {
	ID     string
	Secret string
}

// String is the whole key, the bearer token a client sends.
func (k Key) String() string { return prefix + k.ID + "_" + k.Secret }

// Generate makes a key from crypto/rand.
func Generate() (Key, error) {
	var id [8]byte // 64 bits, of which the 12 characters keep 60
	var secret [32]byte
	if _, err := rand.Read(id[:]); err != nil {
		return Key{}, err
	}
	if _, err := rand.Read(secret[:]); err != nil {
		return Key{}, err
	}
	return Key{ID: idEncoding.EncodeToString(id[:])[:idLen], Secret: hex.EncodeToString(secret[:])}, nil
}

// Parse splits a key into its id and secret, or returns ErrMalformed.
func Parse(s string) (Key, error) {
	rest, ok := strings.CutPrefix(s, prefix)
	if !ok || len(rest) != idLen+1+secretLen || rest[idLen] != '_' {
		return Key{}, ErrMalformed
	}
	k := Key{ID: rest[:idLen], Secret: rest[idLen+1:]}
	if !ValidID(k.ID) || !isLowerHex(k.Secret) {
		return Key{}, ErrMalformed
	}
	return k, nil
}

// ValidID says whether id has the form of a key id.
func ValidID(id string) bool {
	if len(id) != idLen {
		return false
	}
	for _, c := range id {
		if (c < 'a' || c > 'z') && (c < '2' || c > '7') {
			return false
		}
	}
	return true
}

// Hash is what is stored of a secret: SHA-256 of its hex text. Compare
// hashes with crypto/subtle.ConstantTimeCompare.
func Hash(secret string) []byte {
	h := sha256.Sum256([]byte(secret))
	return h[:]
}

func isLowerHex(s string) bool {
	for _, c := range s {
		if (c < '0' || c > '9') && (c < 'a' || c > 'f') {
			return false
		}
	}
	return true
}
