// Package page is how every List call pages (in the style of Google's
// AIP-158): one rule for the page size and one page-token encoding, so a
// limit and a token mean the same in every service.
//
// A page token is the key of the last item of a page, base64url-encoded;
// the next page is the items whose key sorts after it, found by a keyset
// query (WHERE key > last ORDER BY key), never by OFFSET, so items added or
// removed between pages neither repeat nor hide the others.
package page

import (
	"encoding/base64"
	"encoding/json"
	"strconv"

	"github.com/razorbill/flo/libs/fault"
)

// Page sizes of every List call, except where a call documents its own
// maximum.
const (
	DefaultLimit = 100
	MaxLimit     = 1000
)

// Page is a checked page request.
type Page struct {
	// Limit is how many items the page holds at most.
	Limit int
	// After is the key of the previous page's last item; nil on the first
	// page.
	After []string
}

// New checks a request's limit and page token: zero limit means
// DefaultLimit, a negative one or one above max is Invalid, and a token
// must be one this package made for a key of parts parts.
func New(limit int32, token string, max, parts int) (Page, error) {
	if limit < 0 || int(limit) > max {
		return Page{}, fault.Invalidf("limit must be between 0 and %d, got %d", max, limit)
	}
	p := Page{Limit: int(limit)}
	if p.Limit == 0 {
		p.Limit = DefaultLimit
	}
	if token == "" {
		return p, nil
	}
	raw, err := base64.RawURLEncoding.DecodeString(token)
	if err != nil || json.Unmarshal(raw, &p.After) != nil || len(p.After) != parts {
		return Page{}, errBadToken
	}
	return p, nil
}

var errBadToken = fault.Invalidf("page_token is not a token this call returned")

// Part returns part i of the After key, or "" on the first page: a key of
// one name resumes with WHERE name > Part(0), which "" starts at the first.
func (p Page) Part(i int) string {
	if p.After == nil {
		return ""
	}
	return p.After[i]
}

// Int returns part i of the After key as an integer, or an Invalid error
// naming page_token when it is not one.
func (p Page) Int(i int) (int64, error) {
	n, err := strconv.ParseInt(p.After[i], 10, 64)
	if err != nil {
		return 0, errBadToken
	}
	return n, nil
}

// BadToken returns the Invalid error for a page token whose key does not
// fit the call, for checks New cannot make (a malformed id, say).
func BadToken() error { return errBadToken }

// Fetch is how many items a store query asks for: one more than a page,
// which tells whether another page follows.
func (p Page) Fetch() int { return p.Limit + 1 }

// Cut cuts items fetched with Fetch to the page and returns them with the
// token of the next page, made from the key of the page's last item; the
// token is empty when no page follows.
func Cut[T any](p Page, items []T, key func(T) []string) ([]T, string) {
	if len(items) <= p.Limit {
		return items, ""
	}
	items = items[:p.Limit]
	return items, Token(key(items[len(items)-1])...)
}

// Token encodes a key as a page token.
func Token(key ...string) string {
	raw, _ := json.Marshal(key) // a slice of strings always marshals
	return base64.RawURLEncoding.EncodeToString(raw)
}
