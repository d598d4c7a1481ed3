package demo

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/segmentio/kafka-go"
	"github.com/twmb/franz-go/pkg/kfake"

	"github.com/idemstream/idemstream/audit"
	"github.com/idemstream/idemstream/consumer"
	"github.com/idemstream/idemstream/dedupe"
	"github.com/idemstream/idemstream/dedupe/memstore"
	"github.com/idemstream/idemstream/schemas"
	"github.com/idemstream/idemstream/sinks"
)

// CouponValue is what one coupon is worth: the money lost per extra one.
const CouponValue = 50

// Options configure a run.
type Options struct {
	Workload
	// Members per pipeline: consumer group members sharing the partitions.
	Members int
	// Progress, when set, receives a progress line while the run goes.
	Progress io.Writer
	// Timeout bounds the whole run (default 60s).
	Timeout time.Duration
	// Payload is json (the default) or avro: the campaign written in
	// Avro through an in-process schema registry.
	Payload string
}

// Figures is what a run shows.
type Figures struct {
	Payload      string         `json:"payload"`
	Commands     int            `json:"commands"`
	Users        int            `json:"users"`
	Stock        int            `json:"stock"`
	Injected     map[string]int `json:"injected"`
	Naive        Pipeline       `json:"naive"`
	Idemstream   Pipeline       `json:"idemstream"`
	DeadLetters  []DeadLetter   `json:"example_dead_letters"`
	Audit        AuditFindings  `json:"audit"`
	ElapsedMilli int64          `json:"elapsed_ms"`
}

// AuditFindings is what `idemstream audit` finds in the command topic
// after the replay, told only where the key is: the rules the
// idemstream pipeline was given, found from the data.
type AuditFindings struct {
	Topic        string          `json:"topic"`
	Volatile     []string        `json:"volatile"`
	Unordered    []string        `json:"unordered"`
	ConflictKeys int64           `json:"conflict_keys"`
	Conflicts    []string        `json:"conflict_pointers"`
	Decisions    audit.Decisions `json:"decisions"`
}

// Pipeline is one pipeline's outcome and the damage its handler did.
type Pipeline struct {
	Results      int `json:"results"`
	Replays      int `json:"replays_suppressed"`
	Conflicts    int `json:"conflicts_to_dlq"`
	Invalid      int `json:"invalid"`
	Failed       int `json:"handler_failed"`
	Issued       int `json:"coupons_issued"`
	ExtraCoupons int `json:"extra_coupons"`
	StockLeft    int `json:"stock_left"`
	MoneyLost    int `json:"money_lost"`
}

// DeadLetter is an example record of the dead-letter topic.
type DeadLetter struct {
	Reason        string `json:"reason"`
	Error         string `json:"error"`
	ConflictPaths string `json:"conflict_paths,omitempty"`
	Source        string `json:"source"`
}

// commandTopic is where the clients send their claims.
const commandTopic = "coupon.claim.commands"

const pipelinesYAML = `
pipelines:
  - name: naive
    input: coupon.claim.commands
    output: naive.coupon.claim.results
    dlq: naive.coupon.claim.dlq
    key: {from: message_key, format: any}
    payload: raw
  - name: idemstream
    input: coupon.claim.commands
    output: coupon.claim.results
    dlq: coupon.claim.dlq
    key: {from: header, name: Idempotency-Key, format: uuid}
    semantics: strict
    window: 10m
    volatile: [/client_time, /retry_count, /trace_id]
    unordered: [/items]
`

// desk is the business the commands reach: it issues coupons from a
// stock, one per claim it is asked to honour.
type desk struct {
	mu     sync.Mutex
	stock  int
	issued map[string]int
	// read turns a command into the JSON claim the desk reads (the
	// campaign in Avro); nil: commands are JSON.
	read func([]byte) ([]byte, error)
}

func (d *desk) Handle(_ context.Context, cmd consumer.Command) (consumer.Result, error) {
	out, err := d.claim(cmd.Record.Value)
	if err != nil {
		return consumer.Result{}, consumer.Permanent(err)
	}
	return consumer.Result{Value: out}, nil
}

// errNotAClaim is the desk's refusal of a body that is no claim.
var errNotAClaim = errors.New("not a claim")

// wrongAmount is its refusal of a claim whose amount is not the coupon's.
type wrongAmount struct{ amount int }

func (e *wrongAmount) Error() string {
	return fmt.Sprintf("amount %d does not match the coupon's %d", e.amount, CouponValue)
}

// claim honours one claim: a coupon from the stock, and its record.
func (d *desk) claim(body []byte) ([]byte, error) {
	if d.read != nil {
		js, err := d.read(body)
		if err != nil {
			return nil, fmt.Errorf("%w: %w", errNotAClaim, err)
		}
		body = js
	}
	var c claim
	if err := json.Unmarshal(body, &c); err != nil {
		return nil, fmt.Errorf("%w: %w", errNotAClaim, err)
	}
	if c.UserID == "" {
		return nil, fmt.Errorf("%w: no user_id", errNotAClaim)
	}
	if c.Amount != CouponValue {
		return nil, &wrongAmount{c.Amount}
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	d.stock--
	d.issued[c.UserID]++
	out, _ := json.Marshal(map[string]any{"user_id": c.UserID, "coupon_id": c.CouponID, "coupon_no": d.issued[c.UserID]})
	return out, nil
}

func (d *desk) damage() (issued, extra int) {
	d.mu.Lock()
	defer d.mu.Unlock()
	for _, n := range d.issued {
		issued += n
		extra += max(n-1, 0)
	}
	return issued, extra
}

// Run replays the campaign and returns its figures. It starts an
// in-process broker on a loopback port and stops it before returning.
func Run(ctx context.Context, opts Options) (*Figures, error) {
	started := time.Now()
	w := opts.Workload.withDefaults()
	if opts.Members <= 0 {
		opts.Members = 3
	}
	if opts.Timeout <= 0 {
		opts.Timeout = 60 * time.Second
	}
	ctx, cancel := context.WithTimeout(ctx, opts.Timeout)
	defer cancel()
	gen := Generate(w)
	yaml, avro, err := campaignPayload(&opts, &gen)
	if err != nil {
		return nil, err
	}
	if avro != nil {
		defer avro.close()
	}
	cfg, err := schemas.Parse([]byte(yaml), "")
	if err != nil {
		return nil, err
	}
	var topics []string
	for _, p := range cfg.Pipelines {
		topics = append(topics, p.Output, p.DLQ)
	}
	cluster, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(6, append(topics, cfg.Pipelines[0].Input)...))
	if err != nil {
		return nil, fmt.Errorf("start the embedded broker: %w", err)
	}
	defer cluster.Close()
	// A transport of its own, closed on return: the demo leaves no
	// connection or goroutine behind.
	transport := &kafka.Transport{}
	defer transport.CloseIdleConnections()
	client := &kafka.Client{Addr: kafka.TCP(cluster.ListenAddrs()...), Timeout: 10 * time.Second, Transport: transport}
	c := &campaign{opts: opts, gen: gen, io: sinks.NewKafka(client), reg: prometheus.NewRegistry(), desks: map[string]*desk{}}
	if err := c.build(ctx, cfg, cluster.ListenAddrs(), w.Stock, avro); err != nil {
		return nil, err
	}
	defer c.start(ctx)()
	if err := c.play(ctx, cfg.Pipelines[0].Input); err != nil {
		return nil, err
	}
	f := c.figures(w)
	if f.DeadLetters, err = examples(ctx, c.io, cfg.Pipelines[1].DLQ); err != nil {
		return nil, err
	}
	if f.Audit, err = auditTopic(ctx, client, cfg, cfg.Pipelines[1]); err != nil {
		return nil, err
	}
	f.ElapsedMilli = time.Since(started).Milliseconds()
	return f, nil
}

// campaign is one replay of the campaign on the embedded broker: its
// pipelines' members, the coupon desks behind them, and the metrics their
// figures are read from.
type campaign struct {
	opts    Options
	gen     Generated
	io      *sinks.Kafka
	reg     *prometheus.Registry
	desks   map[string]*desk // by pipeline
	members []*consumer.Pipeline
	errs    chan error // a member's Run that ended with an error
}

// build makes opts.Members members of each pipeline of cfg, each
// pipeline's members sharing one desk and one store.
func (c *campaign) build(ctx context.Context, cfg *schemas.Config, brokers []string, stock int, avro *avroCampaign) error {
	store := memstore.New()
	metrics, err := consumer.NewMetrics(c.reg, "demo")
	if err != nil {
		return err
	}
	for _, pc := range cfg.Pipelines {
		pol, err := cfg.Policy(pc)
		if err != nil {
			return err
		}
		d, err := dedupe.NewDecider(pol, store)
		if err != nil {
			return err
		}
		c.desks[pc.Name] = &desk{stock: stock, issued: map[string]int{}}
		if avro != nil {
			if c.desks[pc.Name].read, err = avro.reader(ctx, cfg); err != nil {
				return err
			}
		}
		for range c.opts.Members {
			p, err := consumer.New(consumer.Config{
				Name: pc.Name, Input: pc.Input, Output: pc.Output, DLQ: pc.DLQ,
				Group: "demo." + pc.Name, Brokers: brokers, Decider: d, Store: store, Broker: c.io,
				Handler: c.desks[pc.Name], Metrics: metrics, Instance: "demo", MaxWait: 50 * time.Millisecond,
				SettleWait: 100 * time.Millisecond,
			})
			if err != nil {
				return err
			}
			c.members = append(c.members, p)
		}
	}
	return nil
}

// start runs every member until the returned stop is called, which
// returns once they have all ended.
func (c *campaign) start(ctx context.Context) (stop func()) {
	runCtx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	c.errs = make(chan error, len(c.members))
	for _, m := range c.members {
		wg.Go(func() {
			if err := m.Run(runCtx); err != nil {
				c.errs <- err
			}
		})
	}
	return func() {
		cancel()
		wg.Wait()
	}
}

// play opens the campaign: every user claims once; retries, second
// thoughts and garbage follow while those are being handled.
func (c *campaign) play(ctx context.Context, input string) error {
	if err := send(ctx, c.io, input, c.gen.Originals); err != nil {
		return err
	}
	if err := c.waitFor(ctx, len(c.gen.Originals)); err != nil {
		return err
	}
	if err := send(ctx, c.io, input, c.gen.Later); err != nil {
		return err
	}
	if err := c.waitFor(ctx, len(c.gen.Originals)+len(c.gen.Later)); err != nil {
		return err
	}
	if c.opts.Progress != nil {
		fmt.Fprintln(c.opts.Progress)
	}
	return nil
}

// decided is how many records pipeline has decided so far.
func (c *campaign) decided(pipeline string) int {
	n := 0
	for _, o := range dedupe.Outcomes {
		n += recordsOf(c.reg, pipeline, o)
	}
	return n
}

// waitFor polls until both pipelines have decided target records, a
// member fails, or ctx ends.
func (c *campaign) waitFor(ctx context.Context, target int) error {
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	all := len(c.gen.Originals) + len(c.gen.Later)
	for {
		a, b := c.decided("naive"), c.decided("idemstream")
		if c.opts.Progress != nil {
			fmt.Fprintf(c.opts.Progress, "\rdeciding: naive %4d/%d   idemstream %4d/%d", a, all, b, all)
		}
		if a >= target && b >= target {
			return nil
		}
		select {
		case err := <-c.errs:
			return err
		case <-ctx.Done():
			return fmt.Errorf("demo did not finish in %v: %d and %d of %d records decided", c.opts.Timeout, a, b, target)
		case <-tick.C:
		}
	}
}

// figures are the campaign's outcome in each pipeline, from the metrics
// and the desks.
func (c *campaign) figures(w Workload) *Figures {
	f := &Figures{
		Payload:  c.opts.Payload,
		Commands: len(c.gen.Originals) + len(c.gen.Later), Users: w.Users, Stock: w.Stock,
		Injected: map[string]int{"volatile_only_retries": c.gen.Retries, "conflicts": c.gen.Conflicts, "garbage": c.gen.Garbage},
	}
	for name, into := range map[string]*Pipeline{"naive": &f.Naive, "idemstream": &f.Idemstream} {
		count := func(o dedupe.OutcomeKind) int {
			return recordsOf(c.reg, name, o)
		}
		*into = Pipeline{Results: count(dedupe.OutcomeFirst), Replays: count(dedupe.OutcomeReplay),
			Conflicts: count(dedupe.OutcomeConflict), Invalid: count(dedupe.OutcomeInvalid), Failed: count(dedupe.OutcomeFailed)}
		into.Issued, into.ExtraCoupons = c.desks[name].damage()
		into.StockLeft = w.Stock - into.Issued
		into.MoneyLost = into.ExtraCoupons * CouponValue
	}
	return f
}

// auditTopic audits the command topic with the key rules of p and no
// other rule, as `idemstream audit --topic ... --key header:Idempotency-Key`.
func auditTopic(ctx context.Context, client *kafka.Client, cfg *schemas.Config, p schemas.Pipeline) (AuditFindings, error) {
	pol, err := cfg.Policy(p)
	if err != nil {
		return AuditFindings{}, err
	}
	rep, err := audit.Run(ctx, &audit.KafkaTopic{Reader: sinks.NewKafka(client), Topic: p.Input}, audit.Options{Policy: pol})
	if err != nil {
		return AuditFindings{}, fmt.Errorf("audit %s: %w", p.Input, err)
	}
	a := AuditFindings{Topic: p.Input, Volatile: rep.Suggested.Volatile, Unordered: rep.Suggested.Unordered,
		ConflictKeys: rep.Conflicts.Keys, Conflicts: []string{}, Decisions: rep.Decisions}
	for _, c := range rep.Conflicts.Pointers {
		a.Conflicts = append(a.Conflicts, c.Pointer)
	}
	return a, nil
}

func send(ctx context.Context, io *sinks.Kafka, topic string, cmds []Command) error {
	msgs := make([]sinks.Message, len(cmds))
	for i, c := range cmds {
		var hs []dedupe.Header
		if c.IdemKey != "" {
			hs = []dedupe.Header{{Key: "Idempotency-Key", Value: []byte(c.IdemKey)}}
		}
		msgs[i] = sinks.Message{Topic: topic, Partition: -1, Key: []byte(c.NaiveKey), Value: c.Body, Headers: hs}
	}
	for start := 0; start < len(msgs); start += 200 {
		if _, err := io.Write(ctx, msgs[start:min(start+200, len(msgs))]); err != nil {
			return fmt.Errorf("send commands: %w", err)
		}
	}
	return nil
}

// examples picks one dead letter per reason, conflicts first.
func examples(ctx context.Context, io *sinks.Kafka, topic string) ([]DeadLetter, error) {
	n, err := io.Partitions(ctx, topic)
	if err != nil {
		return nil, err
	}
	byReason := map[string]DeadLetter{}
	for p := range n {
		recs, err := io.Read(ctx, topic, p, 0, 0)
		if err != nil {
			return nil, err
		}
		for _, r := range recs {
			v := func(k string) string { s, _ := sinks.HeaderValue(r.Headers, k); return s }
			reason := v(sinks.HeaderReason)
			if _, seen := byReason[reason]; !seen {
				byReason[reason] = DeadLetter{Reason: reason, Error: v(sinks.HeaderError),
					ConflictPaths: v(sinks.HeaderConflictPaths), Source: v(sinks.HeaderSource)}
			}
		}
	}
	reasons := make([]string, 0, len(byReason))
	for r := range byReason {
		reasons = append(reasons, r)
	}
	sort.Slice(reasons, func(i, j int) bool {
		if (reasons[i] == "conflict") != (reasons[j] == "conflict") {
			return reasons[i] == "conflict"
		}
		return reasons[i] < reasons[j]
	})
	var out []DeadLetter
	for _, r := range reasons[:min(3, len(reasons))] {
		out = append(out, byReason[r])
	}
	return out, nil
}

// Print writes the figures as a person reads them in a terminal.
func (f *Figures) Print(w io.Writer) {
	fmt.Fprintf(w, "\nThe coupon campaign: %d users, %d claim commands, %d coupons in stock (non-stackable, worth %d each).\n",
		f.Users, f.Commands, f.Stock, CouponValue)
	if f.Payload == "avro" {
		fmt.Fprintln(w, "The commands are Avro records in a schema registry's wire format; idemstream decodes them and applies the same rules by field.")
	}
	fmt.Fprintf(w, "Injected: %d volatile-only retries (new client_time, retry_count, trace_id; some with the items reordered), %d keys reused with another amount, %d garbage records.\n\n",
		f.Injected["volatile_only_retries"], f.Injected["conflicts"], f.Injected["garbage"])
	rows := []struct {
		label string
		get   func(Pipeline) int
	}{
		{"results (handler ran)", func(p Pipeline) int { return p.Results }},
		{"replays suppressed", func(p Pipeline) int { return p.Replays }},
		{"conflicts to DLQ", func(p Pipeline) int { return p.Conflicts }},
		{"invalid to DLQ", func(p Pipeline) int { return p.Invalid }},
		{"handler failed", func(p Pipeline) int { return p.Failed }},
		{"coupons issued", func(p Pipeline) int { return p.Issued }},
		{"extra coupons", func(p Pipeline) int { return p.ExtraCoupons }},
		{"stock left", func(p Pipeline) int { return p.StockLeft }},
		{"money lost", func(p Pipeline) int { return p.MoneyLost }},
	}
	fmt.Fprintf(w, "  %-24s %14s %14s\n", "", "naive (key+body)", "idemstream")
	fmt.Fprintf(w, "  %s\n", strings.Repeat("-", 56))
	for _, r := range rows {
		fmt.Fprintf(w, "  %-24s %14d %14d\n", r.label, r.get(f.Naive), r.get(f.Idemstream))
	}
	fmt.Fprintf(w, "\nExample dead letters of the idemstream pipeline:\n")
	for _, d := range f.DeadLetters {
		fmt.Fprintf(w, "  reason=%s source=%s\n    %s\n", d.Reason, d.Source, d.Error)
		if d.ConflictPaths != "" {
			fmt.Fprintf(w, "    differs at: %s\n", d.ConflictPaths)
		}
	}
	a := f.Audit
	fmt.Fprintf(w, "\nidemstream audit of %s, told only where the key is, finds volatile %s and unordered %s; %d keys reused with another body (at %s).\n",
		a.Topic, strings.Join(a.Volatile, ", "), strings.Join(a.Unordered, ", "), a.ConflictKeys, strings.Join(a.Conflicts, ", "))
	fmt.Fprintf(w, "  Under those rules: %d first, %d replays, %d conflicts, %d invalid.\n",
		a.Decisions.Idemstream.First, a.Decisions.Idemstream.Replay, a.Decisions.Idemstream.Conflict, a.Decisions.Idemstream.Invalid)
	fmt.Fprintf(w, "\nFinished in %.1fs.\n", float64(f.ElapsedMilli)/1000)
}

// recordsOf reads idemstream_records_total of one pipeline and outcome
// from reg.
func recordsOf(reg *prometheus.Registry, pipeline string, o dedupe.OutcomeKind) int {
	fams, err := reg.Gather()
	if err != nil {
		return 0
	}
	for _, fam := range fams {
		if fam.GetName() != "idemstream_records_total" {
			continue
		}
		for _, m := range fam.GetMetric() {
			labels := map[string]string{}
			for _, l := range m.GetLabel() {
				labels[l.GetName()] = l.GetValue()
			}
			if labels["pipeline"] == pipeline && labels["outcome"] == string(o) {
				return int(m.GetCounter().GetValue())
			}
		}
	}
	return 0
}
