package sinks

// Header names of SPEC "Records it writes". Outside tools read them: they
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
)
