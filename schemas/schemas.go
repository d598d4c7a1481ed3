package schemas

import _ "embed"

// ConfigSchema is the JSON Schema (draft 2020-12) of the configuration
// file.
//
//go:embed config.schema.json
var ConfigSchema []byte

// ResultSchema describes a result record in its JSON-lines form.
//
//go:embed result.schema.json
var ResultSchema []byte

// DLQSchema describes a dead-letter record in its JSON-lines form.
//
//go:embed dlq.schema.json
var DLQSchema []byte
