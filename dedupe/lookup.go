package dedupe

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strconv"
)

// lookupString returns the string at pointer p in a JSON payload, and
// false when nothing is there. A value of another type is an error: a key
// of 42 and a key of "42" must not silently become one key. The scan
// streams past siblings instead of decoding the whole payload.
func lookupString(payload []byte, p Pointer) (string, bool, error) {
	dec := json.NewDecoder(bytes.NewReader(payload))
	dec.UseNumber()
	for _, want := range p.Tokens() {
		tok, err := dec.Token()
		if err != nil {
			return "", false, fmt.Errorf("%w: %v", ErrMalformedPayload, err)
		}
		switch tok {
		case json.Delim('{'):
			found, err := seekMember(dec, want)
			if err != nil || !found {
				return "", false, err
			}
		case json.Delim('['):
			i, err := strconv.Atoi(want)
			if err != nil || i < 0 || strconv.Itoa(i) != want {
				return "", false, nil
			}
			found, err := seekElement(dec, i)
			if err != nil || !found {
				return "", false, err
			}
		default:
			return "", false, nil
		}
	}
	var v any
	if err := dec.Decode(&v); err != nil {
		return "", false, fmt.Errorf("%w: %v", ErrMalformedPayload, err)
	}
	switch s := v.(type) {
	case string:
		return s, true, nil
	case nil:
		return "", false, nil
	default:
		return "", false, fmt.Errorf("%s is a %s, not a string", p, jsonKind(v))
	}
}

func seekMember(dec *json.Decoder, want string) (bool, error) {
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			return false, fmt.Errorf("%w: %v", ErrMalformedPayload, err)
		}
		if name, _ := tok.(string); name == want {
			return true, nil
		}
		var skip json.RawMessage
		if err := dec.Decode(&skip); err != nil {
			return false, fmt.Errorf("%w: %v", ErrMalformedPayload, err)
		}
	}
	return false, nil
}

func seekElement(dec *json.Decoder, index int) (bool, error) {
	for i := 0; dec.More(); i++ {
		if i == index {
			return true, nil
		}
		var skip json.RawMessage
		if err := dec.Decode(&skip); err != nil {
			return false, fmt.Errorf("%w: %v", ErrMalformedPayload, err)
		}
	}
	return false, nil
}

func jsonKind(v any) string {
	switch v.(type) {
	case json.Number:
		return "number"
	case bool:
		return "boolean"
	case map[string]any:
		return "object"
	case []any:
		return "array"
	}
	return "value"
}
