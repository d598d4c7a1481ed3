package redisstore

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"

	"github.com/idemstream/idemstream/dedupe"
)

// A Cluster's markers are written one slot after the other: a store that
// reads them meanwhile finishes the arm instead of taking the slots not
// yet written for lost, but only while the arm is fresh and only towards
// the generation it succeeds.
func TestArmInProgress(t *testing.T) {
	now := time.UnixMilli(1_800_000_000_000)
	armed := func(gen, prev string, age time.Duration) string {
		return fmt.Sprintf("armed %s %s %d", gen, prev, now.Add(-age).UnixMilli())
	}
	forgot := func(gen string) string { return fmt.Sprintf("forgot %s %d lost", gen, now.Add(-time.Hour).UnixMilli()) }
	fresh, succ := armed("b", "-", time.Second), armed("c", "a", time.Second)
	for _, tc := range []struct {
		name string
		vals []string
		want string
	}{
		{"a new arm half written", []string{fresh, "", fresh, ""}, fresh},
		{"a new arm written long ago, some markers missing: a loss", []string{armed("b", "-", time.Hour), "", ""}, ""},
		{"a loss accepted, half written over the loss", []string{succ, forgot("a"), "", succ}, succ},
		{"a loss accepted, half written over the old generation", []string{succ, armed("a", "-", time.Hour), succ}, succ},
		{"another generation beside the old one: a loss", []string{armed("b", "-", time.Second), armed("a", "-", time.Hour)}, ""},
		{"a succession of another generation: a loss", []string{armed("c", "z", time.Second), armed("a", "-", time.Hour)}, ""},
		{"a new arm beside a recorded loss: a loss", []string{fresh, forgot("a")}, ""},
	} {
		got, ok := armInProgress(tc.vals, now)
		if got != tc.want || ok != (tc.want != "") {
			t.Errorf("%s: armInProgress = %q %v, want %q", tc.name, got, ok, tc.want)
		}
	}
}

func lineageStore(t *testing.T, m *miniredis.Miniredis, opts ...Option) *Store {
	c := redis.NewClient(&redis.Options{Addr: m.Addr(), MaxRetries: -1, Protocol: 2})
	t.Cleanup(func() { c.Close() })
	return New(c, "lineage", opts...)
}

func lineageDecide(s *Store, n int, holder string) (int, error) {
	var reqs []dedupe.DecideRequest
	for i := range n {
		k := "k" + strconv.Itoa(i)
		reqs = append(reqs, dedupe.DecideRequest{Namespace: "p", Key: k, Fingerprint: "sha256:a", RulesDigest: "sha256:r",
			Semantics: dedupe.Strict, Window: time.Minute, Lease: 10 * time.Second,
			Owner: dedupe.Owner{Holder: holder, Source: "in/0/" + k}, Intent: dedupe.Intent{Partition: -1, Floor: dedupe.NoPosition}})
	}
	decs, err := s.Decide(context.Background(), reqs)
	first := 0
	for _, d := range decs {
		if d.Verdict == dedupe.VerdictFirst {
			first++
		}
	}
	return first, err
}

// A store that knew a generation never arms a new one on the data that
// forgot it: not when its loss could not be recorded, not after it was
// armed anew once and the data was flushed again.
func TestAStoreThatKnewAGenerationNeverArmsAnew(t *testing.T) {
	m := miniredis.RunT(t)
	a, op := lineageStore(t, m), lineageStore(t, m)
	if _, err := lineageDecide(a, 10, "a"); err != nil {
		t.Fatal(err)
	}
	m.FlushAll()
	// What noteMismatch leaves when the loss could not be recorded.
	a.gen.mu.Lock()
	a.gen.forgot = &ForgotError{Generation: "x", Since: time.Now(), Reason: "r"}
	a.gen.polled = time.Now().Add(-2 * markerPoll)
	a.gen.mu.Unlock()
	if n, err := lineageDecide(a, 10, "a"); !errors.Is(err, dedupe.ErrStoreForgot) || n != 0 {
		t.Fatalf("after a loss known only here: %d first, %v; want the loss", n, err)
	}
	if _, err := op.AcceptLoss(context.Background()); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		if _, err := lineageDecide(a, 10, "a"); err == nil || time.Now().After(deadline) {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	m.FlushAll()
	var err error
	for range 3 { // the first call may only see the generation change
		if _, err = lineageDecide(a, 10, "b"); errors.Is(err, dedupe.ErrStoreForgot) {
			break
		}
	}
	if !errors.Is(err, dedupe.ErrStoreForgot) {
		t.Fatalf("a second FLUSHALL after an accepted loss: %v, want the loss", err)
	}
}

// Two stores resuming after the hold at once agree on one generation, and
// two accepted losses in a row are followed, not taken for a third loss.
func TestResumesAndAcceptsAreFollowed(t *testing.T) {
	m := miniredis.RunT(t)
	ctx := context.Background()
	a, d := lineageStore(t, m, WithForgetHold(time.Second)), lineageStore(t, m, WithForgetHold(time.Second))
	if _, err := lineageDecide(a, 2, "a"); err != nil {
		t.Fatal(err)
	}
	m.FlushAll()
	if _, err := lineageDecide(a, 2, "a"); !errors.Is(err, dedupe.ErrStoreForgot) {
		t.Fatalf("after FLUSHALL: %v, want the loss", err)
	}
	names := a.markerNames()
	vals, _ := a.readMarkers(ctx, names)
	loss, _ := recordedLoss(vals) // what both read
	m.SetTime(time.Now().Add(time.Hour))
	for _, s := range []*Store{a, d} {
		s.gen.mu.Lock()
		err := s.resume(ctx, names, loss, loss.since+1000)
		s.gen.mu.Unlock()
		if err != nil {
			t.Fatal(err)
		}
	}
	if a.gen.want == "" || a.gen.want != d.gen.want {
		t.Fatalf("two stores resumed as %q and %q, want one generation", a.gen.want, d.gen.want)
	}
	for range 2 {
		if _, err := a.AcceptLoss(ctx); err != nil {
			t.Fatal(err)
		}
	}
	var err error
	for range 3 {
		if _, err = lineageDecide(d, 2, "d"); err == nil {
			break
		}
	}
	if err != nil || d.Forgot() != nil {
		t.Fatalf("after two accepted losses: %v (forgot %v), want the newest generation followed", err, d.Forgot())
	}
}

// The front door's claim on an upstream call reads the marker too.
func TestKeepFirstAfterALoss(t *testing.T) {
	m := miniredis.RunT(t)
	s := lineageStore(t, m)
	ctx := context.Background()
	if _, err := s.KeepFirst(ctx, "http.r", "claim", []byte("a"), time.Minute); err != nil {
		t.Fatal(err)
	}
	m.FlushAll()
	if _, err := s.KeepFirst(ctx, "http.r", "claim", []byte("b"), time.Minute); !errors.Is(err, dedupe.ErrStoreForgot) {
		t.Fatalf("KeepFirst after FLUSHALL: %v, want the loss", err)
	}
}
