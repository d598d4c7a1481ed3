// Command idemstream makes asynchronous commands on Kafka idempotent.
//
// Usage:
//
//	idemstream run      --config FILE          the consumer; many instances = one group
//	idemstream demo                            embedded broker and store, the incident's incident
//	idemstream hash     --config FILE --pipeline NAME [FILE|-]
//	idemstream diff     --config FILE --pipeline NAME A B
//	idemstream contract --config FILE [--format markdown|asyncapi]
//	idemstream inspect  --config FILE --pipeline NAME KEY
//	idemstream audit    --brokers B --topic T [--config FILE] [--suggest FILE]
//	idemstream version
//
// hash, diff and contract work offline from the same configuration file
// that drives the consumer, so that a support engineer can answer "why was
// this a conflict?" and a client team can read the promise it is given.
// audit reads a topic that exists already (no group, no commit) and
// proposes those rules from what the retries in it actually carry.
//
// Exit codes: 0 ok, 1 runtime failure, 2 bad usage or bad configuration.
// Every error is one line that names what is wrong.
package main
