package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/segmentio/kafka-go"

	"github.com/idemstream/idemstream/dedupe"
)

type options struct {
	brokers       []string
	input         string
	output        string
	group         string
	batch         int
	writerBatch   int
	batchTimeout  time.Duration
	maxWait       time.Duration
	overlapCommit bool

	// The floor: the least an idempotent consumer does, without any of
	// idemstream's guarantees (see floor).
	volatile, unordered []string // fingerprint each record under these rules
	keyHeader           string   // the idempotency key's header
	redisAddr           string   // SET NX an entry per key here
	redisPrefix         string
	entryBytes          int
	ttl                 time.Duration
	canon               *dedupe.Canonicalizer // built by parse from volatile and unordered when fingerprints
}

// fingerprints says whether the options ask for a fingerprint per record.
func (o options) fingerprints() bool {
	return len(o.volatile)+len(o.unordered) > 0 || o.redisAddr != ""
}

func main() {
	opts, err := parse(os.Args[1:], os.Stderr)
	if err != nil {
		if errors.Is(err, flag.ErrHelp) {
			os.Exit(0)
		}
		fmt.Fprintf(os.Stderr, "passthrough: %v\n", err)
		os.Exit(2)
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer stop()
	if err := run(ctx, opts); err != nil {
		fmt.Fprintf(os.Stderr, "passthrough: %v\n", err)
		os.Exit(1)
	}
}

func parse(args []string, stderr io.Writer) (options, error) {
	var o options
	fs := flag.NewFlagSet("passthrough", flag.ContinueOnError)
	fs.SetOutput(stderr)
	brokers := fs.String("brokers", "", "comma-separated host:port of the Kafka brokers")
	fs.StringVar(&o.input, "input", "", "topic to read")
	fs.StringVar(&o.output, "output", "", "topic to write")
	fs.StringVar(&o.group, "group", "", "consumer group")
	fs.IntVar(&o.batch, "batch", 1000, "most records the fetching goroutine hands over at once")
	fs.IntVar(&o.writerBatch, "writer-batch", 2000, "kafka.Writer BatchSize")
	fs.DurationVar(&o.batchTimeout, "batch-timeout", time.Millisecond, "kafka.Writer BatchTimeout: a synchronous write of a partial batch waits this long")
	fs.DurationVar(&o.maxWait, "max-wait", 100*time.Millisecond, "longest fetch wait when the input is idle")
	fs.BoolVar(&o.overlapCommit, "overlap-commit", false, "commit a batch while the next one is written")
	volatile := fs.String("volatile", "", "floor: comma-separated JSON Pointers left out of each record's fingerprint (a fingerprint per record when set)")
	unordered := fs.String("unordered", "", "floor: comma-separated JSON Pointers of arrays fingerprinted as sets")
	fs.StringVar(&o.keyHeader, "key-header", "Idempotency-Key", "floor: the header that holds a record's idempotency key")
	fs.StringVar(&o.redisAddr, "redis", "", "floor: host:port of a Redis; a pipelined SET NX (with --ttl) of an entry per key, and only first copies forwarded")
	fs.StringVar(&o.redisPrefix, "redis-prefix", "floor", "floor: the prefix of the entries' names")
	fs.IntVar(&o.entryBytes, "entry-bytes", 400, "floor: the size of an entry")
	fs.DurationVar(&o.ttl, "ttl", 10*time.Minute, "floor: the entries' expiry")
	if err := fs.Parse(args); err != nil {
		return o, err
	}
	o.brokers = list(*brokers)
	o.volatile, o.unordered = list(*volatile), list(*unordered)
	switch {
	case len(o.brokers) == 0:
		return o, errors.New("--brokers: required")
	case o.input == "":
		return o, errors.New("--input: required")
	case o.output == "":
		return o, errors.New("--output: required")
	case o.output == o.input:
		return o, errors.New("--output: must differ from --input")
	case o.group == "":
		return o, errors.New("--group: required")
	case o.batch < 1:
		return o, fmt.Errorf("--batch %d: want at least 1", o.batch)
	case o.writerBatch < 1:
		return o, fmt.Errorf("--writer-batch %d: want at least 1", o.writerBatch)
	case o.batchTimeout <= 0:
		return o, fmt.Errorf("--batch-timeout %v: want more than 0", o.batchTimeout)
	case o.maxWait <= 0:
		return o, fmt.Errorf("--max-wait %v: want more than 0", o.maxWait)
	case o.redisAddr != "" && o.keyHeader == "":
		return o, errors.New("--key-header: required with --redis")
	case o.redisAddr != "" && o.entryBytes < len("sha256:")+64:
		return o, fmt.Errorf("--entry-bytes %d: want at least %d, the fingerprint's length", o.entryBytes, len("sha256:")+64)
	case o.redisAddr != "" && o.redisPrefix == "":
		return o, errors.New("--redis-prefix: required with --redis")
	case o.redisAddr != "" && o.ttl <= 0:
		return o, fmt.Errorf("--ttl %v: want more than 0", o.ttl)
	}
	if o.fingerprints() {
		var err error
		if o.canon, err = dedupe.NewCanonicalizer(dedupe.CanonicalRules{Volatile: o.volatile, Unordered: o.unordered}); err != nil {
			return o, fmt.Errorf("--volatile, --unordered: %w", err)
		}
	}
	return o, nil
}

func list(s string) []string {
	var out []string
	for _, e := range strings.Split(s, ",") {
		if e = strings.TrimSpace(e); e != "" {
			out = append(out, e)
		}
	}
	return out
}

// run forwards until ctx ends. Three goroutines besides the committer
// that --overlap-commit uses: the reader's fetch loop feeds records one by
// one into a channel (kafka-go has no call that returns what is buffered
// without blocking), the batcher gathers them and hands a batch over as
// soon as the next stage is free or the batch is full, and the writer
// writes and commits. The floor adds a fourth, its decide stage, between
// the batcher and the writer. Under load the writer is always busy, so
// batches fill up; when the input trickles, a record waits for nothing but
// the writer.
func run(ctx context.Context, o options) error {
	f := newFloor(o)
	defer f.close()
	r := kafka.NewReader(kafka.ReaderConfig{
		Brokers: o.brokers, GroupID: o.group, Topic: o.input,
		MinBytes: 1, MaxBytes: 16 << 20, MaxWait: o.maxWait,
		QueueCapacity: 2 * o.batch, StartOffset: kafka.FirstOffset,
	})
	w := &kafka.Writer{
		Addr: kafka.TCP(o.brokers...), Topic: o.output, Balancer: &kafka.Murmur2Balancer{},
		RequiredAcks: kafka.RequireAll, BatchSize: o.writerBatch, BatchTimeout: o.batchTimeout,
		// Like with like: idemstream writes with its default compression.
		Compression: kafka.Lz4,
	}
	// The fetch side stops at ctx; the writer finishes the batch in hand
	// with a context of its own, so that a SIGTERM does not leave a written
	// batch uncommitted.
	work, cancelWork := context.WithCancel(context.Background())
	defer cancelWork()
	s := &stages{o: o, f: f, r: r, w: w, work: work, cancelWork: cancelWork,
		records: make(chan kafka.Message, o.batch), batches: make(chan []kafka.Message),
		forwards: make(chan forward), commits: make(chan []kafka.Message, 1),
		committed: make(chan struct{}), errc: make(chan error, 4)}
	go s.fetch(ctx)
	go s.batch()
	go s.commit()
	if f.canon != nil {
		go s.decide()
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		s.write()
	}()

	var err error
	select {
	case <-done:
	case err = <-s.errc:
	}
	cancelWork()
	<-done
	select {
	case e := <-s.errc:
		err = errors.Join(err, e)
	default:
	}
	return errors.Join(err, w.Close(), r.Close())
}

// stages are the passthrough's goroutines and the channels between them:
// fetch → records → batch → batches → (decide → forwards →) write, which
// commits, or hands its batches to commit with --overlap-commit.
type stages struct {
	o          options
	f          *floor
	r          *kafka.Reader
	w          *kafka.Writer
	work       context.Context // the writer's and committer's: ends after the fetch's
	cancelWork context.CancelFunc
	records    chan kafka.Message
	batches    chan []kafka.Message
	forwards   chan forward
	commits    chan []kafka.Message
	committed  chan struct{} // closed when commit has ended
	errc       chan error
}

func (s *stages) fetch(ctx context.Context) {
	defer close(s.records)
	for {
		m, err := s.r.FetchMessage(ctx)
		if err != nil {
			if ctx.Err() == nil {
				s.errc <- fmt.Errorf("fetch: %w", err)
			}
			return
		}
		s.records <- m
	}
}

// batch hands a batch on as soon as the next stage is free or the batch
// is full.
func (s *stages) batch() {
	defer close(s.batches)
	var batch []kafka.Message
	for {
		var handOver chan []kafka.Message
		if len(batch) > 0 {
			handOver = s.batches
		}
		select {
		case m, ok := <-s.records:
			if !ok {
				return
			}
			batch = append(batch, m)
			if len(batch) == s.o.batch {
				select {
				case s.batches <- batch:
				case <-s.work.Done():
					return
				}
				batch = nil
			}
		case handOver <- batch:
			batch = nil
		}
	}
}

// commit commits, with --overlap-commit, each batch beside the write of
// the next one (commits stay in order, each after its batch's write).
func (s *stages) commit() {
	defer close(s.committed)
	for batch := range s.commits {
		if err := s.r.CommitMessages(s.work, batch...); err != nil {
			s.errc <- fmt.Errorf("commit %d records: %w", len(batch), err)
			s.cancelWork()
			return
		}
	}
}

// decide is the floor's stage: it fingerprints each record and sets the
// entries of a batch while the batch before is written. The plain
// passthrough has no such stage: it copies in the writer (next), so that
// under a trickle a batch waits for nothing but the writer.
func (s *stages) decide() {
	defer close(s.forwards)
	for batch := range s.batches {
		out, err := s.f.decide(s.work, batch)
		if err != nil {
			s.errc <- err
			return
		}
		select {
		case s.forwards <- forward{out: out, commit: batch}:
		case <-s.work.Done():
			return
		}
	}
}

// next is the writer's next batch.
func (s *stages) next() (forward, bool) {
	if s.f.canon == nil {
		batch, ok := <-s.batches
		return forward{out: copyOut(batch, nil), commit: batch}, ok
	}
	fw, ok := <-s.forwards
	return fw, ok
}

// write writes each batch and commits it, or hands it to commit.
func (s *stages) write() {
	defer func() { close(s.commits); <-s.committed }()
	for {
		fw, ok := s.next()
		if !ok {
			return
		}
		out, batch := fw.out, fw.commit
		if err := s.w.WriteMessages(s.work, out...); err != nil {
			s.errc <- fmt.Errorf("write %d records to %s: %w", len(out), s.o.output, err)
			return
		}
		if s.o.overlapCommit {
			select {
			case s.commits <- batch:
			case <-s.work.Done():
				return
			}
			continue
		}
		if err := s.r.CommitMessages(s.work, batch...); err != nil {
			s.errc <- fmt.Errorf("commit %d records: %w", len(batch), err)
			return
		}
	}
}

// forward is a batch as the writer gets it: the records to write, and all
// of the batch's records to commit once they are written.
type forward struct{ out, commit []kafka.Message }

// floor is the least an idempotent consumer does: a fingerprint of each
// record's canonical form and, with a Redis, one pipelined SET NX of an
// entry per key, forwarding only the records whose SET NX wrote. It
// compares no fingerprints, records no outcome and completes nothing, and
// it sets a batch's entries before the batch is written, so a crash in
// between loses those records: it promises nothing and is there to show
// what the fingerprint and the store's first write cost on their own.
type floor struct {
	canon     *dedupe.Canonicalizer // nil: a plain passthrough
	rdb       *redis.Client         // nil: fingerprints only
	keyHeader string
	prefix    string
	pad       string // fills an entry up to --entry-bytes after its fingerprint
	ttl       time.Duration
}

// newFloor is the floor o asks for (a plain passthrough's when none); o
// comes from parse.
func newFloor(o options) *floor {
	f := &floor{canon: o.canon, keyHeader: o.keyHeader, prefix: o.redisPrefix, ttl: o.ttl}
	if o.redisAddr != "" {
		f.rdb = redis.NewClient(&redis.Options{Addr: o.redisAddr})
		f.pad = strings.Repeat("x", o.entryBytes-len("sha256:")-64)
	}
	return f
}

func (f *floor) close() {
	if f.rdb != nil {
		f.rdb.Close()
	}
}

// decide returns the records of batch to write. A record without a key or
// whose payload does not canonicalize is forwarded as it is.
func (f *floor) decide(ctx context.Context, batch []kafka.Message) ([]kafka.Message, error) {
	var fps []string
	if f.canon != nil {
		fps = make([]string, len(batch))
		for i, m := range batch {
			fps[i], _ = f.canon.Fingerprint(m.Value)
		}
	}
	var set []*redis.BoolCmd
	if f.rdb != nil {
		set = make([]*redis.BoolCmd, len(batch))
		pipe := f.rdb.Pipeline()
		n := 0
		for i, m := range batch {
			if key := header(m, f.keyHeader); key != "" && fps[i] != "" {
				set[i] = pipe.SetNX(ctx, f.prefix+":{"+key+"}", fps[i]+f.pad, f.ttl)
				n++
			}
		}
		// A SET NX that finds its key answers nil, which go-redis reads
		// as false, not as an error.
		if _, err := pipe.Exec(ctx); err != nil {
			return nil, fmt.Errorf("redis: SET NX of %d entries: %w", n, err)
		}
	}
	return copyOut(batch, func(i int) bool { return set == nil || set[i] == nil || set[i].Val() }), nil
}

// copyOut copies the records of batch that keep (nil: all) keeps into
// the messages a Writer takes.
func copyOut(batch []kafka.Message, keep func(i int) bool) []kafka.Message {
	out := make([]kafka.Message, 0, len(batch))
	for i, m := range batch {
		if keep == nil || keep(i) {
			out = append(out, kafka.Message{Key: m.Key, Value: m.Value, Headers: m.Headers})
		}
	}
	return out
}

func header(m kafka.Message, name string) string {
	for _, h := range m.Headers {
		if strings.EqualFold(h.Key, name) {
			return string(h.Value)
		}
	}
	return ""
}
