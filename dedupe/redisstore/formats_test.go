package redisstore_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/idemstream/idemstream/dedupe"
	"github.com/idemstream/idemstream/dedupe/redisstore"
	"github.com/idemstream/idemstream/dedupe/storetest"
	"github.com/idemstream/idemstream/internal/testenv"
)

func TestCountFormats(t *testing.T) {
	checkCountFormats(t, client(t, testenv.RedisAddr(t)))
}

// checkCountFormats: CountFormats finds every entry of the prefix in
// either format, over more than one SCAN page, and nothing else: not the
// entries of a prefix that the first is a glob pattern of, nor the
// marker; and it counts as Other every value a record's pipeline would
// stop at, whatever its first byte or type.
func checkCountFormats(t *testing.T, c redis.UniversalClient) {
	t.Helper()
	ctx := context.Background()
	prefix := freshPrefix() + "-*?[ab]"
	compactOpts := []redisstore.Option{redisstore.WithCompactEntries(),
		redisstore.WithSourceTopics(storetest.SourceTopics...), redisstore.WithRulesDigests(storetest.RulesDigests...)}
	stores := []struct {
		s    *redisstore.Store
		keys int
	}{
		{redisstore.New(c, prefix), 1100},
		{redisstore.New(c, prefix, compactOpts...), 700},
		{redisstore.New(c, strings.NewReplacer("*", "x", "?", "y", "[ab]", "a").Replace(prefix), compactOpts...), 30},
	}
	for i, st := range stores {
		reqs := make([]dedupe.DecideRequest, st.keys)
		for k := range reqs {
			r := decideReq(fmt.Sprintf("s%d-k%d", i, k), "h")
			r.RulesDigest, r.Fingerprint = storetest.RulesDigests[0], storetest.RulesDigests[0]
			r.Owner.Source = fmt.Sprintf("%s/0/%d", storetest.SourceTopics[0], k)
			reqs[k] = r
		}
		for from := 0; from < len(reqs); from += 500 {
			if _, err := st.s.Decide(ctx, reqs[from:min(from+500, len(reqs))]); err != nil {
				t.Fatal(err)
			}
		}
	}
	// Values this release does not read: a later format's state 0, no
	// entry at all, an empty value, an entry of each format damaged past
	// its first byte (which alone would pass for an entry), a text entry
	// in a state it does not know, and a whole entry of another key.
	compact, err := c.Get(ctx, stores[1].s.RedisKey("p", "s1-k0")).Result()
	if err != nil {
		t.Fatal(err)
	}
	text, err := c.Get(ctx, stores[0].s.RedisKey("p", "s0-k0")).Result()
	if err != nil {
		t.Fatal(err)
	}
	others := []string{"\x00\x01later", "hello", "", compact[:len(compact)/2], text[:strings.LastIndex(text, "\x1f")], "PAUSED" + text[len("PENDING"):], text}
	for i, v := range others {
		// Each at a name of the key its value names, where it names
		// one, so that only what the case is about is off.
		key := fmt.Sprintf("other-%d", i)
		if strings.HasSuffix(v, "\x1fs0-k0") && v != text {
			v = strings.TrimSuffix(v, "s0-k0") + key
		}
		if err := c.Set(ctx, stores[0].s.RedisKey("p", key), v, time.Minute).Err(); err != nil {
			t.Fatal(err)
		}
	}
	// A name whose key would overlap the namespace's brace: an entry of
	// the key "{p:x" at the name of "x".
	overlap := strings.TrimSuffix(text, "s0-k0") + "{p:x"
	if err := c.Set(ctx, stores[0].s.RedisKey("p", "x"), overlap, time.Minute).Err(); err != nil {
		t.Fatal(err)
	}
	others = append(others, overlap)
	// And a value that is no string (WRONGTYPE to a GET).
	hash := stores[0].s.RedisKey("p", "other-hash")
	if err := errors.Join(c.HSet(ctx, hash, "f", "v").Err(), c.Expire(ctx, hash, time.Minute).Err()); err != nil {
		t.Fatal(err)
	}
	others = append(others, "a hash")
	got, err := stores[0].s.CountFormats(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if want := (redisstore.Formats{Text: 1100, Compact: 700, Other: int64(len(others))}); got != want {
		t.Errorf("counted %+v, want %+v", got, want)
	}
}
