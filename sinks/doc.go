// Package sinks writes what idemstream emits: result records on a
// pipeline's output topic, dead letters with their reason and evidence on
// its dlq topic, and replayed results on its replies topic, with the
// headers of SPEC "Records it writes" (the Header* constants).
package sinks
