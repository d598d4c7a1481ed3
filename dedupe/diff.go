package dedupe

import (
	"bytes"
	"fmt"
	"slices"
	"strconv"

	"github.com/idemstream/idemstream/internal/jsonpointer"
)

// Diff returns the JSON Pointers (RFC 6901, escaped, sorted bytewise) of the
// locations whose values canonDiffer between payloads a and b under these rules,
// that is after volatile paths are removed and unordered arrays sorted. A
// member present on one side only is reported at its own pointer; arrays of
// different lengths report each differing index and each index past the
// shorter one. Indices in unordered arrays refer to the sorted order. Diff
// returns nil when the payloads are canonically equal. For raw payloads the
// only location is the whole document, "".
//
// Diff explains a fingerprint mismatch to a person; it is not on the request
// path, so it favours simplicity over speed.
func (c *Canonicalizer) Diff(a, b []byte) ([]string, error) {
	if c.raw {
		if bytes.Equal(a, b) {
			return nil, nil
		}
		return []string{""}, nil
	}
	ca, err := c.AppendCanonical(nil, a)
	if err != nil {
		return nil, fmt.Errorf("first payload: %w", err)
	}
	cb, err := c.AppendCanonical(nil, b)
	if err != nil {
		return nil, fmt.Errorf("second payload: %w", err)
	}
	if bytes.Equal(ca, cb) {
		return nil, nil
	}
	// Comparing canonical forms means equal subtrees are equal bytes, and
	// members come sorted on both sides.
	var d canonDiffer
	if err := d.a.parse(ca); err != nil {
		return nil, fmt.Errorf("reparsing canonical form: %w", err)
	}
	if err := d.b.parse(cb); err != nil {
		return nil, fmt.Errorf("reparsing canonical form: %w", err)
	}
	d.walk(0, 0, nil)
	slices.Sort(d.out)
	return d.out, nil
}

type canonDiffer struct {
	a, b jsonParser
	out  []string
}

func (d *canonDiffer) walk(ia, ib int32, path []byte) {
	na, nb := &d.a.nodes[ia], &d.b.nodes[ib]
	if bytes.Equal(d.a.data[na.start:na.end], d.b.data[nb.start:nb.end]) {
		return
	}
	if na.kind != nb.kind || (na.kind != vObject && na.kind != vArray) {
		d.out = append(d.out, string(path))
		return
	}
	if na.kind == vObject {
		ma := d.a.order[na.order : na.order+na.count]
		mb := d.b.order[nb.order : nb.order+nb.count]
		for len(ma) > 0 || len(mb) > 0 {
			var cmp int
			switch {
			case len(ma) == 0:
				cmp = 1
			case len(mb) == 0:
				cmp = -1
			default:
				cmp = compareUTF16(d.a.key(ma[0]), d.b.key(mb[0]))
			}
			switch {
			case cmp < 0:
				d.out = append(d.out, string(childPath(path, d.a.key(ma[0]))))
				ma = ma[1:]
			case cmp > 0:
				d.out = append(d.out, string(childPath(path, d.b.key(mb[0]))))
				mb = mb[1:]
			default:
				d.walk(ma[0], mb[0], childPath(path, d.a.key(ma[0])))
				ma, mb = ma[1:], mb[1:]
			}
		}
		return
	}
	ca, cb := ia+1, ib+1
	for k := int32(0); k < max(na.count, nb.count); k++ {
		p := childPath(path, strconv.AppendInt(nil, int64(k), 10))
		if k < na.count && k < nb.count {
			d.walk(ca, cb, p)
		} else {
			d.out = append(d.out, string(p))
		}
		if k < na.count {
			ca = d.a.nodes[ca].next
		}
		if k < nb.count {
			cb = d.b.nodes[cb].next
		}
	}
}

func childPath(path, token []byte) []byte {
	p := append(slices.Clip(path), '/')
	return jsonpointer.AppendToken(p, token)
}
