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
	// avroID, when set, makes the records Avro under that schema id
	// (avro_test.go) instead of JSON text.
	avroID uint32
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

const (
	nItems     = 4
	notePhrase = "deliver to the front desk, ring twice; "
)

// command is one record's values: what the JSON text and the Avro
// encoding (avro_test.go) both write. Amounts are in cents.
type command struct {
	retry                         bool // a retry: the JSON puts its volatile members first, in another order
	clientTime, traceID           string
	retryCount                    int
	userID, campaign, currency    string
	couponID, amount              int
	items                         [nItems]item // in the record's order
	shipName, shipStreet, shipZip string
	note                          string
}

type item struct {
	sku        string
	qty, price int
	clientTS   int64
}

const (
	shipCity    = "Springfield"
	shipCountry = "DE"
)

// command builds copy c (1 or 2) of key k. The retry has other volatile
// values, its items in reverse order and its members in another order:
// the same request under the pipeline's rules, other bytes.
func (w *workload) command(k, c int) command {
	cmd := command{retry: c == 2, retryCount: c - 1}
	if cmd.retry {
		// In this order: the rng's draws make the run's records.
		cmd.traceID = fmt.Sprintf("%016x%016x", w.rng.Uint64(), w.rng.Uint64())
		cmd.clientTime = fmt.Sprintf("2026-06-18T10:%02d:%02d.%03dZ", k%60, (k+7)%60, w.rng.IntN(1000))
	} else {
		cmd.clientTime = fmt.Sprintf("2026-06-18T10:%02d:%02d.%03dZ", k%60, k%60, k%1000)
		cmd.traceID = fmt.Sprintf("%016x%016x", uint64(k)*0x9e3779b97f4a7c15, uint64(k))
	}
	cmd.userID, cmd.couponID, cmd.campaign = fmt.Sprintf("u-%d", k%100000), 10000+k%500, fmt.Sprintf("spring-%d", k%7)
	cmd.amount, cmd.currency = (10+k%90)*100+k%100, "EUR"
	for j := range nItems {
		i := j
		if cmd.retry {
			i = nItems - 1 - j
		}
		cmd.items[j] = item{sku: skus[(k+i)%len(skus)], qty: 1 + (k+i)%3, price: (1+(k*i)%50)*100 + (k+i)%100,
			clientTS: 1718000000000 + int64(k)*10 + int64(i) + int64(c)*1000}
	}
	cmd.shipName, cmd.shipStreet, cmd.shipZip = fmt.Sprintf("Customer %d", k), fmt.Sprintf("%d Long Street", 1+k%400), fmt.Sprintf("%05d", k%100000)
	// The note pads the JSON text to about 1 KB: phrases until the text
	// before the note's closing quote is 1,000 bytes or more.
	for head := len(cmd.appendJSON(nil)) - len(`"}`); head < 1000; head += len(notePhrase) {
		cmd.note += notePhrase
	}
	return cmd
}

// appendJSON appends the command as JSON text: about 1 KB.
func (cmd *command) appendJSON(b []byte) []byte {
	if cmd.retry {
		b = fmt.Appendf(b, `{"trace_id":"%s","retry_count":%d,"client_time":"%s",`, cmd.traceID, cmd.retryCount, cmd.clientTime)
	} else {
		b = fmt.Appendf(b, `{"client_time":"%s","retry_count":%d,"trace_id":"%s",`, cmd.clientTime, cmd.retryCount, cmd.traceID)
	}
	b = fmt.Appendf(b, `"user_id":"%s","coupon_id":%d,"campaign":"%s","amount":%d.%02d,"currency":"%s","items":[`,
		cmd.userID, cmd.couponID, cmd.campaign, cmd.amount/100, cmd.amount%100, cmd.currency)
	for j, it := range cmd.items {
		if j > 0 {
			b = append(b, ',')
		}
		b = fmt.Appendf(b, `{"sku":"%s","qty":%d,"price":%d.%02d,"client_ts":%d}`, it.sku, it.qty, it.price/100, it.price%100, it.clientTS)
	}
	b = fmt.Appendf(b, `],"shipping":{"name":"%s","street":"%s","city":"%s","zip":"%s","country":"%s"},"note":"%s"}`,
		cmd.shipName, cmd.shipStreet, shipCity, cmd.shipZip, shipCountry, cmd.note)
	return b
}

// record builds copy c (1 or 2) of key k as the workload's payload: JSON
// text, or Avro in the registry's wire format when avroID is set.
func (w *workload) record(k, c int) kafka.Message {
	key := w.key(k)
	cmd := w.command(k, c)
	var value []byte
	if w.avroID != 0 {
		value = cmd.appendAvro(make([]byte, 0, 512), w.avroID)
	} else {
		value = cmd.appendJSON(make([]byte, 0, 1152))
	}
	return kafka.Message{
		Key:   []byte(key),
		Value: value,
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
