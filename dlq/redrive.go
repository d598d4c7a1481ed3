package dlq

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/idemstream/idemstream/audit"
	"github.com/idemstream/idemstream/dedupe"
	"github.com/idemstream/idemstream/internal/partition"
	"github.com/idemstream/idemstream/internal/retry"
	"github.com/idemstream/idemstream/sinks"
)

// Writer writes records and says where each landed. *sinks.Kafka is one:
// acks from all in-sync replicas, no blind retries.
type Writer interface {
	Write(ctx context.Context, msgs []sinks.Message) ([]sinks.Written, error)
	Partitions(ctx context.Context, topic string) (int, error)
}

// RedriveOptions say what a Redriver sends, where and how fast.
type RedriveOptions struct {
	// Pipeline, DLQ and Input name the pipeline, the topic the dead
	// letters are read from and the pipeline's input.
	Pipeline, DLQ, Input string
	// Output is the pipeline's output: a dead letter whose key has a
	// result there, written at or after it, is not sent.
	Output string
	// To is the topic written to: Input when empty. Written to Input, a
	// record goes back to the partition it was consumed from; written
	// elsewhere, to the partition of its Kafka key, or of its idempotency
	// key when it has none (murmur2, as Java producers pick it), so that
	// the copies of one command land in one partition, in order.
	To string
	// Select chooses the dead letters; its Input is set to Input.
	Select Selector
	// Force sends dead letters that Redrivable refuses.
	Force bool
	// DryRun sends nothing and reports what would be sent.
	DryRun bool
	// Limiter paces the writes (nil: no limit).
	Limiter *Limiter
	// BatchSize bounds the records of one write (default 100; never more
	// than the limiter's burst).
	BatchSize int
	// Attempts bounds the tries of a write that fails for a reason that
	// may pass (default 5).
	Attempts int
	// List fills RedriveReport.Redriven, one entry per record sent (about
	// 150 bytes each).
	List bool
	// Progress, when set, is called after each write.
	Progress func(RedriveReport)
	// Open returns the records of topic from the first one at or after
	// from to the end offsets seen when it is first read: the output and
	// the topics written to are read so before anything is sent. nil: an
	// audit.KafkaTopic of the Reader, which must then be a *sinks.Kafka.
	Open func(topic string, from time.Time) audit.Source
}

// RedriveReport is what a redrive did: the JSON form of
// `idemstream dlq redrive -o json` (docs/dlq.md).
type RedriveReport struct {
	Pipeline string  `json:"pipeline"`
	DLQ      string  `json:"dlq"`
	To       string  `json:"to"`
	DryRun   bool    `json:"dry_run"`
	Force    bool    `json:"force"`
	Rate     float64 `json:"rate"`
	// Records are the records read; Selected the pipeline's dead letters
	// the selection took; Sent those written and acknowledged (with
	// DryRun, those that would be).
	Records  int64 `json:"records"`
	Selected int64 `json:"selected"`
	Sent     int64 `json:"sent"`
	// SentByReason counts Sent by reason; Refused the selected dead
	// letters Redrivable refused (no Force), by reason; Skipped the
	// others, by why (SkipReasons: SkippedSuperseded and the others).
	SentByReason map[dedupe.Reason]int64 `json:"sent_by_reason"`
	Refused      map[dedupe.Reason]int64 `json:"refused"`
	Skipped      map[string]int64        `json:"skipped"`
	// TooLarge lists the dead letters skipped as SkippedTooLarge: each
	// needs a look of its own.
	TooLarge []Position `json:"too_large"`
	// Interrupted is a redrive that stopped before the end (its context
	// ended, or a write failed): run it again.
	Interrupted bool `json:"interrupted"`
	// Redriven lists each record sent (or that would be), with
	// RedriveOptions.List.
	Redriven []Redriven `json:"redriven"`
}

// Redriven is one dead letter sent back.
type Redriven struct {
	DeadLetter Position      `json:"dead_letter"`
	Reason     dedupe.Reason `json:"reason"`
	Key        string        `json:"key"`
	// To is where it was written (with DryRun, its partition's offset
	// is -1: not written).
	To Position `json:"to"`
}

// Redriver sends dead letters back to a pipeline's input: Run, once. It
// is not safe for concurrent use.
type Redriver struct {
	w       Writer
	r       Reader
	o       RedriveOptions
	rep     RedriveReport
	plan    plan
	pending []pending
	seen    map[string]struct{}
}

type pending struct {
	msg      sinks.Message
	out      Redriven
	tooLarge bool
}

// NewRedriver returns a Redriver that writes with w and reads the source
// of a trimmed dead letter with r. It starts nothing.
func NewRedriver(w Writer, r Reader, o RedriveOptions) (*Redriver, error) {
	if o.Input == "" || o.DLQ == "" || o.Output == "" {
		return nil, errors.New("the pipeline's input, output and dead-letter topics are required")
	}
	if o.Open == nil {
		k, ok := r.(*sinks.Kafka)
		if !ok {
			return nil, errors.New("RedriveOptions.Open is required to read the output and input topics")
		}
		o.Open = func(topic string, from time.Time) audit.Source {
			return &audit.KafkaTopic{Reader: k, Topic: topic, From: audit.From{Time: from}}
		}
	}
	if o.To == "" {
		o.To = o.Input
	}
	if o.To == o.DLQ {
		return nil, fmt.Errorf("%s is the dead-letter topic itself: redriving into it would read the records again", o.To)
	}
	o.Select.Input = o.Input
	if refused := o.Select.Refused(); len(refused) > 0 && !o.Force {
		return nil, fmt.Errorf("reason %s: %w; fix the cause, then add --force to send them anyway", refused[0], ErrNotRedrivable)
	}
	o.BatchSize = cmpOr(o.BatchSize, 100)
	o.Attempts = cmpOr(o.Attempts, 5)
	if o.Limiter != nil {
		o.BatchSize = min(o.BatchSize, o.Limiter.Burst())
	}
	rep := RedriveReport{Pipeline: o.Pipeline, DLQ: o.DLQ, To: o.To, DryRun: o.DryRun, Force: o.Force,
		SentByReason: map[dedupe.Reason]int64{}, Refused: map[dedupe.Reason]int64{}, Skipped: map[string]int64{},
		TooLarge: []Position{}, Redriven: []Redriven{}}
	if o.Limiter != nil {
		rep.Rate = o.Limiter.Rate()
	}
	return &Redriver{w: w, r: r, o: o, rep: rep, seen: map[string]struct{}{}}, nil
}

func cmpOr(v, def int) int {
	if v > 0 {
		return v
	}
	return def
}

// Run reads src, the dead-letter topic, and sends what the selection
// takes. It reads src twice (the same records in the same order each
// time, as an audit.KafkaTopic does): first to find the earliest dead
// letter that may be sent and each key's latest handler_failed dead
// letter; then, after reading the output for results and the topics it
// writes to for records redriven before, to send. The report says what
// was sent also when Run fails or ctx ends: Interrupted is then set.
func (rd *Redriver) Run(ctx context.Context, src audit.Source) (RedriveReport, error) {
	err := rd.prepare(ctx, src)
	if err == nil {
		err = src.Scan(ctx, func(rec *dedupe.Record) error {
			d := Parse(rec)
			return rd.add(ctx, &d)
		})
	}
	if err == nil {
		// A scan whose context ended may stop early without an error.
		err = ctx.Err()
	}
	if err == nil {
		err = rd.flush(ctx)
	}
	if err != nil {
		rd.rep.Interrupted = true
	}
	return rd.Report(), err
}

// add takes d if the selection does and nothing says to skip it, and
// sends what is held when a batch is full.
func (rd *Redriver) add(ctx context.Context, d *DeadLetter) error {
	rd.rep.Records++
	if !rd.o.Select.Match(d) {
		return nil
	}
	rd.rep.Selected++
	if !Redrivable(d.Reason) && !rd.o.Force {
		rd.rep.Refused[d.Reason]++
		return nil
	}
	if why := rd.skip(d); why != "" {
		rd.rep.Skipped[why]++
		return nil
	}
	whole := *d
	if d.Trimmed {
		if d.Source.IsZero() || rd.r == nil {
			rd.rep.Skipped[SkippedPayloadCut]++
			return nil
		}
		rec, err := RecordAt(ctx, rd.r, d.Source)
		switch {
		case errors.Is(err, ErrGone):
			rd.rep.Skipped[SkippedPayloadCut]++
			return nil
		case err != nil:
			return fmt.Errorf("read the whole record of trimmed dead letter %s: %w", d.At, err)
		}
		whole.Key, whole.Value, whole.Headers = rec.Key, rec.Value, rec.Headers
	}
	p, err := rd.message(ctx, &whole)
	if err != nil {
		return err
	}
	rd.pending = append(rd.pending, p)
	if len(rd.pending) >= rd.o.BatchSize {
		return rd.flush(ctx)
	}
	return nil
}

// message builds the record to send for d: its original key, value and
// headers, and idemstream-redrive-of.
func (rd *Redriver) message(ctx context.Context, d *DeadLetter) (pending, error) {
	key, value, headers := d.Original()
	headers = append(headers, dedupe.Header{Key: HeaderRedriveOf, Value: []byte(d.At.String())})
	n, err := rd.w.Partitions(ctx, rd.o.To)
	if err != nil {
		return pending{}, fmt.Errorf("topic %s: %w", rd.o.To, err)
	}
	part := partition.For(partitionKey(d, key), n)
	if rd.o.To == d.Source.Topic && d.Source.Partition < n {
		part = d.Source.Partition
	}
	return pending{
		msg: sinks.Message{Topic: rd.o.To, Partition: part, Key: key, Value: value, Headers: headers},
		out: Redriven{DeadLetter: d.At, Reason: d.Reason, Key: d.IdemKey, To: Position{Topic: rd.o.To, Partition: part, Offset: -1}},
	}, nil
}

// partitionKey is what places a record written elsewhere than where it
// was consumed: its Kafka key, or, for a record without one (which
// murmur2 would place at random), its idempotency key, as the pipeline
// keys its results; without either, its source.
func partitionKey(d *DeadLetter, key []byte) []byte {
	switch {
	case key != nil:
		return key
	case d.IdemKey != "":
		return []byte(d.IdemKey)
	}
	return []byte(d.Source.String())
}

// flush sends the records held, at the limiter's pace.
func (rd *Redriver) flush(ctx context.Context) error {
	for len(rd.pending) > 0 {
		n := min(len(rd.pending), rd.o.BatchSize)
		if rd.o.Limiter != nil && !rd.o.DryRun {
			var err error
			if n, err = rd.o.Limiter.Take(ctx, n); err != nil {
				return err
			}
		}
		batch := rd.pending[:n]
		var err error
		if !rd.o.DryRun {
			err = rd.write(ctx, batch)
		}
		// A write that failed may have had some records acknowledged:
		// those were sent.
		for _, p := range batch {
			switch {
			case p.tooLarge:
				rd.rep.Skipped[SkippedTooLarge]++
				rd.rep.TooLarge = append(rd.rep.TooLarge, p.out.DeadLetter)
			case rd.o.DryRun || p.out.To.Offset >= 0:
				rd.rep.Sent++
				rd.rep.SentByReason[p.out.Reason]++
				if rd.o.List {
					rd.rep.Redriven = append(rd.rep.Redriven, p.out)
				}
			}
		}
		if err != nil {
			return err
		}
		rd.pending = rd.pending[n:]
		if rd.o.Progress != nil {
			rd.o.Progress(rd.Report())
		}
	}
	rd.pending = nil
	return nil
}

// write sends batch, again for the records whose write failed for a
// reason that may pass. A record the broker refused for its size is
// marked tooLarge and not tried again: it would be refused again, and the
// others go on. A record whose write had an unknown outcome may be
// written twice: the pipeline decides the second copy a replay.
func (rd *Redriver) write(ctx context.Context, batch []pending) error {
	todo := make([]int, len(batch))
	for i := range todo {
		todo[i] = i
	}
	backoff := retry.Backoff{Min: 100 * time.Millisecond, Max: 5 * time.Second}
	for attempt := 1; ; attempt++ {
		msgs := make([]sinks.Message, len(todo))
		for i, j := range todo {
			msgs[i] = batch[j].msg
		}
		written, err := rd.w.Write(ctx, msgs)
		again, failure := settle(batch, todo, written, err)
		if len(again) == 0 {
			return nil
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
		if !dedupe.IsRetryable(failure) || attempt >= rd.o.Attempts {
			return fmt.Errorf("write to %s: %w", rd.o.To, failure)
		}
		if err := retry.Sleep(ctx, backoff.Next()); err != nil {
			return err
		}
		todo = again
	}
}

// settle records where the records todo of batch landed, marks those
// refused for their size, and returns the others that failed with the
// error to judge them by: the first failure that cannot pass, or else
// the first.
func settle(batch []pending, todo []int, written []sinks.Written, err error) (again []int, failure error) {
	var passing error
	for i, j := range todo {
		w := sinks.Written{Err: err}
		if i < len(written) {
			w = written[i]
		} else if err == nil {
			w.Err = errors.New("not acknowledged")
		}
		switch {
		case w.Err == nil:
			batch[j].out.To.Partition, batch[j].out.To.Offset = w.Partition, w.Offset
		case errors.Is(w.Err, dedupe.ErrPayloadTooLarge):
			batch[j].tooLarge = true
		default:
			again = append(again, j)
			if failure == nil && !dedupe.IsRetryable(w.Err) {
				failure = w.Err
			}
			if passing == nil {
				passing = w.Err
			}
		}
	}
	if failure == nil {
		failure = passing
	}
	return again, failure
}

// Report returns what was done so far.
func (rd *Redriver) Report() RedriveReport { return rd.rep }
