package consumer_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/idemstream/idemstream/consumer"
	"github.com/idemstream/idemstream/dedupe"
	"github.com/idemstream/idemstream/sinks"
)

// A new group starts where the pipeline says: at the latest record it
// decides only what is written from then on, at a time only what came at
// or after it; the earliest is the default.
func TestNewGroupStartsWhereConfigured(t *testing.T) {
	for _, tc := range []struct {
		name  string
		start consumer.StartAt
		want  int // results for the 3 old and 2 new records
	}{
		{"earliest", consumer.StartAt{}, 5},
		{"latest", consumer.StartAt{Latest: true}, 2},
		{"pastTime", consumer.StartAt{Time: time.Now().Add(-time.Hour)}, 5},
		// No record at or after the time: the end, like kafka-consumer-groups --to-datetime.
		{"timeAfterEveryRecord", consumer.StartAt{Time: time.Now().Add(time.Hour)}, 2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := newRig(t, 1)
			r.produce(cmd{"old-1", `{"a":1}`, 0}, cmd{"old-2", `{"a":2}`, 0}, cmd{"old-3", `{"a":3}`, 0})
			cfg := r.config(r.policy(dedupe.Strict), nil, nil, "test")
			cfg.Start = tc.start
			stop := r.start(cfg)
			defer stop()
			// Joined and fetching: the partition's lag is known.
			waitFor(t, "the partition's first fetch", func() bool { return lagKnown(r) })
			r.produce(cmd{"new-1", `{"a":4}`, 0}, cmd{"new-2", `{"a":5}`, 0})
			waitFor(t, "the offset at the end", func() bool { return r.committed("g-p", 0) == 5 })
			if got := len(r.readAll("out")); got != tc.want {
				t.Errorf("%d results, want %d", got, tc.want)
			}
		})
	}
}

func lagKnown(r *rig) bool {
	n, err := r.reg.Gather()
	if err != nil {
		return false
	}
	for _, f := range n {
		if f.GetName() == "idemstream_consumer_lag" && len(f.GetMetric()) > 0 {
			return true
		}
	}
	return false
}

// A pipeline whose output holds results written under another identity (a
// renamed pipeline, prefix or group, a new key rule) refuses to start, and
// names the identity to accept; accepted, it starts.
func TestChangedIdentityRefusesToStart(t *testing.T) {
	r := newRig(t, 1)
	old := "input=in output=out group=g-old namespace=idem:old key=header:Idempotency-Key:any"
	if _, err := r.io.Write(context.Background(), []sinks.Message{{Topic: "out", Partition: 0, Value: []byte("{}"),
		Headers: []dedupe.Header{{Key: sinks.HeaderKey, Value: []byte("k")}, {Key: sinks.HeaderPipeline, Value: []byte(old)}}}}); err != nil {
		t.Fatal(err)
	}
	cfg := r.config(r.policy(dedupe.Strict), nil, nil, "test")
	cfg.Identity = "input=in output=out group=g-p namespace=idem:p key=header:Idempotency-Key:any"
	p, err := consumer.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	err = p.Run(context.Background())
	if !errors.Is(err, consumer.ErrIdentityChanged) || !errors.Is(err, dedupe.ErrBrokerRefused) {
		t.Fatalf("Run = %v, want ErrIdentityChanged", err)
	}
	if want := fmt.Sprintf("accept_identity to %q", old); !strings.Contains(err.Error(), want) {
		t.Errorf("error %q does not name the identity to accept", err)
	}
	cfg.AcceptIdentity = old
	r.produce(cmd{"k1", `{"a":1}`, 0})
	stop := r.start(cfg)
	defer stop()
	waitFor(t, "k1's result", func() bool { return r.resultsPerKey()["k1"] == 1 })
	for _, res := range r.readAll("out") {
		if header(res, "idemstream-key") == "k1" && header(res, "idemstream-pipeline") != cfg.Identity {
			t.Errorf("k1's result names identity %q, want %q", header(res, "idemstream-pipeline"), cfg.Identity)
		}
	}
}
