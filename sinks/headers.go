package sinks

// Header names of docs/design.md ("The records it writes"). Outside tools read them: they
// never change.
const (
	HeaderKey              = "idemstream-key"
	HeaderFingerprint      = "idemstream-fingerprint"
	HeaderSource           = "idemstream-source"
	HeaderOutcome          = "idemstream-outcome"
	HeaderReason           = "idemstream-reason"
	HeaderError            = "idemstream-error"
	HeaderFirstFingerprint = "idemstream-first-fingerprint"
	HeaderFirstSource      = "idemstream-first-source"
	HeaderConflictPaths    = "idemstream-conflict-paths"
	HeaderReplayed         = "idemstream-replayed"
	// HeaderDecision names the decision a result belongs to (the first
	// source of its key's entry and the entry's window start): a recovery
	// scan takes a result for its own only when it names the same
	// decision, never one of the key's previous window.
	HeaderDecision = "idemstream-decision"
	// HeaderPipeline names the pipeline that wrote a result: its input,
	// output, group, store namespace and key rule (consumer.Config.Identity).
	HeaderPipeline = "idemstream-pipeline"
	// HeaderPayloadSize is the size in bytes of the payload a trimmed dead
	// letter no longer carries in full (see TrimDeadLetter).
	HeaderPayloadSize = "idemstream-payload-size"
	// HeaderSchemaID, HeaderSchemaSubject and HeaderSchemaVersion name the
	// schema a dead letter of an avro, protobuf or json_schema payload was
	// read under (or failed to be), as the registry knows it.
	HeaderSchemaID      = "idemstream-schema-id"
	HeaderSchemaSubject = "idemstream-schema-subject"
	HeaderSchemaVersion = "idemstream-schema-version"
)
