package redisstore

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/idemstream/idemstream/dedupe"
	"github.com/idemstream/idemstream/internal/testenv"
)

func digestOf(s string) string {
	sum := sha256.Sum256([]byte(s))
	return "sha256:" + hex.EncodeToString(sum[:])
}

// randomEntry is an entry of any state with fields of every form the
// encoders choose between: digests and other texts, Kafka sources and
// others, short and long keys.
func randomEntry(rng *rand.Rand) (name string, e dedupe.Entry, ctx readContext) {
	pick := func(s ...string) string { return s[rng.IntN(len(s))] }
	e.State = []dedupe.State{dedupe.Pending, dedupe.Success, dedupe.Failed}[rng.IntN(3)]
	e.Fingerprint = pick(digestOf(fmt.Sprint(rng.Int())), "sha256:a", "", "sha256:"+strings.Repeat("A", 64))
	e.RulesDigest = pick(digestOf("rules"), "sha256:r", digestOf("other rules")[:23])
	e.Owner.Holder = pick("idemstream-7f9c-x2x7q-3fa9/g12r3/coupon.claim.commands/3", "h", "#0badcafe", "")
	source := func() string {
		return pick(
			fmt.Sprintf("coupon.claim.commands/%d/%d", rng.IntN(64), rng.Int64N(1e15)),
			fmt.Sprintf("in/%d/%d", rng.IntN(3), rng.IntN(300)),
			"http/claim/pod-1/0/17", "in/01/5", "in/-1/5", "in/0/1000000000000000", "/0/1", "#37929e0a/2/9")
	}
	e.Owner.Source = source()
	e.FirstSource = e.Owner.Source
	if rng.IntN(3) == 0 {
		e.FirstSource = source()
	}
	e.Result = dedupe.ResultRef{Partition: -1, Offset: dedupe.NoPosition}
	if e.State != dedupe.Pending {
		e.Result = dedupe.ResultRef{Partition: int32(rng.IntN(12)), Offset: rng.Int64N(1 << 45)}
	}
	e.Intent = dedupe.Intent{Partition: -1, Floor: dedupe.NoPosition}
	switch rng.IntN(5) {
	case 0, 1:
		e.Intent = dedupe.Intent{Partition: e.Result.Partition, Floor: e.Result.Offset - rng.Int64N(1000)}
	case 2:
		e.Intent = dedupe.Intent{Partition: int32(rng.IntN(12)), Floor: rng.Int64N(1 << 40)}
	case 3:
		// The front door's attempts: any int64.
		e.Intent = dedupe.Intent{Partition: 0, Floor: int64(rng.Uint64())}
	}
	if e.State == dedupe.Pending && e.Intent.Floor == dedupe.NoPosition && rng.IntN(2) == 0 {
		e.Intent = dedupe.Intent{Partition: 1, Floor: 100}
	}
	now := time.UnixMilli(1764957600000 + rng.Int64N(1e6))
	e.WindowStart = now.Add(-time.Duration(rng.Int64N(1e8)) * time.Millisecond)
	e.ExpiresAt = now.Add(time.Duration(rng.Int64N(1e9)) * time.Millisecond)
	if e.State == dedupe.Pending {
		e.LeaseUntil = now.Add(time.Duration(rng.Int64N(1e5)-5e4) * time.Millisecond)
	}
	e.Key = pick("9f8a2c1d-3e4f-4a5b-8c6d-7e8f9a0b1c2d", "k", strings.Repeat("long-key-", 9), "a:b")
	s := New(nil, "idem")
	name = s.redisKey("claims", e.Key)
	ctx = readContext{name: name, holder: e.Owner.Holder, rules: e.RulesDigest, topics: []string{"coupon.claim.commands", "in"}}
	return name, e, ctx
}

// sameAsWritten reports whether got is e as a compact entry keeps it: the
// hashes read back as what the reader knew, or in their unresolved forms.
func sameAsWritten(got, e dedupe.Entry) bool {
	want := e
	if e.State != dedupe.Pending && got.Owner.Holder == dedupe.HolderDigest(e.Owner.Holder) {
		want.Owner.Holder = got.Owner.Holder
	}
	want.Now = got.Now
	return got == want
}

// Every entry decodes to what was encoded, in both formats.
func TestEntryFormatsRoundTrip(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 8))
	for range 20000 {
		name, e, ctx := randomEntry(rng)
		for _, compact := range []bool{false, true} {
			s := &Store{compact: compact}
			raw := string(s.appendEntry(nil, &e))
			got, err := decodeEntry(0, raw, ctx)
			if err != nil {
				t.Fatalf("compact=%v %s: %v\n%+v", compact, name, err, e)
			}
			e.Now = got.Now
			if compact && !sameAsWritten(got, e) || !compact && got != e {
				t.Fatalf("compact=%v: wrote %+v\nread  %+v", compact, e, got)
			}
		}
	}
}

// What a compact entry keeps only as a hash reads back in a form that
// differs from every value a request carries, and is written back as the
// same bytes by a reader who did not know the value.
func TestCompactEntryWithoutItsContext(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	for range 5000 {
		name, e, ctx := randomEntry(rng)
		raw := appendCompact(nil, &e)
		got, err := decodeEntry(0, string(raw), readContext{name: name})
		if err != nil {
			t.Fatal(err)
		}
		if again := appendCompact(nil, &got); !bytes.Equal(again, raw) {
			t.Fatalf("%+v\nread without context as %+v\nwritten back as %x, was %x", e, got, again, raw)
		}
		if got.RulesDigest != e.RulesDigest && got.RulesDigest == ctx.rules {
			t.Fatalf("an unresolved digest reads as the reader's: %+v", got)
		}
	}
}

// A reader's own source and the digest of the entry read before spare
// the decoder making those strings again: an entry reads the same with
// them as without, whether it names them or not.
func TestCompactEntryReadWithTheReadersStrings(t *testing.T) {
	rng := rand.New(rand.NewPCG(5, 6))
	s := New(nil, "idem", WithRulesDigests(digestOf("rules")))
	for range 20000 {
		name, e, ctx := randomEntry(rng)
		raw := string(appendCompact(nil, &e))
		source := e.Owner.Source
		switch rng.IntN(4) {
		case 1:
			source = e.FirstSource
		case 2:
			// The same topic and partition, another offset.
			if topic, p, o, ok := splitSource(source); ok {
				source = fmt.Sprintf("%s/%d/%d", topic, p, o+1)
			}
		case 3:
			source = fmt.Sprintf("in/%d/%d", rng.IntN(3), rng.IntN(300))
		}
		rules := ""
		switch rng.IntN(3) {
		case 1:
			if len(e.RulesDigest) >= 23 {
				rules = e.RulesDigest[:23]
			}
		case 2:
			rules = digestOf("rules of another entry")[:23]
		}
		with := s.readContext(name, ctx.holder, rules, source)
		without := with
		without.source, without.rules = "", ""
		got, err := decodeEntry(0, raw, with)
		if err != nil {
			t.Fatal(err)
		}
		want, err := decodeEntry(0, raw, without)
		if err != nil {
			t.Fatal(err)
		}
		if got != want {
			t.Fatalf("source %q, rules %q:\nread %+v\nwant %+v", source, rules, got, want)
		}
	}
}

// A store that writes text completes a compact entry it cannot resolve
// as compact, whatever entry of the batch it read before: a full digest
// read from a text entry must not resolve the compact entry after it.
func TestCompletionWritesBackEachEntryAsItsOwnRead(t *testing.T) {
	s := New(nil, "idem")
	now := time.UnixMilli(1764957600000)
	owner := dedupe.Owner{Holder: "h", Source: "in/0/1"}
	pending := func(key string) dedupe.Entry {
		return dedupe.Entry{Key: key, State: dedupe.Pending, Fingerprint: digestOf(key), RulesDigest: digestOf("rules"),
			Owner: owner, FirstSource: owner.Source, Result: dedupe.ResultRef{Partition: -1, Offset: dedupe.NoPosition},
			Intent: dedupe.Intent{Partition: 0, Floor: 5}, WindowStart: now, ExpiresAt: now.Add(time.Hour), LeaseUntil: now.Add(time.Minute)}
	}
	text, compact := pending("a"), pending("b")
	vals := []any{string(appendTextEntry(nil, &text)), string(appendCompact(nil, &compact))}
	names := []string{s.redisKey("ns", "a"), s.redisKey("ns", "b")}
	var comps []dedupe.Completion
	for _, k := range []string{"a", "b"} {
		comps = append(comps, dedupe.Completion{Namespace: "ns", Key: k, Owner: owner, State: dedupe.Success,
			Result: dedupe.ResultRef{Partition: 0, Offset: 9}, KeepAtLeast: time.Minute})
	}
	errs := make([]error, len(comps))
	order, latest := s.planCompletions(comps, names, vals, now, errs)
	if len(order) != 2 || errs[0] != nil || errs[1] != nil {
		t.Fatalf("order %v, errs %v", order, errs)
	}
	if got := latest[names[0]].RulesDigest; got != digestOf("rules") {
		t.Errorf("the text entry's digest read as %q", got)
	}
	if got := latest[names[1]].RulesDigest; len(got) != 23 {
		t.Errorf("the compact entry's digest read as %q, want its unresolved form", got)
	}
	if raw := s.appendEntryOver(nil, latest[names[1]], vals[1]); !isCompact(string(raw)) {
		t.Errorf("the compact entry written back as text: %q", raw)
	}
}

// compactGolden is a SUCCESS entry as the load run's records make it.
func compactGolden() (string, dedupe.Entry) {
	ws := time.UnixMilli(1764957600123)
	return "idem:{claims:9f8a2c1d-3e4f-4a5b-8c6d-7e8f9a0b1c2d}", dedupe.Entry{
		Key: "9f8a2c1d-3e4f-4a5b-8c6d-7e8f9a0b1c2d", State: dedupe.Success,
		Fingerprint: digestOf("claim"), RulesDigest: digestOf("rules"),
		Owner:       dedupe.Owner{Holder: "idemstream-7f9c-x2x7q-3fa9/g12r3/coupon.claim.commands/3", Source: "coupon.claim.commands/3/184467440"},
		FirstSource: "coupon.claim.commands/3/184467440",
		Intent:      dedupe.Intent{Partition: 3, Floor: 123458990},
		Result:      dedupe.ResultRef{Partition: 3, Offset: 123459000},
		WindowStart: ws, ExpiresAt: ws.Add(10 * time.Minute),
	}
}

// The compact format is stored: its bytes for one entry are frozen here,
// and a change to them is a new format (doc.go, compact.go).
func TestCompactEntryGolden(t *testing.T) {
	_, e := compactGolden()
	got := hex.EncodeToString(appendCompact(nil, &e)) + "\n"
	path := filepath.Join("testdata", "compact-success.golden")
	if os.Getenv("UPDATE_GOLDEN") != "" {
		if err := os.WriteFile(path, []byte(got), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if got != string(want) {
		t.Errorf("compact SUCCESS entry:\n got %s want %s", got, want)
	}
	if n := len(got) / 2; n > 76 {
		t.Errorf("the load run's SUCCESS entry takes %d bytes; jemalloc's 80-byte class holds 76", n)
	}
}

// parityScript decodes KEYS[1] with entry.lua under the context in ARGV
// (key, holder, rules digest, topic) and returns its fields and what its
// encoders write: compact, then text (as a new entry of a text store).
const parityScript = `
local e = load(KEYS[1], {key = ARGV[1], holder = ARGV[2], rd = ARGV[3], topic = ARGV[4]})
if not e then return false end
local f = {}
for i, n in ipairs(FIELDS) do f[i] = e[n] end
f[#f + 1] = e.k
COMPACT = true
f[#f + 1] = encode(e)
COMPACT, e.compact = false, nil
f[#f + 1] = encode(e)
return f
`

// entry.lua and the Go encoders are twins: for any entry, the script
// reads what Go wrote as Go reads it, and writes the bytes Go writes, in
// both formats.
func TestLuaWritesWhatGoWrites(t *testing.T) {
	c := redis.NewClient(&redis.Options{Addr: testenv.RedisAddr(t)})
	t.Cleanup(func() { c.Close() })
	ctx := context.Background()
	script := redis.NewScript(entrySrc + parityScript)
	rng := rand.New(rand.NewPCG(5, 6))
	prefix := fmt.Sprintf("parity%d", time.Now().UnixNano())
	for i := range 3000 {
		_, e, rc := randomEntry(rng)
		name := prefix + ":{claims:" + e.Key + "}"
		rc.name = name
		topic, _, _, _ := splitSource(e.Owner.Source)
		rc.topic, rc.topics = topic, nil
		for _, compact := range []bool{false, true} {
			s := &Store{compact: compact}
			raw := s.appendEntry(nil, &e)
			if err := c.Set(ctx, name, raw, time.Minute).Err(); err != nil {
				t.Fatal(err)
			}
			rep, err := script.Run(ctx, c, []string{name}, e.Key, rc.holder, rc.rules, topic).StringSlice()
			if err != nil {
				t.Fatalf("%d: %v", i, err)
			}
			want, err := decodeEntry(0, string(raw), rc)
			if err != nil {
				t.Fatal(err)
			}
			text := appendTextEntry(nil, &want)
			if got := strings.Join(rep[:14], sep); got != string(text) {
				t.Fatalf("entry.lua read %q\nGo read        %q\nfrom %x", got, text, raw)
			}
			if rep[14] != string(appendCompact(nil, &want)) {
				t.Fatalf("entry.lua wrote %x\nGo wrote       %x\nfor %+v", rep[14], appendCompact(nil, &want), want)
			}
			if rep[15] != string(text) {
				t.Fatalf("entry.lua wrote %q, Go %q", rep[15], text)
			}
		}
	}
}

// A compact entry that does not decode is an error, never a panic or a
// wrong entry: whatever decodes encodes to bytes that decode to the same.
func FuzzDecodeCompact(f *testing.F) {
	name, e := compactGolden()
	f.Add(appendCompact(nil, &e))
	rng := rand.New(rand.NewPCG(1, 2))
	for range 20 {
		_, e, _ := randomEntry(rng)
		f.Add(appendCompact(nil, &e))
	}
	f.Fuzz(func(t *testing.T, raw []byte) {
		if len(raw) == 0 || raw[0] >= ' ' {
			return
		}
		ctx := readContext{name: name}
		got, err := decodeEntry(0, string(raw), ctx)
		if err != nil {
			return
		}
		again, err := decodeEntry(0, string(appendCompact(nil, &got)), ctx)
		if err != nil || again != got {
			t.Fatalf("%x decodes to %+v, which encodes to what decodes to %+v (%v)", raw, got, again, err)
		}
	})
}

// entry.lua and decodeCompact take the same bytes for an entry: damaged
// entries (bytes changed, cut short, lengthened) are refused by both or
// read alike by both.
func TestLuaReadsWhatGoReads(t *testing.T) {
	c := redis.NewClient(&redis.Options{Addr: testenv.RedisAddr(t)})
	t.Cleanup(func() { c.Close() })
	ctx := context.Background()
	script := redis.NewScript(entrySrc + parityScript)
	rng := rand.New(rand.NewPCG(9, 10))
	prefix := fmt.Sprintf("damaged%d", time.Now().UnixNano())
	accepted := 0
	for i := range 4000 {
		_, e, rc := randomEntry(rng)
		name := prefix + ":{claims:" + e.Key + "}"
		topic, _, _, _ := splitSource(e.Owner.Source)
		rc.name, rc.topic, rc.topics = name, topic, nil
		raw := appendCompact(nil, &e)
		switch rng.IntN(4) {
		case 0:
			raw = raw[:rng.IntN(len(raw))]
		case 1:
			raw = append(raw, byte(rng.IntN(256)))
		default:
			for range 1 + rng.IntN(3) {
				raw[rng.IntN(len(raw))] = byte(rng.IntN(256))
			}
		}
		if len(raw) == 0 || raw[0] >= ' ' {
			continue
		}
		if err := c.Set(ctx, name, raw, time.Minute).Err(); err != nil {
			t.Fatal(err)
		}
		rep, err := script.Run(ctx, c, []string{name}, e.Key, rc.holder, rc.rules, topic).StringSlice()
		luaOK := err == nil
		if err != nil && err != redis.Nil {
			t.Fatalf("%d: %v", i, err)
		}
		got, goErr := decodeEntry(0, string(raw), rc)
		if luaOK != (goErr == nil) {
			t.Fatalf("%x: entry.lua read it: %v, Go: %v (%+v)", raw, luaOK, goErr, got)
		}
		if !luaOK {
			continue
		}
		accepted++
		if text := string(appendTextEntry(nil, &got)); strings.Join(rep[:14], sep) != text {
			t.Fatalf("%x: entry.lua read %q, Go %q", raw, strings.Join(rep[:14], sep), text)
		}
	}
	t.Logf("%d damaged entries both read", accepted)
}

// rolloutStores are a store writing compact entries and one writing text
// on one prefix of the server at addr.
func rolloutStores(t *testing.T, addr string) (compact, text *Store, c *redis.Client) {
	c = redis.NewClient(&redis.Options{Addr: addr})
	t.Cleanup(func() { c.Close() })
	prefix := fmt.Sprintf("rollout%d", time.Now().UnixNano())
	return New(c, prefix, WithCompactEntries()), New(c, prefix), c
}

// After a deployment moves back to text, compact entries end: a store
// that writes text rewrites a compact entry as text once nothing in it is
// left unresolved (a FAILED key's rerun replaces its holder, fingerprint
// and rules digest), and keeps it compact only while it is not.
func TestTextStoreEndsCompactEntries(t *testing.T) {
	compact, text, c := rolloutStores(t, testenv.RedisAddr(t))
	ctx := context.Background()
	r := dedupe.DecideRequest{Namespace: "p", Key: "k", Fingerprint: digestOf("a"), RulesDigest: digestOf("r"),
		Semantics: dedupe.Strict, Window: time.Minute, Lease: 10 * time.Second,
		Owner: dedupe.Owner{Holder: "i1/g1/in/0", Source: "in/0/5"}, Intent: dedupe.Intent{Partition: 1, Floor: 7}}
	first := func() byte {
		raw, err := c.Get(ctx, text.redisKey("p", "k")).Bytes()
		if err != nil {
			t.Fatal(err)
		}
		return raw[0]
	}
	if _, err := compact.Decide(ctx, []dedupe.DecideRequest{r}); err != nil {
		t.Fatal(err)
	}
	// A completion carries no rules digest: the text store cannot resolve
	// the entry's, and keeps it compact.
	errs, err := text.Complete(ctx, []dedupe.Completion{{Namespace: "p", Key: "k", Owner: r.Owner, State: dedupe.Failed,
		Result: dedupe.ResultRef{Partition: -1, Offset: -1}, FailedTTL: time.Minute}})
	if err != nil || errs[0] != nil {
		t.Fatal(err, errs)
	}
	if b := first(); b >= ' ' {
		t.Fatalf("a completion by a text store wrote a text entry (%q) over a compact one it could not resolve", b)
	}
	rerun := r
	rerun.Owner = dedupe.Owner{Holder: "i2/g2/in/0", Source: "in/0/9"}
	d, err := text.Decide(ctx, []dedupe.DecideRequest{rerun})
	if err != nil || d[0].Verdict != dedupe.VerdictFirst || !d[0].Rerun {
		t.Fatal(err, d)
	}
	if b := first(); b != 'P' {
		t.Errorf("a text store's rerun of a compact FAILED key wrote first byte %#x, want a text entry", b)
	}
}

// A producer that stamps microseconds where Kafka wants milliseconds
// gives event times of 16 digits: decide.lua keeps every digit, as the Go
// paths do, so that a key's decision (its first source and window start)
// reads the same on every path and a recovery scan finds its result.
func TestEventTimesKeepEveryDigit(t *testing.T) {
	for _, compact := range []bool{false, true} {
		c := redis.NewClient(&redis.Options{Addr: testenv.RedisAddr(t)})
		t.Cleanup(func() { c.Close() })
		opts := []Option{WithSourceTopics("in")}
		if compact {
			opts = append(opts, WithCompactEntries())
		}
		s := New(c, fmt.Sprintf("micros%d", time.Now().UnixNano()), opts...)
		ctx := context.Background()
		r := pendingReq("k", "h", 5, time.Minute)
		r.EventTime = time.UnixMilli(1764957600123456)
		// One record: decide.lua's path.
		d, err := s.Decide(ctx, []dedupe.DecideRequest{r})
		if err != nil || d[0].Verdict != dedupe.VerdictFirst {
			t.Fatal(err, d)
		}
		e, ok, err := s.Lookup(ctx, "p", "k")
		if err != nil || !ok || e.WindowStart.UnixMilli() != 1764957600123456 || e.DecisionID() != d[0].Entry.DecisionID() {
			t.Errorf("compact=%v: stored %+v (%v %v), decided %s", compact, e, ok, err, d[0].Entry.DecisionID())
		}
	}
}
