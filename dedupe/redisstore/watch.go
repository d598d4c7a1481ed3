package redisstore

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/idemstream/idemstream/dedupe"
)

// completeWatched finishes comps with plain commands, in transactions of
// up to watchChunk entries: WATCH the entries, read the server's clock
// (TIME) and the entries (MGET); decide.Complete decides each completion
// here, on the store's clock; MULTI/EXEC writes the entries that change.
// EXEC runs only if no watched entry changed since the WATCH, so each
// check and its write are as atomic as in complete.lua: when another
// holder took a key over in between, EXEC does nothing and complete.lua
// finishes that transaction's completions. A GET and a SET per completion
// cost the server about a fifth of the script's CPU.
//
// Up to watchParallel connections each run their share of the
// transactions in a row (watchConn), and a round trip carries one
// transaction's MULTI/EXEC and the next one's WATCH and reads: n
// transactions on a connection take n+1 round trips, not 2n. Each round
// trip spared saves the client a write, a read and a wake-up: about a
// tenth of its CPU per completion (docs/benchmarks.md).
//
// It is not used when replicas must acknowledge (see Complete).
func (s *Store) completeWatched(ctx context.Context, node *redis.Client, comps []dedupe.Completion, names []string) ([]error, error) {
	chunks := watchedChunks(comps, names)
	workers := min(watchParallel, len(chunks))
	workerErrs := make([]error, workers)
	var wg sync.WaitGroup
	for w := range workers {
		wg.Go(func() {
			var mine []*watchedChunk
			for c := w; c < len(chunks); c += workers {
				mine = append(mine, chunks[c])
			}
			workerErrs[w] = s.runWatched(ctx, node, mine)
		})
	}
	wg.Wait()
	if err := firstErr(workerErrs); err != nil {
		return nil, err
	}
	errs := make([]error, len(comps))
	var redo []int
	for _, c := range chunks {
		if c.changed {
			redo = append(redo, c.idx...)
			continue
		}
		for j, i := range c.idx {
			errs[i] = c.errs[j]
		}
	}
	// The transactions whose EXEC found an entry changed, in one call of
	// complete.lua.
	if err := s.redoScripted(ctx, comps, names, redo, errs); err != nil {
		return nil, err
	}
	return errs, nil
}

// watchedChunk is one transaction of completeWatched.
type watchedChunk struct {
	idx   []int // the completions' places in the call
	comps []dedupe.Completion
	names []string
	watch []string // the distinct names, in the order they first appear
	errs  []error
	// changed: EXEC found a watched entry changed and wrote nothing.
	changed bool
}

// watchedChunks splits a call into transactions of up to watchChunk
// distinct keys. Completions of one key go into the same transaction, in
// order; the transactions hold distinct keys, so that they may overlap.
func watchedChunks(comps []dedupe.Completion, names []string) []*watchedChunk {
	chunkOf := make(map[string]*watchedChunk, len(comps))
	var chunks []*watchedChunk
	for i, name := range names {
		c, ok := chunkOf[name]
		if !ok {
			if len(chunks) == 0 || len(chunks[len(chunks)-1].watch) == watchChunk {
				size := min(watchChunk, len(names)-i)
				chunks = append(chunks, &watchedChunk{idx: make([]int, 0, size), comps: make([]dedupe.Completion, 0, size),
					names: make([]string, 0, size), watch: make([]string, 0, size)})
			}
			c = chunks[len(chunks)-1]
			chunkOf[name] = c
			c.watch = append(c.watch, name)
		}
		c.idx = append(c.idx, i)
		c.comps = append(c.comps, comps[i])
		c.names = append(c.names, name)
	}
	for _, c := range chunks {
		c.errs = make([]error, len(c.idx))
	}
	return chunks
}

// watchRow bounds the transactions a connection runs in a row before it
// goes back to the pool, where other partitions' calls wait for it.
const watchRow = 8

// runWatched runs chunks in rows of up to watchRow, each row on a
// connection of its own. A call whose context ends stops before its next round
// trip: the connection is held, so nothing else would look.
func (s *Store) runWatched(ctx context.Context, node *redis.Client, chunks []*watchedChunk) error {
	for start := 0; start < len(chunks); start += watchRow {
		if err := s.runRow(ctx, node, chunks[start:min(start+watchRow, len(chunks))]); err != nil {
			return err
		}
	}
	return nil
}

func (s *Store) runRow(ctx context.Context, node *redis.Client, chunks []*watchedChunk) error {
	w := &watchConn{s: s, conn: node.Conn()}
	defer w.release(ctx)
	read, err := w.roundTrip(ctx, nil, chunks[0])
	for k := 0; err == nil && k < len(chunks); k++ {
		if err = ctx.Err(); err != nil {
			return classify("complete", err)
		}
		var next *watchedChunk
		if k+1 < len(chunks) {
			next = chunks[k+1]
		}
		read, err = w.roundTrip(ctx, w.plan(ctx, chunks[k], read), next)
	}
	return err
}

// watchConn is a connection that runs transactions in a row.
type watchConn struct {
	s    *Store
	conn *redis.Conn
	// armed: a WATCH may be on the connection (no EXEC or UNWATCH
	// since). It must not go back to the pool so: another transaction on
	// it would fail for keys it never read.
	armed bool
}

// release gives the connection back to the pool, without a WATCH on it.
func (w *watchConn) release(ctx context.Context) {
	if w.armed {
		_ = w.conn.Do(ctx, "UNWATCH").Err()
	}
	_ = w.conn.Close()
}

// chunkRead is what a round trip read for a transaction.
type chunkRead struct {
	now  time.Time
	vals []any // the entries, as MGET answered
}

// plan decides the completions of read's transaction and builds the
// transaction that writes the entries that change; nil when none does.
func (w *watchConn) plan(ctx context.Context, c *watchedChunk, read *chunkRead) *execCmds {
	order, latest := w.s.planCompletions(c.comps, c.names, read.vals, read.now, c.errs)
	if len(order) == 0 {
		return nil
	}
	bp := valueBuffers.Get().(*[]byte)
	buf := (*bp)[:0]
	sets := make([]redis.Cmder, len(order))
	args := newSetArgs(len(order), 0)
	for j, i := range order {
		e := latest[c.names[i]]
		start := len(buf)
		buf = w.s.appendEntryOver(buf, e, read.vals[i])
		sets[j] = redis.NewStatusCmd(ctx, args.set(j, &c.names[i], buf[start:len(buf):len(buf)], e.RetainUntil().UnixMilli())...)
	}
	*bp = buf
	marker, want := w.s.markerGet(ctx)
	return &execCmds{c: c, multi: redis.NewCmd(ctx, "MULTI"), queued: append(sets, marker),
		exec: redis.NewCmd(ctx, "EXEC"), want: want, bp: bp}
}

// roundTrip sends the transaction tx (MULTI, its SETs, the marker's GET,
// EXEC) and the WATCH and reads of next, in one round trip, and returns
// what was read for next (nil without next). Without a transaction it
// sends UNWATCH in its place when a WATCH may be left on the connection.
func (w *watchConn) roundTrip(ctx context.Context, tx *execCmds, next *watchedChunk) (*chunkRead, error) {
	if tx == nil && next == nil && !w.armed {
		return nil, nil
	}
	if tx != nil {
		defer func() {
			*tx.bp = (*tx.bp)[:0]
			valueBuffers.Put(tx.bp)
		}()
		if w.s.hooks.beforeExec != nil {
			w.s.hooks.beforeExec(tx.c.names)
		}
	}
	var rd *readCmds
	if next != nil {
		rd = newRead(ctx, next)
	}
	_, err := w.conn.Pipelined(ctx, func(p redis.Pipeliner) error {
		switch {
		case tx != nil:
			tx.queue(ctx, p)
		case w.armed:
			p.Do(ctx, "UNWATCH")
		}
		if rd != nil {
			rd.queue(ctx, p)
		}
		return nil
	})
	var rerr redis.Error
	if err != nil && !errors.Is(err, redis.Nil) && !errors.As(err, &rerr) {
		// No answer: the connection is gone or in doubt, and whatever it
		// watched with it.
		return nil, classify("complete", err)
	}
	// A MULTI refused leaves the WATCH in place: EXEC answers an error
	// and ends nothing.
	w.armed = (rd != nil && rd.watch.Err() == nil) || (tx != nil && tx.multi.Err() != nil)
	if tx != nil {
		if err := tx.result(ctx, w.s); err != nil {
			return nil, err
		}
	}
	if rd == nil {
		return nil, nil
	}
	return rd.result()
}

// execCmds is a transaction's commands in a round trip. The SETs' values
// are on a pooled buffer (bp), which goes back once they are sent.
type execCmds struct {
	c      *watchedChunk
	multi  *redis.Cmd
	queued []redis.Cmder // the SETs and the marker's GET, answered QUEUED
	exec   *redis.Cmd
	want   string // the marker's armed value
	bp     *[]byte
}

func (x *execCmds) queue(ctx context.Context, p redis.Pipeliner) {
	_ = p.Process(ctx, x.multi)
	for _, cmd := range x.queued {
		_ = p.Process(ctx, cmd)
	}
	_ = p.Process(ctx, x.exec)
}

// result reads EXEC's answer: nil, a watched entry changed and nothing
// was written (the chunk goes to complete.lua); EXECABORT, a command was
// refused when queued (NOPERM, OOM, READONLY), and that refusal is the
// cause, which decides between pausing and stopping; otherwise each
// command's answer, the marker's last, which must read the armed value
// for the writes to count.
func (x *execCmds) result(ctx context.Context, s *Store) error {
	if err := x.multi.Err(); err != nil {
		return classify("complete", err)
	}
	switch err := x.exec.Err(); {
	case errors.Is(err, redis.Nil):
		x.c.changed = true
		return nil
	case err != nil:
		for _, q := range x.queued {
			if qerr := q.Err(); qerr != nil {
				return classify("complete", qerr)
			}
		}
		return classify("complete", err)
	}
	replies, err := x.exec.Slice()
	if err != nil {
		return classify("complete", err)
	}
	if len(replies) != len(x.queued) {
		return fmt.Errorf("complete: %d answers in a transaction of %d commands", len(replies), len(x.queued))
	}
	for _, r := range replies[:len(replies)-1] {
		if rerr, ok := r.(error); ok {
			return classify("complete", rerr)
		}
	}
	marker := redis.NewStringCmd(ctx)
	switch v := replies[len(replies)-1].(type) {
	case string:
		marker.SetVal(v)
	case error:
		marker.SetErr(v)
	case nil:
		marker.SetErr(redis.Nil)
	default:
		marker.SetErr(fmt.Errorf("complete: the marker read as %T", v))
	}
	return s.checkMarkers(ctx, x.want, []*redis.StringCmd{marker})
}

// readCmds is a transaction's WATCH and reads in a round trip.
type readCmds struct {
	c     *watchedChunk
	watch *redis.Cmd
	clock *redis.TimeCmd
	read  *redis.Cmd
}

func newRead(ctx context.Context, c *watchedChunk) *readCmds {
	// The names go in as pointers, which an interface value holds
	// without an allocation (setArgs).
	watchArgs := make([]any, 1+len(c.watch))
	watchArgs[0] = "WATCH"
	for i := range c.watch {
		watchArgs[1+i] = &c.watch[i]
	}
	mget := make([]any, 1+len(c.names))
	mget[0] = "MGET"
	for i := range c.names {
		mget[1+i] = &c.names[i]
	}
	return &readCmds{c: c, watch: redis.NewCmd(ctx, watchArgs...), clock: redis.NewTimeCmd(ctx, "TIME"),
		read: redis.NewCmd(ctx, mget...)}
}

func (r *readCmds) queue(ctx context.Context, p redis.Pipeliner) {
	_ = p.Process(ctx, r.watch)
	_ = p.Process(ctx, r.clock)
	_ = p.Process(ctx, r.read)
}

func (r *readCmds) result() (*chunkRead, error) {
	for _, cmd := range []redis.Cmder{r.watch, r.clock} {
		if err := cmd.Err(); err != nil {
			return nil, classify("complete", err)
		}
	}
	vals, err := r.read.Slice()
	if err != nil {
		return nil, classify("complete", err)
	}
	if len(vals) != len(r.c.names) {
		return nil, fmt.Errorf("complete: %d entries read for %d completions", len(vals), len(r.c.names))
	}
	return &chunkRead{now: time.UnixMilli(r.clock.Val().UnixMilli()), vals: vals}, nil
}
