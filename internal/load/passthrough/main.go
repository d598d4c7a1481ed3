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

	"github.com/segmentio/kafka-go"
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
	if err := fs.Parse(args); err != nil {
		return o, err
	}
	for _, b := range strings.Split(*brokers, ",") {
		if b = strings.TrimSpace(b); b != "" {
			o.brokers = append(o.brokers, b)
		}
	}
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
	}
	return o, nil
}

// run forwards until ctx ends. Three goroutines: the reader's fetch loop
// feeds records one by one into a channel (kafka-go has no call that
// returns what is buffered without blocking), the batcher gathers them and
// hands a batch over as soon as the writer is free or the batch is full,
// and the writer writes and commits. Under load the writer is always busy,
// so batches fill up; when the input trickles, a record waits for nothing
// but the writer.
func run(ctx context.Context, o options) error {
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
	records := make(chan kafka.Message, o.batch)
	batches := make(chan []kafka.Message)
	errc := make(chan error, 3)

	go func() {
		defer close(records)
		for {
			m, err := r.FetchMessage(ctx)
			if err != nil {
				if ctx.Err() == nil {
					errc <- fmt.Errorf("fetch: %w", err)
				}
				return
			}
			records <- m
		}
	}()
	go func() {
		defer close(batches)
		var batch []kafka.Message
		for {
			var handOver chan []kafka.Message
			if len(batch) > 0 {
				handOver = batches
			}
			select {
			case m, ok := <-records:
				if !ok {
					return
				}
				batch = append(batch, m)
				if len(batch) == o.batch {
					select {
					case batches <- batch:
					case <-work.Done():
						return
					}
					batch = nil
				}
			case handOver <- batch:
				batch = nil
			}
		}
	}()
	// With --overlap-commit the commit of a batch runs beside the write of
	// the next one (commits stay in order, each after its batch's write).
	commits := make(chan []kafka.Message, 1)
	committed := make(chan struct{})
	go func() {
		defer close(committed)
		for batch := range commits {
			if err := r.CommitMessages(work, batch...); err != nil {
				errc <- fmt.Errorf("commit %d records: %w", len(batch), err)
				cancelWork()
				return
			}
		}
	}()
	done := make(chan struct{})
	go func() {
		defer close(done)
		defer func() { close(commits); <-committed }()
		for batch := range batches {
			out := make([]kafka.Message, len(batch))
			for i, m := range batch {
				out[i] = kafka.Message{Key: m.Key, Value: m.Value, Headers: m.Headers}
			}
			if err := w.WriteMessages(work, out...); err != nil {
				errc <- fmt.Errorf("write %d records to %s: %w", len(out), o.output, err)
				return
			}
			if o.overlapCommit {
				select {
				case commits <- batch:
				case <-work.Done():
					return
				}
				continue
			}
			if err := r.CommitMessages(work, batch...); err != nil {
				errc <- fmt.Errorf("commit %d records: %w", len(batch), err)
				return
			}
		}
	}()

	var err error
	select {
	case <-done:
	case err = <-errc:
	}
	cancelWork()
	<-done
	select {
	case e := <-errc:
		err = errors.Join(err, e)
	default:
	}
	return errors.Join(err, w.Close(), r.Close())
}
