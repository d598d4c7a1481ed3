// Command idemstream makes asynchronous commands on Kafka idempotent.
//
// Usage:
//
//	idemstream run      -c FILE [-b BROKERS] [--redis-url URL]   the consumer; many instances = one group
//	idemstream validate -c FILE [--check-servers]                the checks run makes, without running
//	idemstream demo     [-o text|json]                           embedded broker and store, the incident replayed
//	idemstream hash     -c FILE [--pipeline NAME] [-o text|json] [FILE|-]
//	idemstream diff     -c FILE [--pipeline NAME] [-o text|json] A B
//	idemstream contract -c FILE [-o markdown|asyncapi]
//	idemstream inspect  -c FILE [--pipeline NAME] [-o text|json] KEY
//	idemstream store    status -c FILE [-o text|json] | accept-loss -c FILE --yes
//	idemstream audit    -b BROKERS -t TOPIC [-c FILE] [-o text|json] [--suggest FILE]
//	idemstream dlq      summary|show|redrive -c FILE [--pipeline NAME] [-o text|json]   count, explain and send back dead letters
//	idemstream version  (or --version)
//
// Help (-h) goes to stdout with exit code 0; usage errors and every other
// error go to stderr. A flag's value that does not parse names the flag
// and what it wants. The overridable fields take a flag and an
// environment variable named after it (--brokers, IDEMSTREAM_BROKERS);
// an error about a value that came from one names it.
//
// hash, diff and contract work offline from the same configuration file
// that drives the consumer, so that a support engineer can answer "why was
// this a conflict?" and a client team can read the promise it is given.
// audit reads a topic that exists already (no group, no commit) and
// proposes those rules from what the retries in it actually carry. dlq
// reads a pipeline's dead-letter topic the same way: summary counts it,
// show explains one dead letter, redrive sends handler failures back to
// the input (docs/dlq.md).
//
// Exit codes: 0 ok, 1 runtime failure, 2 bad usage or bad configuration.
// Every error is one line that names what is wrong.
package main
