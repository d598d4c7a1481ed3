// Package memstore is the in-memory dedupe.Store: one process, no
// durability. It serves unit tests, the demo and single-instance trials;
// production uses Redis, because state must outlive the process and be
// shared by every member of the consumer group.
package memstore
