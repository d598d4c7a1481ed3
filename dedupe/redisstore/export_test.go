package redisstore

// FastPathMin is the smallest batch that takes the SET NX path, for the
// black-box tests that must take it.
const FastPathMin = fastPathMin
