package redisstore

import (
	"sync"

	"github.com/idemstream/idemstream/dedupe"
)

// On a server with SET … IFEQ a completion needs the entry as it is on
// the server only to compare with it, and for most completions this Store
// wrote that entry itself a moment before: the SET NX of the key's first
// record. So Decide remembers each entry its SET NX wrote, and completeCAS
// compares with the remembered bytes instead of reading them back: its
// read round trip carries TIME alone in the common case, and no MGET.
//
// Nothing here is trusted beyond what the compare proves. SET … IFEQ
// writes only if the server holds exactly the remembered bytes, the same
// bytes are the same entry, and the clock is read as before, so the new
// entry is the one decide.Complete would have made from a fresh read. A
// remembered entry that is no longer the server's (a renewal, a takeover,
// an expiry, an entry written by another Store) fails its compare and
// goes to complete.lua, which decides on what it finds, as after any
// change between a read and its write; a verdict other than a write (a
// fenced completion, one already done) is never taken from a remembered
// entry (completeCAS reads the call's entries and decides again). Losing
// a remembered entry (the memory is bounded) costs its completion a read,
// nothing else.

// Each generation of remembered entries holds at most writtenGeneration
// entries and about writtenBytes bytes (an entry counts twice its
// encoding, for its decoded copy and the strings that copy holds on to,
// plus its name and writtenOverhead for the structures around them; the
// allocator's rounding is not counted); two are kept, so about 16 MiB or
// 14,000 of the load run's entries are remembered. A completion takes its entry a batch
// or two after its decision, so a generation holds the decisions of the
// partitions in flight; past that, the oldest are read back. An entry
// longer than writtenLongest is not remembered at all.
const (
	writtenGeneration = 1 << 14
	writtenBytes      = 8 << 20
	writtenOverhead   = 320
	writtenLongest    = 4 << 10
)

// written is the entries Decide's SET NX wrote and no completion has taken
// yet, by Redis name.
type written struct {
	mu        sync.Mutex
	cur, prev map[string]*writtenEntry
	curBytes  int
}

// writtenEntry is an entry as written: its bytes, which a completion
// compares with, and the entry they encode, so that it is not decoded
// again (Now is the clock of the decision).
type writtenEntry struct {
	raw   string
	entry dedupe.Entry
}

// cost is what v and its name take, as the bound counts it.
func (v *writtenEntry) cost(name string) int { return 2*len(v.raw) + len(name) + writtenOverhead }

// put remembers that name now holds raw, the encoding of e.
func (w *written) put(name string, raw []byte, e *dedupe.Entry) {
	if len(raw) > writtenLongest {
		w.forget([]string{name})
		return
	}
	v := &writtenEntry{raw: string(raw), entry: *e}
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.cur == nil {
		w.cur = make(map[string]*writtenEntry)
	}
	if len(w.cur) >= writtenGeneration || w.curBytes+v.cost(name) > writtenBytes {
		w.prev, w.cur, w.curBytes = w.cur, make(map[string]*writtenEntry, len(w.cur)), 0
	}
	if old, ok := w.cur[name]; ok {
		w.curBytes -= old.cost(name)
	}
	w.cur[name] = v
	w.curBytes += v.cost(name)
	delete(w.prev, name)
}

// take fills vals[i] with the remembered entry of names[i] (a
// *writtenEntry) and forgets it, and returns the indexes of the names it
// has none for. A name repeated in names gets the same entry each time.
func (w *written) take(names []string, vals []any) (missing []int) {
	w.mu.Lock()
	defer w.mu.Unlock()
	var taken map[string]*writtenEntry // names taken by this call, for a repeat
	for i, name := range names {
		v, ok := w.cur[name]
		if ok {
			delete(w.cur, name)
			w.curBytes -= v.cost(name)
		} else if v, ok = w.prev[name]; ok {
			delete(w.prev, name)
		} else if v, ok = taken[name]; !ok {
			missing = append(missing, i)
			continue
		}
		if taken == nil {
			taken = make(map[string]*writtenEntry)
		}
		taken[name] = v
		vals[i] = v
	}
	return missing
}

// forget drops what is remembered of names: Decide calls it for the names
// it decides otherwise than by its SET NX (a script may rewrite them), and
// Complete for those it completes otherwise than by completeCAS, so that
// what is remembered is what a completion will take.
func (w *written) forget(names []string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if len(w.cur)+len(w.prev) == 0 {
		return
	}
	for _, name := range names {
		if v, ok := w.cur[name]; ok {
			delete(w.cur, name)
			w.curBytes -= v.cost(name)
		}
		delete(w.prev, name)
	}
}
