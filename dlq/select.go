package dlq

import (
	"slices"
	"time"

	"github.com/idemstream/idemstream/dedupe"
)

// Selector chooses dead letters. The zero Selector but for Input takes
// every dead letter of the pipeline.
type Selector struct {
	// Input is the pipeline's input topic: a dead-letter topic may be
	// shared by pipelines, and a dead letter is the pipeline's when its
	// idemstream-source is on its input.
	Input string
	// Reasons, when not empty, are the reasons taken.
	Reasons []dedupe.Reason
	// Keys, when not empty, are the idempotency keys taken, normalized
	// as the pipeline's key format normalizes them (idemstream-key holds
	// them so).
	Keys []string
	// From and Until, when not zero, bound the dead letters' timestamps:
	// From <= Time < Until.
	From, Until time.Time
}

// Ours reports whether d is a dead letter of the pipeline.
func (s *Selector) Ours(d *DeadLetter) bool {
	return d.Reason != "" && d.Source.Topic == s.Input
}

// Match reports whether d is a dead letter of the pipeline that the
// selection takes.
func (s *Selector) Match(d *DeadLetter) bool {
	switch {
	case !s.Ours(d):
		return false
	case len(s.Reasons) > 0 && !slices.Contains(s.Reasons, d.Reason):
		return false
	case len(s.Keys) > 0 && (d.IdemKey == "" || !slices.Contains(s.Keys, d.IdemKey)):
		return false
	case !s.From.IsZero() && d.Time.Before(s.From):
		return false
	case !s.Until.IsZero() && !d.Time.Before(s.Until):
		return false
	}
	return true
}

// Refused returns the reasons of s that Redrivable refuses: a selection
// that names one asks for what would come straight back.
func (s *Selector) Refused() []dedupe.Reason {
	var out []dedupe.Reason
	for _, r := range s.Reasons {
		if !Redrivable(r) {
			out = append(out, r)
		}
	}
	return out
}
