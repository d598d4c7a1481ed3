// Package decode reads command payloads that are not JSON text (Avro,
// Protobuf, JSON Schema behind a schema registry, in the Confluent wire
// format, or plain Avro and Protobuf of one local schema) as the JSON text
// that package dedupe canonicalizes and fingerprints. It is what makes a
// retry with a new client_time a replay on an Avro or Protobuf topic too.
//
// A Decoder is opened once per pipeline: it reads the reader schema, the
// schema every record is resolved to, and returns JSON text per record:
//
//	reg, _ := decode.NewRegistry(decode.RegistryConfig{URL: "http://registry:8081"})
//	d, err := decode.Open(ctx, decode.Options{Format: dedupe.PayloadAvro, Registry: reg, Subject: "claims-value"})
//	canon, err := dedupe.NewCanonicalizer(dedupe.CanonicalRules{Payload: dedupe.PayloadAvro, Decoder: d, Volatile: []string{"/client_time"}})
//	fp, err := canon.Fingerprint(record.Value) // decode, canonicalize, hash
//
// The first record of each writer schema id costs a registry round trip;
// the writer schema is then compiled against the reader schema (Avro's
// resolution, Protobuf's field numbers) once, and every later record is
// one walk over its bytes that appends JSON, with no tree in between.
//
// Errors are classified by dedupe.Classify. A record's own defect is
// poison, with its dead letter's reason and the schema's coordinates
// (*dedupe.SchemaError): malformed_payload, unknown_schema,
// incompatible_schema, invalid_schema, non_finite_number. A registry that
// does not answer is retryable (dedupe.ErrRegistryUnavailable): never the
// record's fault. A registry that refuses is fatal.
//
// The mapping from decoded values to JSON is part of every fingerprint:
// docs/payloads.md states it, and the golden files under testdata/ freeze
// it.
package decode
