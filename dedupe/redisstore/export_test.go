package redisstore

// FastPathMin is the smallest batch that takes the SET NX path, for the
// black-box tests that must take it.
const FastPathMin = fastPathMin

// RedisKey is the name of a key's entry, for the black-box tests.
func (s *Store) RedisKey(namespace, key string) string { return s.redisKey(namespace, key) }

// WithoutSetIfEq makes s finish its batches under WATCH whatever the
// server has, for the benchmarks that compare both on one server.
func WithoutSetIfEq(s *Store) { s.cas.Store(int32(casUnsupported)) }
