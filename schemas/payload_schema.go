package schemas

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"strings"

	"github.com/santhosh-tekuri/jsonschema/v6"
)

// PayloadSchema validates command payloads against a pipeline's JSON
// Schema. It implements dedupe.SchemaValidator.
type PayloadSchema struct {
	schema *jsonschema.Schema
}

func compilePayloadSchema(path string) (*PayloadSchema, error) {
	if err := fileExists(path); err != nil {
		return nil, err
	}
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("cannot read %s", path)
	}
	doc, err := jsonschema.UnmarshalJSON(bytes.NewReader(data))
	if err != nil {
		return nil, fmt.Errorf("%s is not JSON: %v", path, err)
	}
	c := jsonschema.NewCompiler()
	// The schema must stand alone: a pipeline must not fetch anything
	// from the network at start.
	c.UseLoader(refusingLoader{})
	if err := c.AddResource(path, doc); err != nil {
		return nil, fmt.Errorf("%s: %v", path, err)
	}
	s, err := c.Compile(path)
	if err != nil {
		return nil, fmt.Errorf("%s does not compile: %s", path, firstLine(err.Error()))
	}
	return &PayloadSchema{schema: s}, nil
}

type refusingLoader struct{}

func (refusingLoader) Load(url string) (any, error) {
	return nil, fmt.Errorf("schema references %s: external references are not loaded", url)
}

// ValidatePayload reports the first violation as one sentence.
func (s *PayloadSchema) ValidatePayload(payload []byte) error {
	doc, err := jsonschema.UnmarshalJSON(bytes.NewReader(payload))
	if err != nil {
		return fmt.Errorf("not JSON: %v", err)
	}
	err = s.schema.Validate(doc)
	var verr *jsonschema.ValidationError
	if !errors.As(err, &verr) {
		return err
	}
	leaf := deepestCause(verr)
	loc := "/" + strings.Join(leaf.InstanceLocation, "/")
	return fmt.Errorf("at %s: %s", loc, leaf.ErrorKind.LocalizedString(printer))
}

func firstLine(s string) string {
	if i := strings.IndexByte(s, '\n'); i >= 0 {
		return s[:i]
	}
	return s
}
