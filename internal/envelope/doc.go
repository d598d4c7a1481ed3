// Package envelope builds the records idemstream writes from an input
// record and its outcome: the result of a first copy, the dead letter of a
// rejected record (and its trimmed copies when the broker refuses it for
// its size), the reply to a replay. Their headers are those of
// docs/design.md ("The records it writes"), named by the sinks.Header*
// constants, and the JSON Schemas of package schemas describe them.
//
// It is internal because only the consumer's protocol may decide what a
// result carries: a scan after a crash recognises a key's result by these
// headers, so a record built elsewhere that looked like one would be taken
// for it.
package envelope
