// Package redisstore is the dedupe.Store that production uses: per-key
// state in Redis, where every transition is atomic on the server (a
// native SET NX, a Lua script, or a WATCHed transaction), with the window
// and the leases on the server's clock (TIME), never on a consumer's.
//
// # Layout
//
// One Redis string per key, named <prefix>:{<pipeline>:<key>}. The braces
// are a cluster hash tag: every script touches one key, hence one slot. An
// idempotency key longer than 64 bytes is replaced in the name by its
// SHA-256; the original is kept in the value and checked on every access.
// The key expires (PXAT) when the window, or failed_ttl, ends.
//
// The value is an entry in one of two formats, told apart by its first
// byte; every path reads both:
//   - text (entry.go, entry.lua): its fields in a fixed order separated by
//     \x1f, the key last. A string costs a third of the memory of a hash
//     whose values exceed Redis's listpack limit, as fingerprints do. A
//     SUCCESS entry grows INFO used_memory by about 545 bytes
//     (BenchmarkUsedMemoryPerKey, a million keys).
//   - compact (compact.go, entry.lua), written with WithCompactEntries:
//     binary fields, a hash where a reader brings the value (the holder of
//     a finished key, the topic of a source, most of the rules digest),
//     the key left to the name: about 241 bytes per SUCCESS entry. An
//     entry read compact is written back compact by every store, since a
//     text entry would keep the hashes as they read.
//
// A release before the compact format reads a compact entry as no entry;
// docs/operations.md says how to move a deployment to it.
//
// # Batches
//
// Most records carry a key the store has never seen. For those a decision
// is a native SET NX with PXAT, stamped with the server's clock read by one
// TIME per batch: no script runs. Records whose key exists, and later
// records of a key already in the batch (so that one key's records are
// decided in order), go to decide.lua, one script call per group of up to
// 512 records (per hash slot on a cluster). Existing keys whose decision
// changes nothing (a replay, a conflict, a key pending elsewhere) are
// decided in Go from a GET; when a later record of such a key needs the
// script, the records decided from the GET go with it, so that every
// record of a key in one call is decided on one state of its entry. A
// batch thus costs four rounds at most, however large (TIME, SET NX, the
// GETs, decide.lua); the SET NX of more than 512 new keys goes in chunks
// of 512, side by side on connections of their own (see pipelineChunk).
// Batches under 8 records skip TIME and SET NX and take one round trip
// to decide.lua.
//
// Complete, on a single node or a Sentinel master, needs no script either:
// in transactions of up to 32 entries it WATCHes the entries, reads TIME
// and the entries (MGET), applies decide.Complete in Go on the
// server's clock, and writes the changed entries in MULTI/EXEC. EXEC runs
// only if no watched entry changed meanwhile, which makes each check and
// its write atomic; when one did (another holder took a key over), EXEC
// does nothing and complete.lua finishes that transaction. Redis spends
// about 5 µs of CPU per completion this way against about 17 µs in the
// script (BenchmarkServerCPUPerRecord); the price is two round trips per
// 32 completions (up to three transactions run at once, each on its own
// connection) and about 3 µs more of the consumer's CPU per completion
// (reading the entries back). Larger transactions cost more per key:
// Redis checks each WATCHed key against every key the connection already
// watches. A server with a native compare-and-set (SET … IFEQ: Valkey
// 8.1 and later, Redis 8.4 and later; asked once, never required) needs
// no WATCH: each changed entry is written with SET … IFEQ the value it
// had (in chunks of 64, three side by side), which the server compares and
// writes atomically; an entry
// changed meanwhile is left to complete.lua. The value it had is most
// often what Decide's own SET NX wrote, which the store remembers
// (written.go), so the round trip before the writes reads TIME alone, and
// the entries it does not remember (MGET); a call in which a remembered
// entry would not write (a completion fenced, or already done) is decided
// again on all its entries read. On a cluster, with replica
// acknowledgement (see Replicas), and for calls of fewer than 8
// completions, Complete is one complete.lua call per group.
//
// Scripts are re-loaded when a server answers NOSCRIPT (after a restart
// or a failover).
//
// Reading TIME before the SET NX makes a new entry's lease start up to one
// round trip earlier than the write: the lease is shorter by that much,
// never longer.
//
// # Failures
//
// Timeouts, refused connections, a full server (OOM under noeviction) and
// a server that stops answering surface as errors wrapping
// dedupe.ErrStoreUnavailable: no decision of the batch may be assumed.
// Decisions survive a server restart only if the server persists every
// write: appendonly yes with appendfsync always. With weaker settings a
// restart can forget the last second of decisions, and a redelivered
// record of a forgotten key is decided first again.
//
// # Replicas
//
// Replication is asynchronous: a failover (Sentinel, Cluster) promotes a
// replica that may lack the master's last writes, and every key among them
// is decided first again. WithReplicas(n, timeout) closes that gap: every
// round trip that writes (decide, renew, complete; never lookup) carries,
// behind its commands and on the same connection, one WAIT n timeout (on
// Redis 7.2 and later with appendonly yes, WAITAOF 1 n timeout, which also
// waits for the fsyncs, if a probe at the first write shows the replicas
// acknowledge fsyncs: replicas without appendonly never do). WAIT
// counts what the replicas have of this connection's writes, which is why
// it cannot travel on another. On a Cluster the round trip becomes one
// pipeline per master, each with its own WAIT, sent in parallel. Fewer
// acknowledgements than n is dedupe.ErrNotReplicated, a retryable store
// error: the write was made but is no decision, the partition pauses, and
// the retry under the same owner token resumes the same keys.
//
// # A store that forgot
//
// Redis can lose its data behind the store's back (FLUSHALL, a restart
// without persistence, a failover onto a replica that never synced, a
// Cluster node restored empty), and a store that decided on would decide
// first again every key it lost. So the store keeps a generation marker
// where the decisions live, one string without expiry under the prefix:
// <prefix>:marker, or on a Cluster one per hash slot,
// <prefix>:marker:{N} with N a tag of that slot (marker.go). The first
// call arms it (SET NX: stores arming at once arm one generation). Every
// round trip that decides, renews or completes carries a GET of the
// marker of each slot it writes to, behind the writes and on the same
// connection; an answer other than the armed value fails the call with
// dedupe.ErrStoreForgot (retryable: the records stay undecided), records
// the loss in the markers for every store to see (Forgot reports it), and
// holds every call until AcceptLoss arms a new generation or the hold
// (WithForgetHold, the longest window) has passed on the server's clock.
//
// CheckServer reads the settings of every master at start and refuses
// those that lose state silently: an eviction policy (every entry has a
// TTL, so volatile-* policies evict them too), appendonly no without
// replica acknowledgement, fewer replicas than n.
package redisstore
