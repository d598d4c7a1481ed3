package demo

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"time"
)

// Workload shapes the campaign. Zero fields take the incident's figures.
type Workload struct {
	Seed      uint64
	Users     int     // distinct users, one claim each (397 in the incident)
	Commands  int     // records sent in all, retries included (2417)
	Stock     int     // coupons in stock (500)
	Conflicts float64 // share of records that reuse a key with another amount
	Garbage   float64 // share of records that are not valid commands
	Reorder   float64 // share of retries whose client reorders the items list
}

func (w Workload) withDefaults() Workload {
	if w.Seed == 0 {
		w.Seed = 618
	}
	if w.Users == 0 {
		w.Users = 400
	}
	if w.Commands == 0 {
		w.Commands = 2400
	}
	if w.Stock == 0 {
		w.Stock = 500
	}
	if w.Conflicts == 0 {
		w.Conflicts = 0.012
	}
	if w.Garbage == 0 {
		w.Garbage = 0.01
	}
	if w.Reorder == 0 {
		w.Reorder = 0.2
	}
	return w
}

// Command is one record the clients send.
type Command struct {
	IdemKey  string // Idempotency-Key header; "" for a record without one
	NaiveKey string // Kafka record key: the naive identity
	Body     []byte
	Kind     string // original, retry, conflict, garbage
}

// Generated is the stream and what was injected into it.
type Generated struct {
	Originals []Command
	Later     []Command // retries, conflicts and garbage, shuffled
	Retries   int       // volatile-only retries (including reordered lists)
	Conflicts int
	Garbage   int
}

type claim struct {
	UserID     string `json:"user_id"`
	CouponID   int    `json:"coupon_id"`
	Amount     int    `json:"amount"`
	Items      []item `json:"items"`
	ClientTime string `json:"client_time"`
	RetryCount int    `json:"retry_count"`
	TraceID    string `json:"trace_id"`
}

type item struct {
	SKU string `json:"sku"`
	Qty int    `json:"qty"`
}

// Generate builds a deterministic stream for the seed.
func Generate(w Workload) Generated {
	w = w.withDefaults()
	rng := rand.New(rand.NewPCG(w.Seed, w.Seed^0x9e3779b97f4a7c15))
	start := time.Date(2025, 6, 18, 0, 0, 0, 0, time.UTC)
	newKey := func() string {
		var b [16]byte
		for i := range b {
			b[i] = byte(rng.UintN(256))
		}
		b[6] = b[6]&0x0f | 0x40
		b[8] = b[8]&0x3f | 0x80
		h := hex.EncodeToString(b[:])
		return h[:8] + "-" + h[8:12] + "-" + h[12:16] + "-" + h[16:20] + "-" + h[20:]
	}
	trace := func() string { return fmt.Sprintf("%016x", rng.Uint64()) }
	clock := func(maxSeconds int) string {
		return start.Add(time.Duration(rng.IntN(maxSeconds*1000)) * time.Millisecond).Format("2006-01-02T15:04:05.000Z")
	}
	command := func(key string, c claim, kind string) Command {
		body, _ := json.Marshal(c)
		return Command{IdemKey: key, NaiveKey: naiveKey(key, body), Body: body, Kind: kind}
	}

	var g Generated
	originals := make([]claim, w.Users)
	keys := make([]string, w.Users)
	for u := range w.Users {
		skus := []string{"A-1", "B-2", "C-3", "D-4"}
		rng.Shuffle(len(skus), func(i, j int) { skus[i], skus[j] = skus[j], skus[i] })
		n := 1 + rng.IntN(3)
		items := make([]item, n)
		for i := range items {
			items[i] = item{SKU: skus[i], Qty: 1 + rng.IntN(2)}
		}
		originals[u] = claim{UserID: fmt.Sprintf("u-%04d", u+1), CouponID: 12345, Amount: 50, Items: items,
			ClientTime: clock(240), TraceID: trace()}
		keys[u] = newKey()
		g.Originals = append(g.Originals, command(keys[u], originals[u], "original"))
	}
	later := w.Commands - w.Users
	g.Garbage = int(float64(w.Commands)*w.Garbage + 0.5)
	g.Conflicts = int(float64(w.Commands)*w.Conflicts + 0.5)
	g.Retries = max(later-g.Garbage-g.Conflicts, 0)
	for range g.Retries {
		u := rng.IntN(w.Users)
		c := originals[u]
		c.RetryCount = 1 + rng.IntN(5)
		c.ClientTime = clock(240)
		c.TraceID = trace()
		if len(c.Items) > 1 && rng.Float64() < w.Reorder {
			c.Items = append([]item(nil), c.Items...)
			rng.Shuffle(len(c.Items), func(i, j int) { c.Items[i], c.Items[j] = c.Items[j], c.Items[i] })
		}
		g.Later = append(g.Later, command(keys[u], c, "retry"))
	}
	for _, u := range rng.Perm(w.Users)[:min(g.Conflicts, w.Users)] {
		c := originals[u]
		c.Amount = 100
		c.ClientTime = clock(240)
		g.Later = append(g.Later, command(keys[u], c, "conflict"))
	}
	for i := range g.Garbage {
		if i%2 == 0 {
			g.Later = append(g.Later, Command{Body: []byte(`{"user_id":"u-9999","coupon_id":12345,"amount":50}`), Kind: "garbage"})
		} else {
			key := newKey()
			body := []byte(`{"user_id":"u-9998","coupon_id":12345,"amount":50,`)
			g.Later = append(g.Later, Command{IdemKey: key, NaiveKey: naiveKey(key, body), Body: body, Kind: "garbage"})
		}
	}
	rng.Shuffle(len(g.Later), func(i, j int) { g.Later[i], g.Later[j] = g.Later[j], g.Later[i] })
	return g
}

// naiveKey is the identity of the incident's backend: the key and a hash
// of the body exactly as sent.
func naiveKey(key string, body []byte) string {
	if key == "" {
		return ""
	}
	sum := sha256.Sum256(body)
	return key + ":" + hex.EncodeToString(sum[:8])
}
