package dlq_test

import (
	"context"
	"fmt"
	"time"

	"github.com/idemstream/idemstream/audit"
	"github.com/idemstream/idemstream/dedupe"
	"github.com/idemstream/idemstream/dlq"
)

// A dead letter is the input record followed by idemstream's evidence.
// Parse tells them apart: Original is what the producer sent.
func ExampleParse() {
	h := func(k, v string) dedupe.Header { return dedupe.Header{Key: k, Value: []byte(v)} }
	rec := dedupe.Record{Topic: "claims.dlq", Partition: 2, Offset: 41, Key: []byte("u-1024"), Value: []byte(`{"coupon":"SPRING24"}`),
		Headers: []dedupe.Header{
			h("Idempotency-Key", "k-7"), // the producer's
			h("idemstream-reason", "handler_failed"),
			h("idemstream-error", "coupon service: 503 Service Unavailable"),
			h("idemstream-source", "claims/0/1042"),
			h("idemstream-key", "k-7"),
		}}
	d := dlq.Parse(&rec)
	fmt.Println(d.Reason, "at", d.At, "from", d.Source)
	fmt.Println("error:", d.Error)
	key, value, headers := d.Original()
	fmt.Printf("original: key %s, value %s, %d header(s)\n", key, value, len(headers))
	fmt.Println("redrive sends it without --force:", dlq.Redrivable(d.Reason))
	// Output:
	// handler_failed at claims.dlq/2/41 from claims/0/1042
	// error: coupon service: 503 Service Unavailable
	// original: key u-1024, value {"coupon":"SPRING24"}, 1 header(s)
	// redrive sends it without --force: true
}

// Summarize counts the dead letters of a source: here records held in
// memory, in production an audit.KafkaTopic.
func ExampleSummarize() {
	at := time.Date(2026, 3, 1, 10, 0, 0, 0, time.UTC)
	letter := func(offset int64, reason, key string, minutes int) dedupe.Record {
		return dedupe.Record{Topic: "claims.dlq", Offset: offset, Time: at.Add(time.Duration(minutes) * time.Minute), Headers: []dedupe.Header{
			{Key: "idemstream-reason", Value: []byte(reason)},
			{Key: "idemstream-source", Value: []byte(fmt.Sprintf("claims/0/%d", offset))},
			{Key: "idemstream-key", Value: []byte(key)},
		}}
	}
	topic := audit.Records{
		letter(0, "handler_failed", "k-1", 0), letter(1, "handler_failed", "k-2", 20),
		letter(2, "conflict", "k-3", 30), letter(3, "handler_failed", "k-1", 75),
	}
	sum, err := dlq.Summarize(context.Background(), topic, dlq.SummaryOptions{Pipeline: "coupon-claim", Topic: "claims.dlq", Input: "claims"})
	if err != nil {
		panic(err)
	}
	for _, r := range sum.Reasons {
		fmt.Printf("%s: %d dead letters of %d keys, redrivable %v\n", r.Reason, r.Count, r.Keys, r.Redrivable)
	}
	for _, h := range sum.Hours {
		fmt.Printf("%s: %d\n", h.Hour.Format("15:04"), h.Count)
	}
	// Output:
	// handler_failed: 3 dead letters of 2 keys, redrivable true
	// conflict: 1 dead letters of 1 keys, redrivable false
	// 10:00: 3
	// 11:00: 1
}
