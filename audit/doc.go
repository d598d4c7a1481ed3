// Package audit reads command records that already exist and shows what
// "the same request" means in them: which fields change between copies
// of one idempotency key (volatile candidates), which arrays only change
// order (unordered candidates), which keys were reused with another body
// (conflicts), how far apart retries come (the window they need), which
// keys come back long after any retry would (business keys used as
// idempotency keys), and what idemstream, the incident's raw-body hash
// and a key-only rule would each have decided.
//
// It reuses the decision code of the consumer rather than imitating it:
// keys and fingerprints come from [dedupe.Decider.Prepare], canonical
// forms from [dedupe.Canonicalizer], decisions from decide.Decide. An
// audit and `idemstream run` with the same rules therefore cannot
// disagree about what is a replay.
//
// # Memory
//
// The audit keeps state per key, never per record. For each key: its
// count of copies, the time of the last one, the longest gap, and the
// pointers at which its copies differed (about 100 bytes with the map
// entry). While the window of a key's first copy is open it also keeps a
// summary of that copy: one 8-byte entry per JSON value (a location id
// and a 30-bit hash of the value's canonical bytes), sorted, so that a
// later copy is compared entry by entry without keeping any payload. The
// summary is dropped when the window ends (a later copy starts a new
// window). Arrays longer than 32 elements are summarized as a whole, and
// a payload's values past the 512th are not compared. The hashes make
// the field statistics probabilistic (a change is missed with a chance
// of about 1 in 10^9); decisions are exact, made with full fingerprints.
//
// The second pass, which decides the records under the rules the first
// pass found, keeps 16 bytes per key and rule while the key's window is
// open, plus 16 for each distinct body of a key under the raw-body rule.
//
// # Time
//
// Gaps and windows run on record timestamps: the audit reads history, so
// there is no store clock to ask. Records of several partitions are
// merged in timestamp order (see [KafkaTopic]).
package audit
