// Package schemas owns the contracts that outside tools read: the JSON
// Schemas of the configuration file, of result records and of dead-letter
// records (embedded, see [ConfigSchema], [ResultSchema], [DLQSchema]), and
// the loader that turns a configuration file into a validated [Config].
//
// Loading is strict on purpose: an unknown key, a bad duration, a bad JSON
// Pointer, an output topic equal to the input, or a window shorter than
// 1.5 × the client's retry interval is refused at start with an error that
// names the field ([FieldError]), because a typo in a dedupe rule silently
// changes what "the same request" means.
//
// Precedence, lowest first: built-in defaults, the YAML file, IDEMSTREAM_*
// environment variables, command-line flags ([Overrides]).
package schemas
