package redisstore

import (
	"crypto/sha256"
	"encoding/hex"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
)

// maxKeyInName is the longest idempotency key kept verbatim in a Redis key
// name; longer keys are hashed so that names stay bounded.
const maxKeyInName = 64

// Store is a dedupe.Store on Redis. It is safe for concurrent use; it owns
// no goroutine and does not close the client.
type Store struct {
	client redis.UniversalClient
	prefix string
	acks   replicaAcks
	cas    atomic.Int32 // a casState
	// What the SET NX of Decide wrote, for completeCAS (written.go).
	written written
	// The generation marker the store decides under (marker.go).
	gen generation
	// compact: entries are written in the compact format (compact.go);
	// both formats are read whatever it says.
	compact bool
	// topics are the sources' topics a lookup resolves (WithSourceTopics).
	topics []string
	// digests are the rules digests a lookup resolves (WithRulesDigests).
	digests []string
	// hooks let the package's tests act between a read and the write
	// that depends on it, where a race would land.
	hooks hooks
}

// hooks are the points where a test may run code inside a call; nil does
// nothing. Production never sets them.
type hooks struct {
	// afterDecideRead runs after Decide's reads, before the later
	// records of a key are decided.
	afterDecideRead func()
	// beforeExec runs between a transaction's read and its EXEC.
	beforeExec func(names []string)
	// beforeCAS runs between completeCAS's read and its writes;
	// beforeReread between its first plan and the read of every entry
	// that a remembered entry's verdict calls for.
	beforeCAS    func(names []string)
	beforeReread func()
}

// New returns a Store that names its keys under prefix.
func New(client redis.UniversalClient, prefix string, opts ...Option) *Store {
	s := &Store{client: client, prefix: prefix}
	for _, o := range opts {
		o(s)
	}
	return s
}

// redisKey is the name of the Redis string that holds a key's entry: the
// namespace and key in one hash tag, so that a Cluster keeps it on one
// slot; a key too long for a name is replaced by its SHA-256.
func (s *Store) redisKey(namespace, key string) string {
	return s.prefix + ":{" + namespace + ":" + keyInName(key) + "}"
}

// keyInName is how key appears in its entry's name: itself, or its hash
// when it is too long to be a name's part.
func keyInName(key string) string {
	if len(key) > maxKeyInName {
		sum := sha256.Sum256([]byte(key))
		return "sha256:" + hex.EncodeToString(sum[:])
	}
	return key
}

func ms(d time.Duration) string { return strconv.FormatInt(d.Milliseconds(), 10) }

var valueBuffers = sync.Pool{New: func() any { b := make([]byte, 0, 64<<10); return &b }}

// fastPathMin is the smallest batch worth the extra TIME round trip of the
// SET NX path; smaller batches go to decide.lua in one round trip.
const fastPathMin = 8

// WithCompactEntries makes the store write its entries in the compact
// format (compact.go): less than half a text entry's memory. A store reads both
// formats whatever it writes; a release before the one that reads
// compact entries cannot, so no store may write them until every
// process that shares the prefix runs a release that reads them
// (docs/operations.md, "Upgrading").
func WithCompactEntries() Option {
	return func(s *Store) { s.compact = true }
}

// WithSourceTopics names the topics whose records the store's entries
// come from, so that Lookup gives their names back: a compact entry keeps
// a hash of a source's topic, which a decision or completion resolves
// against its own record's.
func WithSourceTopics(topics ...string) Option {
	return func(s *Store) { s.topics = append(s.topics, topics...) }
}

// WithRulesDigests names rules digests the store's entries may have been
// made under, so that Lookup gives them back whole: a compact entry keeps
// the first 8 bytes of a digest, which a decision resolves against its
// own.
func WithRulesDigests(digests ...string) Option {
	return func(s *Store) { s.digests = append(s.digests, digests...) }
}
