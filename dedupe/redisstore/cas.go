package redisstore

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/idemstream/idemstream/dedupe"
)

// A server with a native compare-and-set (SET … IFEQ: Valkey 8.1 and
// later, Redis 8.4 and later) finishes a batch without WATCH and
// MULTI/EXEC: one round trip reads the server's clock and the entries
// this Store does not remember writing (written.go), decide.Complete
// decides each completion here, and each entry that changes is written
// with SET … IFEQ <the value it had>, in chunks side by side. The server
// compares and writes each entry atomically, which is all a completion
// needs: its rule reads one entry and writes that entry. An entry that
// changed in between (another holder took the key over, a renewal, an
// expiry) is left alone by its SET, and complete.lua finishes that
// entry's completions, as it does after a failed EXEC.
//
// The command is detected, never required (hasCAS), and a refusal of its
// syntax after a failover to an older node sends the store back to WATCH.
// That a replica of an older version follows the command is not tested:
// docs/operations.md asks for the replicas to be upgraded first.

// casState is what is known of the server's SET … IFEQ.
type casState int32

const (
	casUnknown casState = iota
	casSupported
	casUnsupported
)

// casChunk bounds the SET … IFEQ of one round trip: about 50 KiB of the
// load run's entries. Under appendfsync always Redis fsyncs each time it
// has read up to 16 KiB from each client with input, so three chunks side
// by side share their fsyncs whatever their size, and larger chunks spare
// both sides round trips (docs/benchmarks.md has 64 against 16).
const casChunk = 64

// hasCAS reports whether node takes SET … IFEQ, asking it once: on a name
// of its own (under the store's prefix, for an ACL that names it), a
// SET … IFEQ of a wrong value must write nothing and one of the right
// value must write. A server that refuses the command, or answers
// otherwise, finishes its batches under WATCH for the life of the Store.
func (s *Store) hasCAS(ctx context.Context, node *redis.Client) bool {
	switch casState(s.cas.Load()) {
	case casSupported:
		return true
	case casUnsupported:
		return false
	}
	// Entries are named <prefix>:{<pipeline>:<key>}: the probe's name
	// can be none of them, whatever the pipeline is called.
	name := s.prefix + ":probe:{set-ifeq:" + strconv.FormatInt(time.Now().UnixNano(), 36) + "}"
	var set, wrong, right *redis.Cmd
	var read *redis.StringCmd
	_, err := node.Pipelined(ctx, func(p redis.Pipeliner) error {
		set = p.Do(ctx, "SET", name, "a", "PX", 10000)
		wrong = p.Do(ctx, "SET", name, "b", "IFEQ", "c", "PX", 10000)
		right = p.Do(ctx, "SET", name, "b", "IFEQ", "a", "PX", 10000)
		read = p.Get(ctx, name)
		p.Del(ctx, name)
		return nil
	})
	var rerr redis.Error
	switch {
	case set.Err() == nil && errors.Is(wrong.Err(), redis.Nil) && right.Err() == nil && read.Val() == "b":
		s.cas.Store(int32(casSupported))
		return true
	case errors.As(err, &rerr):
		// The server answered (a syntax error, NOPERM, READONLY): no
		// compare-and-set it can be trusted with.
		s.cas.Store(int32(casUnsupported))
	}
	// Otherwise the server is away: this batch goes under WATCH, which
	// meets the same error, and the next asks again.
	return false
}

// isSyntaxRefusal reports whether the server did not know SET's IFEQ.
func isSyntaxRefusal(err error) bool {
	var rerr redis.Error
	return errors.As(err, &rerr) && strings.Contains(strings.ToLower(err.Error()), "syntax")
}

// completeCAS finishes comps with SET … IFEQ (see above). It compares each
// entry with what Decide's SET NX wrote (written.go) where it remembers
// that, and reads the others, in the round trip that reads the server's
// clock.
func (s *Store) completeCAS(ctx context.Context, node *redis.Client, comps []dedupe.Completion, names []string) ([]error, error) {
	vals := make([]any, len(names))
	missing := s.written.take(names, vals)
	now, err := readEntries(ctx, node, names, missing, vals)
	if err != nil {
		return nil, err
	}
	errs := make([]error, len(comps))
	order, latest := s.planCompletions(comps, names, vals, now, errs)
	if len(missing) < len(names) && doubted(names, vals, order, errs) {
		// A remembered entry is trusted only where it leads to a write,
		// which the compare checks. When it fences a completion, or finds
		// one already done, the whole call is decided again on entries
		// read, every one of them on the clock of that read.
		all := make([]int, len(names))
		for i := range all {
			all[i] = i
		}
		if s.hooks.beforeReread != nil {
			s.hooks.beforeReread()
		}
		if now, err = readEntries(ctx, node, names, all, vals); err != nil {
			return nil, err
		}
		clear(errs)
		order, latest = s.planCompletions(comps, names, vals, now, errs)
	}
	if len(order) == 0 {
		return errs, nil
	}
	again, err := s.writeCAS(ctx, node, names, vals, order, latest)
	if err != nil {
		return nil, err
	}
	if len(again) == 0 {
		return errs, nil
	}
	var redo []int
	for i := range comps {
		if again[names[i]] {
			redo = append(redo, i)
		}
	}
	if err := s.redoScripted(ctx, comps, names, redo, errs); err != nil {
		return nil, err
	}
	return errs, nil
}

// writeCAS writes the entries planned (order, latest), each with SET …
// IFEQ the value it was read as (vals), and returns the names whose
// entry changed since, for complete.lua to decide again.
func (s *Store) writeCAS(ctx context.Context, node *redis.Client, names []string, vals []any, order []int, latest map[string]*dedupe.Entry) (again map[string]bool, err error) {
	bp := valueBuffers.Get().(*[]byte)
	buf := (*bp)[:0]
	defer func() {
		*bp = buf[:0]
		valueBuffers.Put(bp)
	}()
	if s.hooks.beforeCAS != nil {
		s.hooks.beforeCAS(names)
	}
	sets := make([]*redis.StatusCmd, len(order))
	args := newSetArgs(len(order), 2)
	for j, i := range order {
		e := latest[names[i]]
		// IFEQ the value read or remembered: the same for every
		// completion of a name.
		was, ifeq := vals[i], vals[i]
		if w, ok := was.(*writtenEntry); ok {
			was, ifeq = w.raw, &w.raw
		}
		start := len(buf)
		buf = s.appendEntryOver(buf, e, was)
		sets[j] = redis.NewStatusCmd(ctx, args.set(j, &names[i], buf[start:len(buf):len(buf)], e.RetainUntil().UnixMilli(), "IFEQ", ifeq)...)
	}
	chunkErrs, err := s.sendCASChunks(ctx, node, sets)
	if err != nil {
		return nil, err
	}
	// Each SET answers for itself: OK, written; nil, the entry changed
	// since the read (or is gone), and complete.lua decides its
	// completions again on what it finds; refused for its syntax (a
	// failover to a node without the command), the same, and the store
	// finishes its batches under WATCH from now on. Any other refusal
	// (OOM, READONLY, NOPERM) or a lost connection fails the call, as an
	// EXEC would: what was written is the same completion again when the
	// call is retried.
	again = map[string]bool{}
	for j, i := range order {
		switch err := sets[j].Err(); {
		case err == nil:
		case errors.Is(err, redis.Nil):
			again[names[i]] = true
		case isSyntaxRefusal(err):
			s.cas.Store(int32(casUnsupported))
			again[names[i]] = true
		default:
			return nil, classify("complete", err)
		}
	}
	for _, err := range chunkErrs {
		// A chunk that failed as a whole (no connection to be had) may
		// leave a command without an answer, which must not pass for a
		// write: the call fails. A server's answer is a command's own,
		// handled above.
		if err != nil && !errors.Is(err, redis.Nil) {
			var rerr redis.Error
			if !errors.As(err, &rerr) {
				return nil, classify("complete", err)
			}
		}
	}
	return again, nil
}

// readEntries reads the server's clock and the entries of names[i] for i in
// idx into vals[i], in one round trip, and returns the clock.
func readEntries(ctx context.Context, node *redis.Client, names []string, idx []int, vals []any) (time.Time, error) {
	mget := make([]any, 1+len(idx))
	mget[0] = "MGET"
	for j, i := range idx {
		mget[1+j] = names[i]
	}
	var clock *redis.TimeCmd
	var read *redis.Cmd
	if _, err := node.Pipelined(ctx, func(p redis.Pipeliner) error {
		clock = p.Time(ctx)
		if len(idx) > 0 {
			read = p.Do(ctx, mget...)
		}
		return nil
	}); err != nil {
		return time.Time{}, classify("complete", err)
	}
	now := time.UnixMilli(clock.Val().UnixMilli())
	if read == nil {
		return now, nil
	}
	got, err := read.Slice()
	if err != nil {
		return time.Time{}, classify("complete", err)
	}
	if len(got) != len(idx) {
		return time.Time{}, fmt.Errorf("complete: %d entries read for %d completions", len(got), len(idx))
	}
	for j, i := range idx {
		vals[i] = got[j]
	}
	return now, nil
}

// doubted reports whether a completion whose entry was remembered (its
// vals[i] still the *writtenEntry that take put there) is fenced, or
// belongs to a name planCompletions writes nothing for.
func doubted(names []string, vals []any, order []int, errs []error) bool {
	writes := make(map[string]bool, len(order))
	for _, i := range order {
		writes[names[i]] = true
	}
	for i := range names {
		if _, remembered := vals[i].(*writtenEntry); remembered && (errs[i] != nil || !writes[names[i]]) {
			return true
		}
	}
	return false
}

// sendCASChunks sends the SET … IFEQ commands in chunks side by side, as
// completeWatched's transactions: under appendfsync always Redis fsyncs
// for every 16 KiB it reads from a client before it answers, and a SET …
// IFEQ carries its entry twice. Each chunk reads the marker behind its
// writes, on its connection; a marker that does not read the armed value
// fails the call. It returns each chunk's pipeline error.
func (s *Store) sendCASChunks(ctx context.Context, node *redis.Client, sets []*redis.StatusCmd) ([]error, error) {
	chunkErrs := make([]error, (len(sets)+casChunk-1)/casChunk)
	markers := make([]*redis.StringCmd, len(chunkErrs))
	var want string
	for c := range markers {
		markers[c], want = s.markerGet(ctx)
	}
	inParallel(len(chunkErrs), func(c int) {
		chunk := sets[c*casChunk : min((c+1)*casChunk, len(sets))]
		_, chunkErrs[c] = node.Pipelined(ctx, func(p redis.Pipeliner) error {
			for _, cmd := range chunk {
				_ = p.Process(ctx, cmd)
			}
			_ = p.Process(ctx, markers[c])
			return nil
		})
	})
	if err := s.checkMarkers(ctx, want, markers); err != nil {
		return nil, err
	}
	return chunkErrs, nil
}
