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
	// To is the topic written to: Input when empty. Written to Input, a
	// record goes back to the partition it was consumed from; written
	// elsewhere, to the partition of its key (murmur2, as Java producers
	// pick it).
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
	// others, by why: "duplicate" (the same key and fingerprint as one
	// sent before in this run) or "payload_cut" (trimmed, and the source
	// that holds the whole record is gone).
	SentByReason map[dedupe.Reason]int64 `json:"sent_by_reason"`
	Refused      map[dedupe.Reason]int64 `json:"refused"`
	Skipped      map[string]int64        `json:"skipped"`
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

// Skipped reasons.
const (
	SkippedDuplicate  = "duplicate"
	SkippedPayloadCut = "payload_cut"
)

// Redriver sends dead letters back to a pipeline's input. Add them in
// the order read (Run reads a topic and does); Flush sends what is held.
// It is not safe for concurrent use.
type Redriver struct {
	w       Writer
	r       Reader
	o       RedriveOptions
	rep     RedriveReport
	pending []pending
	seen    map[string]struct{}
}

type pending struct {
	msg sinks.Message
	out Redriven
}

// NewRedriver returns a Redriver that writes with w and reads the source
// of a trimmed dead letter with r. It starts nothing.
func NewRedriver(w Writer, r Reader, o RedriveOptions) (*Redriver, error) {
	if o.Input == "" || o.DLQ == "" {
		return nil, errors.New("the pipeline's input and dead-letter topics are required")
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
		SentByReason: map[dedupe.Reason]int64{}, Refused: map[dedupe.Reason]int64{}, Skipped: map[string]int64{}, Redriven: []Redriven{}}
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
// takes. The report says what was sent also when Run fails or ctx ends:
// Interrupted is then set.
func (rd *Redriver) Run(ctx context.Context, src audit.Source) (RedriveReport, error) {
	err := src.Scan(ctx, func(rec *dedupe.Record) error {
		d := Parse(rec)
		return rd.Add(ctx, &d)
	})
	if err == nil {
		// A scan whose context ended may stop early without an error.
		err = ctx.Err()
	}
	if err == nil {
		err = rd.Flush(ctx)
	}
	if err != nil {
		rd.rep.Interrupted = true
	}
	return rd.Report(), err
}

// Add takes d if the selection does, and sends what is held when a batch
// is full.
func (rd *Redriver) Add(ctx context.Context, d *DeadLetter) error {
	rd.rep.Records++
	if !rd.o.Select.Match(d) {
		return nil
	}
	rd.rep.Selected++
	if !Redrivable(d.Reason) && !rd.o.Force {
		rd.rep.Refused[d.Reason]++
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
	if d.IdemKey != "" && d.Fingerprint != "" {
		id := d.IdemKey + "\x00" + d.Fingerprint
		if _, dup := rd.seen[id]; dup {
			rd.rep.Skipped[SkippedDuplicate]++
			return nil
		}
		rd.seen[id] = struct{}{}
	}
	p, err := rd.message(ctx, &whole)
	if err != nil {
		return err
	}
	rd.pending = append(rd.pending, p)
	if len(rd.pending) >= rd.o.BatchSize {
		return rd.Flush(ctx)
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
	part := partition.For(key, n)
	if rd.o.To == d.Source.Topic && d.Source.Partition < n {
		part = d.Source.Partition
	}
	return pending{
		msg: sinks.Message{Topic: rd.o.To, Partition: part, Key: key, Value: value, Headers: headers},
		out: Redriven{DeadLetter: d.At, Reason: d.Reason, Key: d.IdemKey, To: Position{Topic: rd.o.To, Partition: part, Offset: -1}},
	}, nil
}

// Flush sends the records held, at the limiter's pace.
func (rd *Redriver) Flush(ctx context.Context) error {
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
			if rd.o.DryRun || p.out.To.Offset >= 0 {
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
// reason that may pass. A record whose write had an unknown outcome may
// be written twice: the pipeline decides the second copy a replay.
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
		var again []int
		for i, w := range written {
			if w.Err != nil {
				again = append(again, todo[i])
				continue
			}
			batch[todo[i]].out.To.Partition, batch[todo[i]].out.To.Offset = w.Partition, w.Offset
		}
		if err == nil && len(again) == 0 {
			return nil
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
		if err == nil {
			err = fmt.Errorf("%d record(s) not acknowledged", len(again))
		}
		if !dedupe.IsRetryable(err) || attempt >= rd.o.Attempts {
			return fmt.Errorf("write to %s: %w", rd.o.To, err)
		}
		if err := retry.Sleep(ctx, backoff.Next()); err != nil {
			return err
		}
		todo = again
	}
}

// Report returns what was done so far.
func (rd *Redriver) Report() RedriveReport { return rd.rep }
