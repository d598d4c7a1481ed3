package load

import (
	"container/heap"
	"fmt"
	"math/rand/v2"
	"strconv"

	"github.com/segmentio/kafka-go"
)

// The pipeline rules the workload is made for.
var (
	volatilePaths  = []string{"/client_time", "/retry_count", "/trace_id", "/items/*/client_ts"}
	unorderedPaths = []string{"/items"}
)

const (
	keyHeader  = "Idempotency-Key"
	copyHeader = "load-copy" // "1" for a key's first record, "2" for its retry
	sentHeader = "load-sent" // unix nanoseconds at produce, for the latency run
	retryShare = 0.3         // of the keys are sent twice
)

// workload produces the records of a run in order: each key's first copy,
// and for 30 % of the keys a retry between 50 and 2,000 records later (so
// that some retries land in the same fetch as their first copy, most in a
// later one). Deterministic for a seed.
type workload struct {
	rng     *rand.Rand
	run     string // makes keys unique per run on a shared Redis
	keys    int
	retries int
	seq     int
	pending retryHeap
}

type retry struct {
	due int
	key int
}

type retryHeap []retry

func (h retryHeap) Len() int           { return len(h) }
func (h retryHeap) Less(i, j int) bool { return h[i].due < h[j].due }
func (h retryHeap) Swap(i, j int)      { h[i], h[j] = h[j], h[i] }
func (h *retryHeap) Push(x any)        { *h = append(*h, x.(retry)) }
func (h *retryHeap) Pop() any {
	old := *h
	r := old[len(old)-1]
	*h = old[:len(old)-1]
	return r
}

func newWorkload(seed uint64, run string) *workload {
	return &workload{rng: rand.New(rand.NewPCG(seed, 0x10ad)), run: run}
}

// next returns the next record. left is how many records the caller will
// still ask for after this one (-1: unbounded): with a bound, the retries
// promised are all delivered within it, so that n records hold exactly
// every retry of the keys they started.
func (w *workload) next(left int) kafka.Message {
	defer func() { w.seq++ }()
	if len(w.pending) > 0 && (w.pending[0].due <= w.seq || (left >= 0 && left < len(w.pending))) {
		r := heap.Pop(&w.pending).(retry)
		w.retries++
		return w.record(r.key, 2)
	}
	k := w.keys
	w.keys++
	if w.rng.Float64() < retryShare && (left < 0 || left > len(w.pending)) {
		heap.Push(&w.pending, retry{due: w.seq + 50 + w.rng.IntN(1950), key: k})
	}
	return w.record(k, 1)
}

// key is a UUID (version 4 layout) unique to the run and the index.
func (w *workload) key(k int) string {
	return fmt.Sprintf("%08x-%04x-4%03x-8%03x-%012x", hash32(w.run), k>>28&0xffff, k>>16&0xfff, k>>4&0xfff, k)
}

func hash32(s string) uint32 {
	h := uint32(2166136261)
	for i := 0; i < len(s); i++ {
		h = (h ^ uint32(s[i])) * 16777619
	}
	return h
}

var skus = []string{"A-1", "B-2", "C-3", "D-4", "E-5", "F-6", "G-7", "H-8"}

// record builds copy c (1 or 2) of key k: about 1 KB of JSON. The retry
// has other volatile values, its items in reverse order and its members in
// another order: the same request under the pipeline's rules, other bytes.
func (w *workload) record(k, c int) kafka.Message {
	key := w.key(k)
	retry := c == 2
	b := make([]byte, 0, 1152)
	if retry {
		b = fmt.Appendf(b, `{"trace_id":"%016x%016x","retry_count":1,"client_time":"2026-06-18T10:%02d:%02d.%03dZ",`,
			w.rng.Uint64(), w.rng.Uint64(), k%60, (k+7)%60, w.rng.IntN(1000))
	} else {
		b = fmt.Appendf(b, `{"client_time":"2026-06-18T10:%02d:%02d.%03dZ","retry_count":0,"trace_id":"%016x%016x",`,
			k%60, k%60, k%1000, uint64(k)*0x9e3779b97f4a7c15, uint64(k))
	}
	b = fmt.Appendf(b, `"user_id":"u-%d","coupon_id":%d,"campaign":"spring-%d","amount":%d.%02d,"currency":"EUR","items":[`,
		k%100000, 10000+k%500, k%7, 10+k%90, k%100)
	const nItems = 4
	for j := range nItems {
		i := j
		if retry {
			i = nItems - 1 - j
		}
		if j > 0 {
			b = append(b, ',')
		}
		b = fmt.Appendf(b, `{"sku":"%s","qty":%d,"price":%d.%02d,"client_ts":%d}`,
			skus[(k+i)%len(skus)], 1+(k+i)%3, 1+(k*i)%50, (k+i)%100, 1718000000000+int64(k)*10+int64(i)+int64(c)*1000)
	}
	b = fmt.Appendf(b, `],"shipping":{"name":"Customer %d","street":"%d Long Street","city":"Springfield","zip":"%05d","country":"DE"},"note":"`,
		k, 1+k%400, k%100000)
	for len(b) < 1000 {
		b = append(b, "deliver to the front desk, ring twice; "...)
	}
	b = append(b, `"}`...)
	return kafka.Message{
		Key:   []byte(key),
		Value: b,
		Headers: []kafka.Header{
			{Key: keyHeader, Value: []byte(key)},
			{Key: copyHeader, Value: []byte(strconv.Itoa(c))},
		},
	}
}

// header returns the value of the first header named key, or "".
func header(hs []kafka.Header, key string) string {
	for _, h := range hs {
		if h.Key == key {
			return string(h.Value)
		}
	}
	return ""
}
