package dlq

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"time"
	"unicode/utf8"

	"github.com/idemstream/idemstream/dedupe"
)

// Inspector explains single dead letters under a pipeline's current
// rules, reading back the records they came from.
type Inspector struct {
	decider *dedupe.Decider
	reader  Reader
	input   string
}

// NewInspector returns an Inspector of the pipeline of pol, whose input
// topic is input. It connects to nothing.
func NewInspector(pol dedupe.Policy, input string, r Reader) (*Inspector, error) {
	// Prepare and the canonicalizer touch no store.
	d, err := dedupe.NewDecider(pol, nil)
	if err != nil {
		return nil, err
	}
	return &Inspector{decider: d, reader: r, input: input}, nil
}

// Shown is one dead letter with its evidence: the JSON form of
// `idemstream dlq show -o json` (docs/dlq.md).
type Shown struct {
	DeadLetter  Position      `json:"dead_letter"`
	Time        time.Time     `json:"time"`
	Pipeline    string        `json:"pipeline"`
	Reason      dedupe.Reason `json:"reason"`
	Error       string        `json:"error"`
	Key         string        `json:"key"`
	Fingerprint string        `json:"fingerprint"`
	// Source is the input record the dead letter came from.
	Source Copy `json:"source"`
	// First is a conflict's stored first copy (null for other reasons),
	// ConflictPaths the pointers the dead letter names, Diff the
	// comparison made now, under the current rules (null when the first
	// copy cannot be read).
	First         *Copy    `json:"first"`
	ConflictPaths []string `json:"conflict_paths"`
	Diff          *Diff    `json:"diff"`
	// Now is the record decided again under the current rules, without
	// a store: its key, fingerprint, and the reason it would be invalid.
	Now         Verdict  `json:"now"`
	Trimmed     bool     `json:"trimmed"`
	PayloadSize int      `json:"payload_size"`
	RedriveOf   Position `json:"redrive_of"`
	Redrive     Advice   `json:"redrive"`
	Record      Record   `json:"record"`
}

// Copy is a record a dead letter names, and whether it can be read.
type Copy struct {
	Position Position `json:"position"`
	// Fingerprint is the one the dead letter's headers give it.
	Fingerprint string `json:"fingerprint"`
	Found       bool   `json:"found"`
	// Why it cannot be read, when it cannot.
	Why string `json:"why"`
}

// Diff compares a conflict with its first copy under the current rules.
type Diff struct {
	Rules            string   `json:"rules"`
	Fingerprint      string   `json:"fingerprint"`
	FirstFingerprint string   `json:"first_fingerprint"`
	Same             bool     `json:"same"`
	Paths            []string `json:"paths"`
	// Error is a payload that the current rules cannot read.
	Error string `json:"error"`
}

// Verdict is a record prepared under the current rules.
type Verdict struct {
	Rules       string        `json:"rules"`
	Key         string        `json:"key"`
	Fingerprint string        `json:"fingerprint"`
	Reason      dedupe.Reason `json:"reason"`
	Error       string        `json:"error"`
}

// Advice says whether redrive sends the dead letter, and why not.
type Advice struct {
	Allowed bool   `json:"allowed"`
	Why     string `json:"why"`
}

// Record is the input record a dead letter carries.
type Record struct {
	Key     Bytes    `json:"key"`
	Headers []Header `json:"headers"`
	Value   Bytes    `json:"value"`
}

// Header is one header of a record.
type Header struct {
	Key   string `json:"key"`
	Value Bytes  `json:"value"`
}

// Bytes is written as {"text": "..."} when it is valid UTF-8, as
// {"base64": "..."} otherwise, and null when absent.
type Bytes []byte

// MarshalJSON writes b as text or base64.
func (b Bytes) MarshalJSON() ([]byte, error) {
	switch {
	case b == nil:
		return []byte("null"), nil
	case utf8.Valid(b):
		return json.Marshal(map[string]string{"text": string(b)})
	}
	return json.Marshal(map[string]string{"base64": base64.StdEncoding.EncodeToString(b)})
}

// UnmarshalJSON reads what MarshalJSON writes.
func (b *Bytes) UnmarshalJSON(data []byte) error {
	if string(data) == "null" {
		*b = nil
		return nil
	}
	var v struct {
		Text   *string `json:"text"`
		Base64 *string `json:"base64"`
	}
	if err := json.Unmarshal(data, &v); err != nil {
		return err
	}
	switch {
	case v.Text != nil:
		*b = Bytes(*v.Text)
	case v.Base64 != nil:
		raw, err := base64.StdEncoding.DecodeString(*v.Base64)
		if err != nil {
			return fmt.Errorf("bytes: %w", err)
		}
		*b = raw
	default:
		return errors.New(`bytes: want {"text": ...} or {"base64": ...}`)
	}
	return nil
}

// Show reads the dead letter at pos and explains it.
func (in *Inspector) Show(ctx context.Context, pos Position) (*Shown, error) {
	rec, err := RecordAt(ctx, in.reader, pos)
	if err != nil {
		return nil, err
	}
	d := Parse(&rec)
	if d.Reason == "" {
		return nil, fmt.Errorf("%s is no dead letter of idemstream: it has no idemstream-reason header", pos)
	}
	s := &Shown{DeadLetter: pos, Time: d.Time.UTC(), Pipeline: in.decider.Policy().Pipeline, Reason: d.Reason, Error: d.Error,
		Key: d.IdemKey, Fingerprint: d.Fingerprint, ConflictPaths: append([]string{}, d.ConflictPaths...), Trimmed: d.Trimmed,
		PayloadSize: d.PayloadSize, RedriveOf: d.RedriveOf, Record: recordOf(&d)}
	whole, err := in.source(ctx, &d, s)
	if err != nil {
		return nil, err
	}
	if s.Now, err = in.verdict(&whole); err != nil {
		return nil, err
	}
	if d.Reason == dedupe.ReasonConflict {
		if err := in.compare(ctx, &d, &whole, s); err != nil {
			return nil, err
		}
	}
	s.Redrive = advise(&d, s)
	return s, nil
}

// source reads the input record the dead letter came from. It returns the
// whole record: the source when the dead letter was trimmed and the
// source is still there, the dead letter's otherwise.
func (in *Inspector) source(ctx context.Context, d *DeadLetter, s *Shown) (DeadLetter, error) {
	s.Source = Copy{Position: d.Source, Fingerprint: d.Fingerprint}
	if d.Source.IsZero() {
		s.Source.Why = "the dead letter names no source"
		return *d, nil
	}
	rec, err := RecordAt(ctx, in.reader, d.Source)
	if errors.Is(err, ErrGone) {
		s.Source.Why = err.Error()
		return *d, nil
	}
	if err != nil {
		return DeadLetter{}, fmt.Errorf("the source: %w", err)
	}
	s.Source.Found = true
	if !d.Trimmed {
		return *d, nil
	}
	whole := *d
	whole.Key, whole.Value, whole.Headers = rec.Key, rec.Value, rec.Headers
	return whole, nil
}

// verdict prepares the record under the current rules. A failure that is
// not the record's (a schema registry that does not answer) is an error.
func (in *Inspector) verdict(d *DeadLetter) (Verdict, error) {
	key, value, headers := d.Original()
	p := in.decider.Prepare(&dedupe.Record{Topic: d.Source.Topic, Partition: d.Source.Partition, Offset: d.Source.Offset,
		Key: key, Value: value, Headers: headers, Time: d.Time})
	v := Verdict{Rules: p.RulesDigest, Key: p.Key, Fingerprint: p.Fingerprint}
	if p.Err != nil {
		if dedupe.Classify(p.Err) != dedupe.Poison {
			return Verdict{}, fmt.Errorf("decide the record under the current rules: %w", p.Err)
		}
		v.Reason, v.Error = dedupe.ReasonOf(p.Err), p.Err.Error()
	}
	if v.Rules == "" {
		v.Rules = in.decider.Canonicalizer().RulesDigest()
	}
	return v, nil
}

// compare reads a conflict's first copy back and diffs the dead letter
// against it under the current rules.
func (in *Inspector) compare(ctx context.Context, d, whole *DeadLetter, s *Shown) error {
	s.First = &Copy{Position: d.FirstSource, Fingerprint: d.FirstFingerprint}
	if d.FirstSource.IsZero() {
		s.First.Why = "the dead letter names no first copy"
		return nil
	}
	first, err := RecordAt(ctx, in.reader, d.FirstSource)
	if errors.Is(err, ErrGone) {
		s.First.Why = err.Error()
		return nil
	}
	if err != nil {
		return fmt.Errorf("the first copy: %w", err)
	}
	s.First.Found = true
	canon := in.decider.Canonicalizer()
	diff := &Diff{Rules: canon.RulesDigest(), Fingerprint: s.Now.Fingerprint, Paths: []string{}}
	s.Diff = diff
	fp, err := canon.Fingerprint(first.Value)
	if err != nil && dedupe.Classify(err) != dedupe.Poison {
		return fmt.Errorf("the first copy under the current rules: %w", err)
	}
	diff.FirstFingerprint = fp
	paths, err := canon.Diff(first.Value, whole.Value)
	switch {
	case err != nil && dedupe.Classify(err) != dedupe.Poison:
		return fmt.Errorf("diff under the current rules: %w", err)
	case err != nil:
		diff.Error = err.Error()
	default:
		diff.Paths = append(diff.Paths, paths...)
		diff.Same = len(paths) == 0
	}
	return nil
}

// advise says whether redrive sends d, and if not, why.
func advise(d *DeadLetter, s *Shown) Advice {
	if d.Trimmed && !s.Source.Found {
		return Advice{Why: "its payload was cut to fit the dead-letter topic and the source is gone: there is nothing whole to send"}
	}
	switch {
	case Redrivable(d.Reason):
		return Advice{Allowed: true, Why: "the handler failed; redrive skips it if its key has a result written since, an earlier redrive sent it, or a later dead letter of its key is sent instead (--dry-run tells)"}
	case d.Reason == dedupe.ReasonConflict && s.Diff != nil && s.Diff.Same:
		return Advice{Why: "the same request as its first copy under the current rules (the rules changed): it would be a replay; --force sends it"}
	case d.Reason == dedupe.ReasonConflict:
		return Advice{Why: "the key is taken by another body inside its window: it would come straight back as a conflict; --force sends it anyway"}
	case s.Now.Reason == "":
		return Advice{Why: "valid under the current rules (they changed since): --force sends it"}
	}
	return Advice{Why: fmt.Sprintf("still %s under the current rules: it would come straight back; fix the producer (or the rules), then --force", s.Now.Reason)}
}

func recordOf(d *DeadLetter) Record {
	r := Record{Key: Bytes(d.Key), Value: Bytes(d.Value), Headers: make([]Header, len(d.Headers))}
	for i, h := range d.Headers {
		r.Headers[i] = Header{Key: h.Key, Value: Bytes(h.Value)}
		if r.Headers[i].Value == nil {
			r.Headers[i].Value = Bytes{}
		}
	}
	return r
}
