package demo_test

import (
	"context"
	"slices"
	"strings"
	"testing"

	"go.uber.org/goleak"

	"github.com/idemstream/idemstream/internal/demo"
)

// TestDemoFigures runs the campaign in JSON and in Avro (through the
// in-process registry): idemstream decides both the same way.
func TestDemoFigures(t *testing.T) {
	for _, payload := range []string{"json", "avro"} {
		t.Run(payload, func(t *testing.T) { checkDemoFigures(t, payload) })
	}
}

func checkDemoFigures(t *testing.T, payload string) {
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	w := demo.Workload{Seed: 7, Users: 60, Commands: 400, Stock: 80, Conflicts: 0.02, Garbage: 0.02}
	gen := demo.Generate(w)
	f, err := demo.Run(context.Background(), demo.Options{Workload: w, Members: 2, Payload: payload})
	if err != nil {
		t.Fatal(err)
	}
	if f.Payload != payload {
		t.Errorf("ran with payload %q, want %q", f.Payload, payload)
	}
	idem, naive := f.Idemstream, f.Naive
	checks := []struct {
		what      string
		got, want int
	}{
		{"commands", f.Commands, 400},
		{"idemstream results = distinct keys", idem.Results, w.Users},
		{"idemstream conflicts = injected conflicts", idem.Conflicts, gen.Conflicts},
		{"idemstream replays = injected retries", idem.Replays, gen.Retries},
		{"idemstream invalid = garbage", idem.Invalid, gen.Garbage},
		{"idemstream extra coupons", idem.ExtraCoupons, 0},
		{"idemstream money lost", idem.MoneyLost, 0},
		{"naive extra coupons = injected volatile-only retries", naive.ExtraCoupons, gen.Retries},
		{"naive money lost", naive.MoneyLost, gen.Retries * demo.CouponValue},
		{"naive replays", naive.Replays, 0},
		{"naive stock left", naive.StockLeft, w.Stock - w.Users - gen.Retries},
	}
	for _, c := range checks {
		if c.got != c.want {
			t.Errorf("%s: %d, want %d", c.what, c.got, c.want)
		}
	}
	if gen.Retries == 0 || gen.Conflicts == 0 || gen.Garbage == 0 {
		t.Fatalf("the workload injected nothing: %+v", f.Injected)
	}
	for _, side := range []demo.Pipeline{naive, idem} {
		if sum := side.Results + side.Replays + side.Conflicts + side.Invalid + side.Failed; sum != f.Commands {
			t.Errorf("outcomes add up to %d, want %d: %+v", sum, f.Commands, side)
		}
	}
	// The audit of the command topic finds the pipeline's rules by itself
	// and, under them, decides as the pipeline did.
	a := f.Audit
	vol := slices.Sorted(slices.Values(a.Volatile))
	if !slices.Equal(vol, []string{"/client_time", "/retry_count", "/trace_id"}) || !slices.Equal(a.Unordered, []string{"/items"}) {
		t.Errorf("audit found volatile %v and unordered %v, want /client_time /retry_count /trace_id and /items", a.Volatile, a.Unordered)
	}
	if a.ConflictKeys != int64(gen.Conflicts) || !slices.Equal(a.Conflicts, []string{"/amount"}) {
		t.Errorf("audit found %d conflicting keys at %v, want %d at /amount", a.ConflictKeys, a.Conflicts, gen.Conflicts)
	}
	d := a.Decisions.Idemstream
	if int(d.First) != idem.Results || int(d.Replay) != idem.Replays || int(d.Conflict) != idem.Conflicts || int(d.Invalid) != idem.Invalid {
		t.Errorf("audit decided %+v, the pipeline %+v", d, idem)
	}
	if len(f.DeadLetters) == 0 || f.DeadLetters[0].Reason != "conflict" || f.DeadLetters[0].ConflictPaths != "/amount" {
		t.Errorf("example dead letters: %+v", f.DeadLetters)
	}
}

func TestWorkloadIsDeterministic(t *testing.T) {
	a := demo.Generate(demo.Workload{Seed: 42, Users: 30, Commands: 200})
	b := demo.Generate(demo.Workload{Seed: 42, Users: 30, Commands: 200})
	c := demo.Generate(demo.Workload{Seed: 43, Users: 30, Commands: 200})
	if len(a.Later) != len(b.Later) || string(a.Later[5].Body) != string(b.Later[5].Body) || a.Originals[3].IdemKey != b.Originals[3].IdemKey {
		t.Error("the same seed gave another workload")
	}
	if a.Originals[3].IdemKey == c.Originals[3].IdemKey {
		t.Error("another seed gave the same keys")
	}
	if got := len(a.Originals) + len(a.Later); got != 200 {
		t.Errorf("%d commands, want 200", got)
	}
}

// The campaign over HTTP: through the proxy the desk is called once per
// user and issues no extra coupon; the incident's endpoint issues one per
// volatile-only retry.
func TestDemoOverHTTP(t *testing.T) {
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	w := demo.Workload{Seed: 7, Users: 60, Commands: 400, Stock: 80, Conflicts: 0.02, Garbage: 0.02}
	gen := demo.Generate(w)
	f, err := demo.RunHTTP(context.Background(), demo.Options{Workload: w})
	if err != nil {
		t.Fatal(err)
	}
	p, naive := f.Proxy, f.Naive
	for _, c := range []struct {
		what      string
		got, want int
	}{
		{"requests", f.Requests, 400},
		{"proxy: upstream calls = distinct keys", p.UpstreamCalls, w.Users},
		{"proxy: created = distinct keys", p.Created, w.Users},
		{"proxy: replays = injected retries", p.Replayed, gen.Retries},
		{"proxy: 422 = injected conflicts", p.Conflicts, gen.Conflicts},
		{"proxy: 400 = garbage", p.Invalid, gen.Garbage},
		{"proxy: extra coupons", p.ExtraCoupons, 0},
		// Every retry whose bytes changed is a new coupon; so is each claim
		// of the keyless garbage user after the first.
		{"naive: extra coupons = changed retries", naive.ExtraCoupons, gen.Retries - naive.Replayed + (gen.Garbage+1)/2 - 1},
		{"naive: upstream calls = requests", naive.UpstreamCalls, f.Requests},
	} {
		if c.got != c.want {
			t.Errorf("%s: %d, want %d", c.what, c.got, c.want)
		}
	}
	if naive.ExtraCoupons < gen.Retries/2 {
		t.Errorf("the naive endpoint issued only %d extra coupons for %d retries", naive.ExtraCoupons, gen.Retries)
	}
	if f.Conflict == "" || !strings.Contains(f.Conflict, `"conflict_paths":["/amount"]`) {
		t.Errorf("example conflict %q, want one naming /amount", f.Conflict)
	}
}
