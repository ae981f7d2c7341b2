package definition

import (
	"fmt"
	"strings"

	"go.yaml.in/yaml/v3"

	"github.com/razorbill/flo/libs/text"
	"github.com/razorbill/flo/services/workflow/internal/mapping"
)

var searchAttributeFields = []string{"name", "type", "from"}

// searchAttributes reads the searchAttributes list into
// def.SearchAttributes, leaving out entries with errors.
func (p *parser) searchAttributes(f field, def *Definition) {
	if f.value.Kind != yaml.SequenceNode {
		if f.value.Tag != "!!null" {
			p.errorf(CodeType, f.value, f.path, "searchAttributes must be a list of {name, type, from}, not %s", describe(f.value))
		}
		return
	}
	if len(f.value.Content) > MaxSearchAttributes {
		p.errorf(CodeLimit, f.key, f.path, "%d search attributes; the limit is %d", len(f.value.Content), MaxSearchAttributes)
		return
	}
	seen := map[string]Position{}
	for i, n := range f.value.Content {
		path := fmt.Sprintf("%s[%d]", f.path, i)
		if n = p.deref(n, path); n == nil {
			continue
		}
		if a := p.searchAttribute(n, path, seen); a != nil {
			def.SearchAttributes = append(def.SearchAttributes, *a)
		}
	}
	// A scheduled run could not refuse its input the way a start call
	// does, so the schedule's input must fit now.
	if def.Schedule != nil {
		if _, err := def.SearchValues(def.Schedule.Input); err != nil {
			p.errorf(CodeScheduleAttribute, f.key, f.path, "the schedule's input does not fit: %v", err)
		}
	}
}

// searchAttribute reads one attribute; seen holds the names of the earlier
// ones and where they were written. It returns nil when it has errors.
func (p *parser) searchAttribute(n *yaml.Node, path string, seen map[string]Position) *SearchAttribute {
	fields := p.object(n, path, "a search attribute", searchAttributeFields)
	if fields == nil {
		return nil
	}
	before := len(p.diags)
	a := &SearchAttribute{Pos: pos(n)}
	if nf, ok := fields["name"]; !ok {
		p.errorf(CodeAttributeName, n, path, "a search attribute needs a name")
	} else if v, ok := p.str(nf, false); ok {
		first, dup := seen[v]
		switch {
		case text.Name("name", v) != nil || !isLetter(v[0]):
			p.errorf(CodeAttributeName, nf.value, nf.path, "search attribute name %q is invalid: use 1 to %d letters, digits, '.', '_' or '-', starting with a letter", clip(v), nameMaxLen)
		case reservedAttributeName(v):
			p.errorf(CodeAttributeReserved, nf.value, nf.path, "search attribute name %q is reserved: queries use %s as built-in fields and %s as keywords", clip(v), strings.Join(BuiltInFields, ", "), strings.Join(queryKeywords, ", "))
		case dup:
			p.errorf(CodeDuplicateAttribute, nf.value, nf.path, "search attribute %q is written twice (first at %s)", v, first)
		default:
			seen[v] = pos(nf.value)
			a.Name = v
		}
	}
	if tf, ok := fields["type"]; !ok {
		p.errorf(CodeAttributeType, n, path, "a search attribute needs a type: %s", strings.Join(attributeTypes, ", "))
	} else if v, ok := p.str(tf, false); ok {
		if !contains(attributeTypes, v) {
			p.errorf(CodeAttributeType, tf.value, tf.path, "type %q is not one of %s%s", clip(v), strings.Join(attributeTypes, ", "), suggest(v, attributeTypes))
		} else {
			a.Type = AttributeType(v)
		}
	}
	if ff, ok := fields["from"]; !ok {
		p.errorf(CodeAttributeFrom, n, path, "a search attribute needs from: a path into the input, e.g. input.customer_id")
	} else if v, ok := p.str(ff, false); ok {
		a.From = p.attributePath(ff, v)
	}
	if len(p.diags) != before {
		return nil
	}
	return a
}

// attributePath parses from: input… as the reference writes it, or the
// same with $. in front as in inputMapping.
func (p *parser) attributePath(f field, v string) *mapping.Path {
	raw := v
	if !mapping.IsPath(raw) {
		raw = "$." + raw
	}
	path, err := mapping.ParsePath(raw)
	switch {
	case err != nil:
		p.errorf(CodeAttributeFrom, f.value, f.path, "from %q is not a path into the input: %v", clip(v), err)
	case path.Root() != mapping.RootInput:
		p.errorf(CodeAttributeFrom, f.value, f.path, "from %q must be a path into the input (input.FIELD…), not the %s", clip(v), path.Root())
	case !path.Singular():
		p.errorf(CodeAttributeFrom, f.value, f.path, "from %q can select several values; use names and indexes only (input.items[0].sku)", clip(v))
	default:
		return path
	}
	return nil
}

func isLetter(b byte) bool { return b >= 'a' && b <= 'z' || b >= 'A' && b <= 'Z' }
