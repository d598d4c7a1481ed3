package consumer

import (
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/segmentio/kafka-go"

	"github.com/idemstream/idemstream/dedupe"
	"github.com/idemstream/idemstream/sinks"
)

// Options are what a program that embeds idemstream must choose for one
// pipeline written in code; NewPipeline fills in the rest (the decider, the
// Kafka client and the sinks). A configuration file, with TLS, SASL and
// every Redis topology, is NewService's; a Broker of your own is New's.
type Options struct {
	// Brokers are Kafka's bootstrap addresses (PLAINTEXT).
	Brokers []string
	// Policy says what "the same request" is: from a configuration file
	// (schemas.Config.Policy) or written in code. Its Pipeline is the
	// pipeline's name.
	Policy dedupe.Policy
	// Store keeps the state per key: redisstore for anything that runs in
	// more than one process, memstore for a single process or a test.
	Store dedupe.Store
	// Handler acts on the first copy of each request (nil: Forward).
	Handler Handler

	Input, Output, DLQ string
	Replies            string // optional
	// Group is the consumer group (default "idemstream." + Policy.Pipeline,
	// as the command line names it).
	Group string

	Metrics *Metrics     // optional
	Logger  *slog.Logger // optional
}

// NewPipeline builds a pipeline from Options. Like New, it starts nothing:
// Run does.
func NewPipeline(o Options) (*Pipeline, error) {
	if len(o.Brokers) == 0 {
		return nil, errors.New("consumer: brokers are required")
	}
	if o.Store == nil {
		return nil, errors.New("consumer: a store is required")
	}
	store := o.Store
	if o.Metrics != nil {
		store = instrumentStore(store, o.Metrics)
	}
	d, err := dedupe.NewDecider(o.Policy, store)
	if err != nil {
		return nil, fmt.Errorf("consumer: %w", err)
	}
	group := o.Group
	if group == "" {
		group = "idemstream." + o.Policy.Pipeline
	}
	client := &kafka.Client{Addr: kafka.TCP(o.Brokers...), Timeout: 10 * time.Second}
	return New(Config{
		Name: o.Policy.Pipeline, Input: o.Input, Output: o.Output, DLQ: o.DLQ, Replies: o.Replies,
		Group: group, Brokers: o.Brokers, Decider: d, Store: store, Broker: sinks.NewKafka(client),
		Handler: o.Handler, Metrics: o.Metrics, Logger: o.Logger,
	})
}
