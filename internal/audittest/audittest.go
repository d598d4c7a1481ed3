// Package audittest plants known patterns in a command topic (retries
// with volatile fields, reordered arrays, real conflicts, keys reused
// hours later, garbage) and checks that an audit finds exactly them. The
// tests of the audit package, of the command line and the benchmarks
// share it.
package audittest

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"

	"github.com/idemstream/idemstream/audit"
	"github.com/idemstream/idemstream/dedupe"
)

// Planted is a command topic whose retries, conflicts, reuses and garbage
// are known, so that the audit's findings can be checked exactly.
type Planted struct {
	Records []dedupe.Record
	// What the audit must find.
	Records0, Keys, Multi            int64
	Copies1, Copies2, Copies3        int64
	Retries, RetriedKeys             int64
	ReorderedKeys, ConflictKeys      int64
	ReusedKeys                       int64
	Missing, BadKey, Malformed, Big  int64
	Idemstream, RawBody, KeyOnly     audit.Counts
	ReusedExamples                   []string
	ConflictExample, ConflictPointer string
}

type item struct {
	SKU string `json:"sku"`
	Qty int    `json:"qty"`
}

type command struct {
	UserID     string `json:"user_id"`
	OrderID    string `json:"order_id"`
	Amount     int    `json:"amount"`
	Items      []item `json:"items"`
	ClientTime string `json:"client_time"`
	RetryCount int    `json:"retry_count"`
	TraceID    string `json:"trace_id"`
}

func uuidOf(i int) string { return fmt.Sprintf("00000000-0000-4000-8000-%012d", i) }

// Plant builds the topic: 200 keys, one command each at one-second steps;
// keys 0-159 retried 1 to 3 times (2 s, 2 s, 4 s later) with a new
// client_time, retry_count and trace_id, every fourth of them with the
// items in another order; keys 160-169 sent again 5 s later with another
// amount (a real conflict); keys 170-171 used again three hours later for
// another order (a business key); ten garbage records.
func Plant(topic string, partitions int) Planted {
	// Recent times: a real broker's retention would delete older records.
	t0 := time.Now().Add(-4 * time.Hour).Truncate(time.Second)
	var recs []rec
	enc := func(c command) []byte { b, _ := json.Marshal(c); return b }
	clock := func(t time.Time) string { return t.Format(time.RFC3339Nano) }
	base := func(i int, at time.Time) command {
		return command{UserID: fmt.Sprintf("u-%03d", i), OrderID: fmt.Sprintf("o-%03d", i), Amount: 50,
			Items:      []item{{"A-1", 1}, {"B-2", 2}, {"C-3", 1}},
			ClientTime: clock(at), TraceID: fmt.Sprintf("%016x", i*7919)}
	}
	p := Planted{}
	for i := range 200 {
		at := t0.Add(time.Duration(i) * time.Second)
		recs = append(recs, rec{at, uuidOf(i), enc(base(i, at))})
	}
	for i := range 160 {
		offsets := []time.Duration{2 * time.Second, 4 * time.Second, 8 * time.Second}[:1+i%3]
		for k, off := range offsets {
			at := t0.Add(time.Duration(i)*time.Second + off)
			c := base(i, at)
			c.RetryCount, c.TraceID = k+1, fmt.Sprintf("%016x", i*7919+k+1)
			if i%4 == 0 {
				c.Items = []item{c.Items[1], c.Items[2], c.Items[0]}
			}
			recs = append(recs, rec{at, uuidOf(i), enc(c)})
			p.Retries++
		}
		if i%4 == 0 {
			p.ReorderedKeys++
		}
	}
	for i := 160; i < 170; i++ {
		at := t0.Add(time.Duration(i)*time.Second + 5*time.Second)
		c := base(i, at)
		c.Amount, c.RetryCount, c.TraceID = 100, 1, "ffff"
		recs = append(recs, rec{at, uuidOf(i), enc(c)})
	}
	for i := 170; i < 172; i++ {
		at := t0.Add(time.Duration(i)*time.Second + 3*time.Hour)
		c := base(i, at)
		c.OrderID, c.Amount, c.Items = fmt.Sprintf("o-%03d-b", i), 70, []item{{"D-4", 1}}
		recs = append(recs, rec{at, uuidOf(i), enc(c)})
		p.ReusedExamples = append(p.ReusedExamples, uuidOf(i))
	}
	garbageAt := t0.Add(30 * time.Second)
	for range 3 {
		recs = append(recs, rec{garbageAt, "", enc(base(999, garbageAt))})
	}
	for _, k := range []string{"order-17", "9F8A"} {
		recs = append(recs, rec{garbageAt, k, enc(base(998, garbageAt))})
	}
	for j := range 4 {
		recs = append(recs, rec{garbageAt, uuidOf(500 + j), []byte(`{"user_id":"u-9",`)})
	}
	recs = append(recs, rec{garbageAt, uuidOf(600), []byte(`{"pad":"` + strings.Repeat("x", 5000) + `"}`)})

	p.Records = place(topic, partitions, recs)
	p.Records0 = int64(len(recs))
	p.expect()
	return p
}

// rec is a planted record before it is placed.
type rec struct {
	at   time.Time
	key  string // "" for none
	body []byte
}

// place puts recs on the topic's partitions in time order: a keyed record
// by the key's last byte, the others round the partitions.
func place(topic string, partitions int, recs []rec) []dedupe.Record {
	slices.SortStableFunc(recs, func(a, b rec) int { return a.at.Compare(b.at) })
	next := make([]int64, partitions)
	var out []dedupe.Record
	for i, r := range recs {
		part := i % partitions
		if r.key != "" {
			part = int(r.key[len(r.key)-1]) % partitions
		}
		var hs []dedupe.Header
		if r.key != "" {
			hs = []dedupe.Header{{Key: "Idempotency-Key", Value: []byte(r.key)}}
		}
		out = append(out, dedupe.Record{Topic: topic, Partition: part, Offset: next[part], Value: r.body, Headers: hs, Time: r.at})
		next[part]++
	}
	return out
}

// expect fills in what an audit of the planted records must find.
func (p *Planted) expect() {
	p.Keys, p.Multi = 200, 172
	p.Copies1, p.Copies2, p.Copies3 = 28, 54+10+2, 106
	p.RetriedKeys = 160 + 10
	p.ConflictKeys, p.ConflictPointer, p.ConflictExample = 10, "/amount", "100"
	p.ReusedKeys = 2
	p.Missing, p.BadKey, p.Malformed, p.Big = 3, 2, 4, 1
	p.Idemstream = audit.Counts{First: 202, Replay: 319, Conflict: 10, Invalid: 10}
	// The raw rule takes malformed JSON as bytes like any other.
	p.RawBody = audit.Counts{First: 531 + 4, Invalid: 6}
	p.KeyOnly = audit.Counts{First: 206, Replay: 329, Invalid: 6, Mismatch: 329}
}

// Policy is the key rule of the planted topic: the Idempotency-Key
// header, a UUID, payloads up to 4 KB.
func Policy(t testing.TB) dedupe.Policy {
	t.Helper()
	f, err := dedupe.ParseKeyFormat("uuid")
	if err != nil {
		t.Fatal(err)
	}
	return dedupe.Policy{
		Pipeline: "audit",
		Key:      dedupe.KeySpec{From: dedupe.KeyFromHeader, Name: "Idempotency-Key", Format: f, MaxLength: 128},
		// 4 KB: the 5,000-byte record is payload_too_large.
		MaxPayloadBytes: 4096,
	}
}

// Check asserts the findings an audit without rules must make on
// the planted topic.
func Check(t *testing.T, p Planted, r *audit.Report) {
	t.Helper()
	eq := func(what string, got, want any) {
		t.Helper()
		if fmt.Sprint(got) != fmt.Sprint(want) {
			t.Errorf("%s = %v, want %v", what, got, want)
		}
	}
	eq("records", r.Records, p.Records0)
	eq("keys", r.Keys, p.Keys)
	eq("copies", r.Copies, map[string]int64{"1": p.Copies1, "2": p.Copies2, "3+": p.Copies3})
	eq("retries", r.Retries, p.Retries+p.ConflictKeys+p.ReusedKeys)
	eq("invalid", r.Invalid, map[string]int64{"missing_key": p.Missing, "invalid_key": p.BadKey, "malformed_payload": p.Malformed, "payload_too_large": p.Big})
	for reason, ex := range r.InvalidExamples {
		for _, e := range ex {
			if !strings.HasPrefix(e, r.Topic+"/") || strings.Count(e, "/") != 2 {
				t.Errorf("invalid example %q of %s is not topic/partition/offset", e, reason)
			}
		}
	}

	var vol []string
	for _, c := range r.VolatileCandidates {
		vol = append(vol, c.Pointer)
		eq("keys of "+c.Pointer, c.Keys, p.RetriedKeys)
		eq("share of "+c.Pointer, c.Share, float64(int64(float64(p.RetriedKeys)/float64(p.Multi)*1000+0.5))/1000)
		if len(c.Examples) != 2 || c.Examples[0] == c.Examples[1] {
			t.Errorf("examples of %s = %q, want two different values", c.Pointer, c.Examples)
		}
	}
	eq("volatile candidates", vol, []string{"/client_time", "/retry_count", "/trace_id"})
	var unord []string
	for _, c := range r.UnorderedCandidates {
		unord = append(unord, c.Pointer)
		eq("keys of unordered "+c.Pointer, c.Keys, p.ReorderedKeys)
	}
	eq("unordered candidates", unord, []string{"/items"})
	eq("conflict keys", r.Conflicts.Keys, p.ConflictKeys)
	if len(r.Conflicts.Pointers) != 1 {
		t.Fatalf("conflict pointers = %+v, want only %s", r.Conflicts.Pointers, p.ConflictPointer)
	}
	c := r.Conflicts.Pointers[0]
	eq("conflict pointer", c.Pointer, p.ConflictPointer)
	eq("conflict pointer keys", c.Keys, p.ConflictKeys)
	eq("conflict example", c.Examples, []string{p.ConflictExample})

	eq("retry interval count", r.RetryInterval.Count, p.Retries+p.ConflictKeys+p.ReusedKeys)
	eq("retry interval p50", r.RetryInterval.P50, "2s")
	eq("retry interval p99", r.RetryInterval.P99, "5s")
	eq("retry interval max", r.RetryInterval.Max, "3h")
	eq("suggested", fmt.Sprintf("%s %s %v %v", r.Suggested.Window, r.Suggested.ClientMaxRetryInterval, r.Suggested.Volatile, r.Suggested.Unordered),
		"10m 5s [/client_time /retry_count /trace_id] [/items]")
	eq("reused after window", r.ReusedAfterWindow.Keys, p.ReusedKeys)
	eq("reused examples", r.ReusedAfterWindow.Examples, p.ReusedExamples)

	eq("idemstream decisions", r.Decisions.Idemstream, p.Idemstream)
	eq("raw body decisions", r.Decisions.RawBody, p.RawBody)
	eq("key only decisions", r.Decisions.KeyOnly, p.KeyOnly)
	for name, d := range map[string]audit.Counts{"idemstream": r.Decisions.Idemstream, "raw_body": r.Decisions.RawBody, "key_only": r.Decisions.KeyOnly} {
		if sum := d.First + d.Replay + d.Conflict + d.Invalid; sum != r.Records {
			t.Errorf("%s: first+replay+conflict+invalid = %d, want every record (%d)", name, sum, r.Records)
		}
	}
}

// Produce writes the records to their partitions, in order, with their
// timestamps, and returns the records as the broker numbered them.
func Produce(t testing.TB, client *kafka.Client, topic string, recs []dedupe.Record) []dedupe.Record {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	byPart := map[int][]int{}
	for i, r := range recs {
		byPart[r.Partition] = append(byPart[r.Partition], i)
	}
	out := append([]dedupe.Record(nil), recs...)
	for p, idx := range byPart {
		for start := 0; start < len(idx); start += 500 {
			chunk := idx[start:min(start+500, len(idx))]
			krecs := make([]kafka.Record, len(chunk))
			for j, i := range chunk {
				r := recs[i]
				hs := make([]kafka.Header, len(r.Headers))
				for h, hd := range r.Headers {
					hs[h] = kafka.Header{Key: hd.Key, Value: hd.Value}
				}
				krecs[j] = kafka.Record{Time: r.Time, Value: kafka.NewBytes(r.Value), Headers: hs}
			}
			res, err := client.Produce(ctx, &kafka.ProduceRequest{Topic: topic, Partition: p, RequiredAcks: kafka.RequireAll,
				Records: kafka.NewRecordReader(krecs...)})
			if err == nil && res.Error != nil {
				err = res.Error
			}
			if err != nil {
				t.Fatalf("produce to %s/%d: %v", topic, p, err)
			}
			for j, i := range chunk {
				out[i].Topic, out[i].Offset = topic, res.BaseOffset+int64(j)
			}
		}
	}
	return out
}

// Command1K is a command of about 1 KB, as the benchmarks read: an order
// with five items, an address and a note, and the fields a retry changes
// (client_time, retry_count, trace_id). Copy 0 is the first; each copy
// after it changes the volatile fields, and every third one also the
// order of the items.
func Command1K(key string, n, copy int, at time.Time) []byte {
	items := make([]string, 5)
	for i := range items {
		items[i] = fmt.Sprintf(`{"sku":"SKU-%05d-%d","qty":%d,"price":%d.%02d,"name":"item %d of order %d"}`, (n*7+i)%100000, i, 1+(n+i)%3, 5+(n*i)%90, (n+i)%100, i, n)
	}
	if copy > 0 && copy%3 == 0 {
		items = append(items[2:], items[:2]...)
	}
	note := strings.Repeat("please leave the parcel at the door ", 9)
	return fmt.Appendf(nil, `{"order_id":"o-%d","user_id":"u-%d","coupon_id":%d,"amount":%d.50,"currency":"EUR",`+
		`"items":[%s],"address":{"street":"%d Long Road","city":"Springfield","zip":"%05d","country":"DE"},`+
		`"note":"%s","key":"%s","client_time":"%s","retry_count":%d,"trace_id":"%016x"}`,
		n, n%50000, 10000+n%500, 20+n%300, strings.Join(items, ","), n%999, n%99999, note, key,
		at.Format(time.RFC3339Nano), copy, uint64(n)*2654435761+uint64(copy))
}

// Stream1K returns n records of about 1 KB on the given partitions, in
// time order 5 ms apart: one record in four is a retry (a second or
// third copy) of a key sent up to 5,000 records (25 s) before.
func Stream1K(topic string, partitions, n int, t0 time.Time) []dedupe.Record {
	out := make([]dedupe.Record, 0, n)
	next := make([]int64, partitions)
	type sent struct{ key, copies int }
	var recent []sent
	keys := 0
	for i := range n {
		at := t0.Add(time.Duration(i) * 5 * time.Millisecond)
		k, copy := keys, 0
		if i%4 == 3 && len(recent) > 0 {
			j := len(recent) - 1 - int(uint64(i)*2654435761%uint64(min(len(recent), 5000)))
			recent[j].copies++
			k, copy = recent[j].key, recent[j].copies
		} else {
			recent = append(recent, sent{key: k})
			if len(recent) > 10000 {
				recent = append(recent[:0], recent[5000:]...)
			}
			keys++
		}
		key := fmt.Sprintf("%08x-0000-4000-8000-%012d", k, k)
		part := k % partitions
		out = append(out, dedupe.Record{Topic: topic, Partition: part, Offset: next[part], Time: at,
			Headers: []dedupe.Header{{Key: "Idempotency-Key", Value: []byte(key)}},
			Value:   Command1K(key, k, copy, at)})
		next[part]++
	}
	return out
}
