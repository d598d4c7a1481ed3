// Package schemas owns the contracts that outside tools read: the JSON
// Schemas of the configuration file, of result records and of dead-letter
// records (embedded, see [ConfigSchema], [ResultSchema], [DLQSchema]), and
// the loader that turns a configuration file into a validated [Config].
//
// # One file for the consumer and for its clients
//
// The configuration file is the promise made to client teams: `idemstream
// contract` renders it ([ContractMarkdown], [ContractAsyncAPI]), and the
// consumer runs it. A program that embeds idemstream with a handler of its
// own loads the same file, so that its behaviour and its contract cannot
// drift apart either:
//
//	cfg, err := schemas.Load("idemstream.yaml", schemas.EnvOverrides(os.Getenv))
//	p, err := cfg.Pipeline("coupon-claim")
//	pol, err := cfg.Policy(p) // a dedupe.Policy, for consumer.Options.Policy
//	group := cfg.ConsumerGroup(p)
//
// # Refused at start, with the field named
//
// Loading is strict on purpose: an unknown key, a bad duration, a bad JSON
// Pointer, an output topic equal to the input, or a window shorter than
// 1.5 × the client's retry interval is refused at start with an error that
// names the field ([FieldError]), because a typo in a dedupe rule silently
// changes what "the same request" means. The command line exits with
// code 2 on such an error; a program should refuse to start too.
//
// Precedence, lowest first: built-in defaults, the YAML file, IDEMSTREAM_*
// environment variables, command-line flags ([Overrides]).
package schemas
