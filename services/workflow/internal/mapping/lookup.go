package mapping

import (
	"encoding/json"
	"fmt"
)

// DecodeJSON parses a JSON document into the values Lookup walks; empty
// means null.
func DecodeJSON(raw json.RawMessage) (any, error) { return decode(raw) }

// Lookup returns the value a singular path selects in doc, a document
// DecodeJSON made; found is false when there is none. Only the part of the
// path below its root is applied, so doc is what the root names (the run
// input for $.input paths). The JSONPath library's panics become errors.
func (p *Path) Lookup(doc any) (v any, found bool, err error) {
	if p.rest == nil {
		return doc, true, nil
	}
	if !p.singular {
		return nil, false, fmt.Errorf("path %q can select several values", p.raw)
	}
	defer func() {
		if rec := recover(); rec != nil {
			v, found, err = nil, false, fmt.Errorf("path %q could not be evaluated: %v", p.raw, rec)
		}
	}()
	v, found = p.rest.FirstFound(doc)
	return v, found, nil
}
