package flo

import "errors"

// maxPageSize is the largest page every List call of the server accepts.
const maxPageSize = 1000

// listPages asks for page after page until the server says none follows or
// limit items came (zero limit: no cap), and converts what the pages hold.
// fetch asks for one page of at most size items, starting at token.
func listPages[P, T any](limit int, fetch func(size int32, token string) ([]P, string, error), conv func(P) T) ([]T, error) {
	var (
		out   []T
		token string
	)
	for {
		size := maxPageSize
		if limit > 0 {
			size = min(size, limit-len(out))
		}
		items, next, err := fetch(int32(size), token)
		if err != nil {
			return nil, err
		}
		for _, it := range items {
			out = append(out, conv(it))
		}
		switch {
		case limit > 0 && len(out) >= limit:
			return out[:limit], nil
		case next == "":
			return out, nil
		case next == token:
			return nil, errors.New("the server returned the page token it was sent")
		}
		token = next
	}
}
