package audit

import (
	"math/bits"
	"time"
)

// histogram counts durations in log-linear buckets, 32 per power of two,
// so that a percentile is known within about 3% in a fixed 30 KB,
// whatever the number of retries.
type histogram struct {
	counts [nBuckets]uint64
	// top is the largest value seen in each bucket: a percentile is
	// reported as a value that occurred, not as a bucket bound.
	top [nBuckets]time.Duration
	n   uint64
	max time.Duration
}

const nBuckets = 64 + 58*32

func bucketOf(v uint64) int {
	if v < 64 {
		return int(v)
	}
	shift := bits.Len64(v) - 6
	return 64 + (shift-1)*32 + int(v>>shift) - 32
}

func (h *histogram) add(d time.Duration) {
	if d < 0 {
		d = 0
	}
	b := bucketOf(uint64(d))
	h.counts[b]++
	h.top[b] = max(h.top[b], d)
	h.n++
	h.max = max(h.max, d)
}

// quantile returns a value at or above the q-quantile, by at most the
// width of one bucket (about 3%): the largest value seen in the bucket
// that holds the quantile.
func (h *histogram) quantile(q float64) time.Duration {
	if h.n == 0 {
		return 0
	}
	rank := uint64(q*float64(h.n) + 0.999999)
	rank = min(max(rank, 1), h.n)
	var seen uint64
	for i, c := range h.counts {
		seen += c
		if seen >= rank {
			return h.top[i]
		}
	}
	return h.max
}

// merge adds the counts of o.
func (h *histogram) merge(o *histogram) {
	for i := range h.counts {
		h.counts[i] += o.counts[i]
		h.top[i] = max(h.top[i], o.top[i])
	}
	h.n += o.n
	h.max = max(h.max, o.max)
}
