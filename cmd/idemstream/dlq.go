package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"strconv"
	"strings"
	"time"

	"github.com/idemstream/idemstream/audit"
	"github.com/idemstream/idemstream/dedupe"
	"github.com/idemstream/idemstream/dlq"
	"github.com/idemstream/idemstream/schemas"
	"github.com/idemstream/idemstream/sinks"
)

const dlqUsage = `Usage: idemstream dlq summary -c FILE [--pipeline NAME] [--from earliest|-DURATION|RFC3339] [-o text|json]
       idemstream dlq show    -c FILE [--pipeline NAME] [-o text|json] PARTITION/OFFSET
       idemstream dlq redrive -c FILE [--pipeline NAME] [--reason R]... [--key K]... [--from T] [--until T]
                              [--to TOPIC] [--rate N] [--dry-run] [--force] [-o text|json]

summary counts a pipeline's dead letters by reason and hour, with the
commonest errors, conflict paths and first copies. show prints one dead
letter with its evidence, and for a conflict the diff against its first
copy under the current rules. redrive writes the selected dead letters'
key, value and headers back to the input, plus idemstream-redrive-of;
only handler_failed without --force, only the latest of a key, and none
whose key has a result since or that was redriven before. Each reads its
topics without a consumer group. 'idemstream dlq SUBCOMMAND -h' for its
flags; docs/dlq.md for the runbook.
`

// cmdDLQ operates a pipeline's dead-letter topic (package dlq).
func cmdDLQ(ctx context.Context, e *env, args []string) error {
	if len(args) > 0 && (args[0] == "-h" || args[0] == "--help" || args[0] == "help") {
		fmt.Fprint(e.stdout, dlqUsage)
		return nil
	}
	if len(args) == 0 || strings.HasPrefix(args[0], "-") {
		return usagef("dlq takes a subcommand: summary, show or redrive ('idemstream dlq -h')")
	}
	switch args[0] {
	case "summary":
		return dlqSummary(ctx, e, args[1:])
	case "show":
		return dlqShow(ctx, e, args[1:])
	case "redrive":
		return dlqRedrive(ctx, e, args[1:])
	}
	return usagef("unknown dlq subcommand %q: summary, show or redrive", args[0])
}

// dlqFlags are the flags every dlq subcommand shares.
type dlqFlags struct {
	cf       *configFlags
	pipeline *string
	output   func() (string, error)
}

func addDLQFlags(fs *flag.FlagSet) *dlqFlags {
	return &dlqFlags{
		cf:       addConfigFlags(fs, "kafka.brokers", "kafka.client_id"),
		pipeline: fs.String("pipeline", "", "pipeline whose dead letters these are (optional when the config has one)"),
		output:   outputFlag(fs, "text", "text", "json"),
	}
}

// open loads the configuration, picks the pipeline and connects to Kafka
// (which connects lazily: nothing is dialed yet).
// parse parses args into fs and returns the output format asked for.
func (df *dlqFlags) parse(fs *flag.FlagSet, args []string) (output string, err error) {
	if err := parseFlags(fs, args); err != nil {
		return "", err
	}
	return df.output()
}

func (df *dlqFlags) open(e *env) (*schemas.Config, schemas.Pipeline, *sinks.Kafka, error) {
	cfg, err := df.cf.load(e)
	if err != nil {
		return nil, schemas.Pipeline{}, nil, err
	}
	p, err := pickPipeline(cfg, *df.pipeline)
	if err != nil {
		return nil, schemas.Pipeline{}, nil, err
	}
	kc, err := sinks.Connect(cfg, e.getenv)
	if err != nil {
		return nil, schemas.Pipeline{}, nil, err
	}
	return cfg, p, kc, nil
}

func dlqSummary(ctx context.Context, e *env, args []string) error {
	fs := newFlags(e, "dlq summary", "-c FILE [--pipeline NAME] [--from earliest|-DURATION|RFC3339] [-o text|json]")
	df := addDLQFlags(fs)
	from := fs.String("from", "earliest", "where to start: earliest, -DURATION before now (-24h) or an RFC 3339 time")
	output, err := df.parse(fs, args)
	if err != nil {
		return err
	}
	if fs.NArg() != 0 {
		return usagef("dlq summary takes no arguments, got %q", fs.Args())
	}
	start, err := audit.ParseFrom(*from, time.Now())
	if err != nil {
		return usagef("--from %v", err)
	}
	_, p, kc, err := df.open(e)
	if err != nil {
		return err
	}
	defer kc.Close()
	src := &audit.KafkaTopic{Reader: kc, Topic: p.DLQ, From: start}
	if isTerminal(e.stderr) {
		src.Progress = progressLine(e.stderr)
	}
	sum, err := dlq.Summarize(ctx, src, dlq.SummaryOptions{Pipeline: p.Name, Topic: p.DLQ, Input: p.Input, From: fromString(start)})
	if src.Progress != nil {
		fmt.Fprint(e.stderr, "\r\033[K")
	}
	if err != nil {
		return brokerHint(err)
	}
	if output == "json" {
		return writeJSON(e, sum)
	}
	return sum.WriteText(e.stdout, time.Now())
}

func dlqShow(ctx context.Context, e *env, args []string) error {
	fs := newFlags(e, "dlq show", "-c FILE [--pipeline NAME] [-o text|json] PARTITION/OFFSET")
	df := addDLQFlags(fs)
	output, err := df.parse(fs, args)
	if err != nil {
		return err
	}
	if fs.NArg() != 1 {
		return usagef("dlq show takes one PARTITION/OFFSET of the dead-letter topic, got %d arguments", fs.NArg())
	}
	cfg, p, kc, err := df.open(e)
	if err != nil {
		return err
	}
	defer kc.Close()
	pos, err := dlqPosition(fs.Arg(0), p.DLQ)
	if err != nil {
		return err
	}
	pol, err := cfg.Policy(p)
	if err != nil {
		return err
	}
	in, err := dlq.NewInspector(pol, p.Input, kc)
	if err != nil {
		return err
	}
	shown, err := in.Show(ctx, pos)
	if errors.Is(err, dlq.ErrGone) {
		return fmt.Errorf("dead letter %w; 'idemstream dlq summary' shows what the topic holds", err)
	}
	if err != nil {
		return brokerHint(err)
	}
	if output == "json" {
		return writeJSON(e, shown)
	}
	return shown.WriteText(e.stdout)
}

// fromString is --from as the summary reports it: earliest, or the time
// in UTC.
func fromString(f audit.From) string {
	if f.Time.IsZero() {
		return "earliest"
	}
	return f.Time.UTC().Format(time.RFC3339)
}

// dlqPosition reads PARTITION/OFFSET, or TOPIC/PARTITION/OFFSET as the
// idemstream-redrive-of header spells it, of the topic dlqTopic.
func dlqPosition(arg, dlqTopic string) (dlq.Position, error) {
	want := usagef("%q: want PARTITION/OFFSET of %s, such as 0/42", arg, dlqTopic)
	if strings.Count(arg, "/") >= 2 {
		pos, err := dlq.ParsePosition(arg)
		if err != nil {
			return dlq.Position{}, want
		}
		if pos.Topic != dlqTopic {
			return dlq.Position{}, usagef("%q is not in the pipeline's dead-letter topic %s: pick the pipeline with --pipeline", arg, dlqTopic)
		}
		return pos, nil
	}
	part, off, ok := strings.Cut(arg, "/")
	p, err1 := strconv.Atoi(part)
	o, err2 := strconv.ParseInt(off, 10, 64)
	if !ok || err1 != nil || err2 != nil || p < 0 || o < 0 {
		return dlq.Position{}, want
	}
	return dlq.Position{Topic: dlqTopic, Partition: p, Offset: o}, nil
}

// brokerHint adds what to do to an error of a broker that did not
// answer.
func brokerHint(err error) error {
	switch {
	case errors.Is(err, dlq.ErrGone):
		return err
	case errors.Is(err, sinks.ErrUnknownTopic):
		return fmt.Errorf("%w; check the topic's name in the configuration (or --to)", err)
	case errors.Is(err, dedupe.ErrBrokerUnavailable):
		return fmt.Errorf("%w; check that kafka.brokers (or --brokers) answer, then run it again", err)
	}
	return err
}

// listFlag is a flag that may be given more than once.
type listFlag []string

func (l *listFlag) String() string     { return strings.Join(*l, ",") }
func (l *listFlag) Set(v string) error { *l = append(*l, v); return nil }

const redriveSynopsis = `-c FILE [--pipeline NAME] [--reason R]... [--key K]... [--from T] [--until T]
                              [--to TOPIC] [--rate N] [--dry-run] [--force] [-o text|json]`

// redriveArgs are redrive's flags once checked.
type redriveArgs struct {
	reasons, keys listFlag
	from, until   string
	to            string
	rate          float64
	dryRun, force bool
	output        string
}

func dlqRedrive(ctx context.Context, e *env, args []string) error {
	fs := newFlags(e, "dlq redrive", redriveSynopsis)
	df := addDLQFlags(fs)
	var ra redriveArgs
	fs.Var(&ra.reasons, "reason", "redrive dead letters of this reason (repeat for several; default every reason, and only handler_failed is sent without --force)")
	fs.Var(&ra.keys, "key", "redrive dead letters of this idempotency key (repeat for several)")
	fs.StringVar(&ra.from, "from", "earliest", "dead letters written at or after: earliest, -DURATION before now (-24h) or an RFC 3339 time")
	fs.StringVar(&ra.until, "until", "", "dead letters written before: -DURATION before now or an RFC 3339 time (default: every one up to the start)")
	fs.StringVar(&ra.to, "to", "", "topic to write to (default the pipeline's input)")
	fs.Float64Var(&ra.rate, "rate", 100, "records written a second at most")
	fs.BoolVar(&ra.dryRun, "dry-run", false, "print what would be sent, send nothing")
	fs.BoolVar(&ra.force, "force", false, "send conflicts and invalid records too, which come straight back unless their cause was fixed; redrive into an input another pipeline reads")
	output, err := df.parse(fs, args)
	if err != nil {
		return err
	}
	if fs.NArg() != 0 {
		return usagef("dlq redrive takes no arguments, got %q", fs.Args())
	}
	ra.output = output
	cfg, p, kc, err := df.open(e)
	if err != nil {
		return err
	}
	defer kc.Close()
	opts, start, err := ra.options(p)
	if err != nil {
		return err
	}
	if err := checkOtherPipelines(cfg, p, opts.To, ra.force); err != nil {
		return err
	}
	if _, err := kc.Partitions(ctx, opts.To); err != nil {
		return brokerHint(fmt.Errorf("--to %s: %w", opts.To, err))
	}
	src := &audit.KafkaTopic{Reader: kc, Topic: p.DLQ, From: start}
	pl := &redriveProgress{w: e.stderr, dlq: p.DLQ, started: time.Now()}
	opts.Open = func(topic string, from time.Time) audit.Source {
		t := &audit.KafkaTopic{Reader: kc, Topic: topic, From: audit.From{Time: from}}
		if isTerminal(e.stderr) && !ra.dryRun {
			t.Progress = pl.reading(topic)
		}
		return t
	}
	if isTerminal(e.stderr) && !ra.dryRun {
		src.Progress, opts.Progress = pl.reading(p.DLQ), pl.sent
	}
	rd, err := dlq.NewRedriver(kc, kc, opts)
	if err != nil {
		return usagef("%v", err)
	}
	rep, err := rd.Run(ctx, src)
	pl.clear()
	if perr := printRedrive(e, output, &rep); err == nil {
		return perr
	}
	return fmt.Errorf("stopped after sending %d dead letters: %w; run the same command again (once the cause is fixed): it skips what was sent already", rep.Sent, brokerHint(err))
}

// checkOtherPipelines refuses, without force, a redrive that another
// pipeline of the configuration would read too: into its input (its
// store decided the command before, and runs a copy again once its key
// is forgotten), or of a pipeline that shares both its input and its
// dead-letter topic with it (their dead letters cannot be told apart).
func checkOtherPipelines(cfg *schemas.Config, p schemas.Pipeline, to string, force bool) error {
	if force {
		return nil
	}
	for _, q := range cfg.Pipelines {
		switch {
		case q.Name == p.Name:
		case q.Input == to:
			return usagef("%s is also the input of pipeline %s, which would run the copies again once it forgets their keys; add --force to send them anyway", to, q.Name)
		case q.Input == p.Input && q.DLQ == p.DLQ:
			return usagef("pipeline %s shares the input %s and the dead-letter topic %s: their dead letters cannot be told apart; add --force to send them anyway", q.Name, p.Input, p.DLQ)
		}
	}
	return nil
}

func printRedrive(e *env, output string, rep *dlq.RedriveReport) error {
	if output == "json" {
		return writeJSON(e, rep)
	}
	return rep.WriteText(e.stdout)
}

// options checks the flags against the pipeline and builds the redrive's
// options and where its read starts.
func (ra *redriveArgs) options(p schemas.Pipeline) (dlq.RedriveOptions, audit.From, error) {
	now := time.Now()
	o := dlq.RedriveOptions{Pipeline: p.Name, DLQ: p.DLQ, Input: p.Input, Output: p.Output, To: ra.to, Force: ra.force, DryRun: ra.dryRun,
		List: ra.dryRun || ra.output == "json"}
	for _, r := range ra.reasons {
		reason := dedupe.Reason(r)
		if !dlq.KnownReason(reason) {
			return o, audit.From{}, usagef("--reason %q: want one of %s", r, reasonList())
		}
		if !dlq.Redrivable(reason) && !ra.force {
			return o, audit.From{}, usagef("--reason %s: such dead letters %v; fix the cause, then add --force to send them anyway", r, dlq.ErrNotRedrivable)
		}
		o.Select.Reasons = append(o.Select.Reasons, reason)
	}
	format, err := dedupe.ParseKeyFormat(p.Key.Format)
	if err != nil {
		return o, audit.From{}, err
	}
	for _, k := range ra.keys {
		key, err := format.Normalize(k)
		if err != nil {
			return o, audit.From{}, usagef("--key %q: %v", k, err)
		}
		o.Select.Keys = append(o.Select.Keys, key)
	}
	start, err := audit.ParseFrom(ra.from, now)
	if err != nil {
		return o, audit.From{}, usagef("--from %v", err)
	}
	o.Select.From = start.Time
	if ra.until != "" {
		until, err := audit.ParseFrom(ra.until, now)
		if err != nil || until.Time.IsZero() {
			return o, audit.From{}, usagef("--until %q: want -DURATION before now (-1h) or an RFC 3339 time", ra.until)
		}
		o.Select.Until = until.Time
	}
	if err := ra.checkTarget(p); err != nil {
		return o, audit.From{}, err
	}
	if o.To == "" {
		o.To = p.Input
	}
	if !(ra.rate > 0) {
		return o, audit.From{}, usagef("--rate %v: want a number of records a second above 0", ra.rate)
	}
	if !ra.dryRun {
		if o.Limiter, err = dlq.NewLimiter(ra.rate, nil); err != nil {
			return o, audit.From{}, usagef("--rate %v: %v", ra.rate, err)
		}
	}
	return o, start, nil
}

// checkTarget refuses a --to that would mix commands into the pipeline's
// own outputs.
func (ra *redriveArgs) checkTarget(p schemas.Pipeline) error {
	switch ra.to {
	case "", p.Input:
		return nil
	case p.DLQ:
		return usagef("--to %s is the dead-letter topic: the records would be read again, not processed", ra.to)
	case p.Output:
		return usagef("--to %s is the pipeline's output: commands there would pass for results", ra.to)
	case p.Replies:
		return usagef("--to %s is the pipeline's replies topic: commands there would pass for replies", ra.to)
	}
	return nil
}

func reasonList() string {
	out := make([]string, len(dedupe.Reasons))
	for i, r := range dedupe.Reasons {
		out[i] = string(r)
	}
	return strings.Join(out, ", ")
}

// redriveProgress rewrites one line of a terminal while a redrive reads
// and sends, at most five times a second. Every callback comes from the
// goroutine that reads the topics.
type redriveProgress struct {
	w             io.Writer
	dlq           string
	started, last time.Time
	topic         string
	nRead, nTotal int64
	dlqTotal      int64
	nSent         int64
	shown         bool
}

// reading is the progress of a read of topic.
func (r *redriveProgress) reading(topic string) func(audit.Progress) {
	return func(p audit.Progress) {
		r.topic, r.nRead, r.nTotal = topic, p.Read, p.Total
		if topic == r.dlq {
			r.dlqTotal = p.Total
		}
		r.draw()
	}
}

func (r *redriveProgress) sent(rep dlq.RedriveReport) {
	r.nSent = rep.Sent
	r.topic, r.nRead, r.nTotal = r.dlq, rep.Records, r.dlqTotal
	r.draw()
}

func (r *redriveProgress) draw() {
	if time.Since(r.last) < 200*time.Millisecond {
		return
	}
	r.last, r.shown = time.Now(), true
	rate := float64(r.nSent) / max(time.Since(r.started).Seconds(), 0.001)
	fmt.Fprintf(r.w, "\r\033[Kredriving: read %d/%d records of %s, sent %d (%.0f/s)", r.nRead, r.nTotal, r.topic, r.nSent, rate)
}

func (r *redriveProgress) clear() {
	if r.shown {
		fmt.Fprint(r.w, "\r\033[K")
	}
}
