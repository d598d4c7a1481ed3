package main

import (
	"context"
	"io"
	"slices"
	"strings"
	"testing"

	"github.com/segmentio/kafka-go"

	"github.com/idemstream/idemstream/internal/testenv"
)

func TestParseNamesTheBadFlag(t *testing.T) {
	ok := []string{"--brokers", "127.0.0.1:9092", "--input", "in", "--output", "out", "--group", "g"}
	if _, err := parse(ok, io.Discard); err != nil {
		t.Fatalf("parse %v: %v", ok, err)
	}
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"--input", "in", "--output", "out", "--group", "g"}, "--brokers"},
		{[]string{"--brokers", "b", "--output", "out", "--group", "g"}, "--input"},
		{[]string{"--brokers", "b", "--input", "in", "--output", "in", "--group", "g"}, "--output"},
		{append(ok[:len(ok):len(ok)], "--batch", "0"), "--batch"},
		{append(ok[:len(ok):len(ok)], "--batch-timeout", "0s"), "--batch-timeout"},
	} {
		_, err := parse(c.args, io.Discard)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("parse %v: %v, want an error naming %s", c.args, err, c.want)
		}
	}
}

func TestParseRefusesABadFloor(t *testing.T) {
	ok := []string{"--brokers", "127.0.0.1:9092", "--input", "in", "--output", "out", "--group", "g"}
	for _, c := range []struct {
		args []string
		want string
	}{
		{append(ok[:len(ok):len(ok)], "--volatile", "client_time"), "--volatile"},
		{append(ok[:len(ok):len(ok)], "--redis", "127.0.0.1:6379", "--entry-bytes", "70"), "--entry-bytes"},
		{append(ok[:len(ok):len(ok)], "--redis", "127.0.0.1:6379", "--key-header", ""), "--key-header"},
		{append(ok[:len(ok):len(ok)], "--redis", "127.0.0.1:6379", "--ttl", "0s"), "--ttl"},
		{append(ok[:len(ok):len(ok)], "--redis", "127.0.0.1:6379", "--redis-prefix", ""), "--redis-prefix"},
	} {
		_, err := parse(c.args, io.Discard)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("parse %v: %v, want an error naming %s", c.args, err, c.want)
		}
	}
}

// The floor's SET NX decides a key once, within a batch and across
// batches, and a record it cannot decide goes through.
func TestFloorForwardsFirstCopiesOnly(t *testing.T) {
	addr := testenv.RedisAddr(t)
	prefix := testenv.UniqueName(t, "floor")
	o, err := parse([]string{"--brokers", "b", "--input", "in", "--output", "out", "--group", "g",
		"--volatile", "/client_time", "--redis", addr, "--redis-prefix", prefix, "--entry-bytes", "300"}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	f := newFloor(o)
	defer f.close()
	rec := func(key, value string) kafka.Message {
		m := kafka.Message{Value: []byte(value)}
		if key != "" {
			m.Headers = []kafka.Header{{Key: "idempotency-key", Value: []byte(key)}}
		}
		return m
	}
	ctx := context.Background()
	for _, step := range []struct {
		batch []kafka.Message
		want  []string // the values forwarded
	}{
		{[]kafka.Message{rec("a", `{"n":1,"client_time":1}`), rec("b", `{"n":2}`), rec("a", `{"n":1,"client_time":2}`)},
			[]string{`{"n":1,"client_time":1}`, `{"n":2}`}},
		{[]kafka.Message{rec("b", `{"n":2}`), rec("c", `{"n":3}`), rec("", `{"n":4}`), rec("d", `not json`)},
			[]string{`{"n":3}`, `{"n":4}`, `not json`}},
	} {
		out, err := f.decide(ctx, step.batch)
		if err != nil {
			t.Fatal(err)
		}
		var got []string
		for _, m := range out {
			got = append(got, string(m.Value))
		}
		if !slices.Equal(got, step.want) {
			t.Errorf("forwarded %q, want %q", got, step.want)
		}
	}
	entry, err := f.rdb.Get(ctx, prefix+":{a}").Result()
	if err != nil {
		t.Fatal(err)
	}
	if want, _ := f.canon.Fingerprint([]byte(`{"n":1}`)); len(entry) != 300 || !strings.HasPrefix(entry, want) {
		t.Errorf("entry of a: %d bytes starting %.71q, want 300 starting with %s", len(entry), entry, want)
	}
	if n, err := f.rdb.Exists(ctx, prefix+":{d}").Result(); err != nil || n != 0 {
		t.Errorf("an entry for a payload that does not canonicalize: %d, %v", n, err)
	}
	f.rdb.Del(ctx, prefix+":{a}", prefix+":{b}", prefix+":{c}")
}
