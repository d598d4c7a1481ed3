package chaos

import (
	"context"
	"encoding/json"
	"fmt"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/idemstream/idemstream/dedupe"
	"github.com/idemstream/idemstream/sinks"
)

// readTopic reads every partition of topic from offset 0 to its end. A
// read that fails for a reason that may pass (a broker slow to answer on
// a loaded machine) is tried again, from the start of its partition,
// until ctx ends.
func readTopic(ctx context.Context, k *sinks.Kafka, topic string) ([]sinks.Fetched, error) {
	n, err := k.Partitions(ctx, topic)
	if err != nil {
		return nil, err
	}
	var out []sinks.Fetched
	for p := range n {
		for {
			recs, err := k.Read(ctx, topic, p, 0, 0)
			if err == nil {
				out = append(out, recs...)
				break
			}
			if ctx.Err() != nil || !dedupe.IsRetryable(err) {
				return nil, err
			}
			select {
			case <-ctx.Done():
				return nil, err
			case <-time.After(time.Second):
			}
		}
	}
	return out, nil
}

func hv(f *sinks.Fetched, k string) string { v, _ := sinks.HeaderValue(f.Headers, k); return v }

func source(f *sinks.Fetched) string {
	return f.Topic + "/" + strconv.Itoa(f.Partition) + "/" + strconv.FormatInt(f.Offset, 10)
}

// verdict is what the topics say about a run.
type verdict struct {
	inputs       int // records in the input topic (= consumed)
	keys         int // distinct keys with a valid record
	results      int // records in the output topic
	first        int // distinct result sources
	replay       int // input records neither a result's nor a dead letter's source
	conflict     int // distinct DLQ sources with reason conflict
	invalid      int // distinct DLQ sources with an invalid-input reason
	failed       int // distinct DLQ sources with reason handler_failed
	dlqRecords   int
	dlqDups      int // DLQ records beyond the first of their source
	inputDups    int // input records that repeat a seq (ambiguous produce retries)
	missingSeqs  int // acknowledged seqs not in the input (must be 0)
	crossResults int // results whose source is on another partition than the key's original
	lost         int // keys with a valid record and no result
	duplicated   int // results beyond the first of their key
	problems     []string
	badKeys      map[string]bool
}

func (v *verdict) problem(key string, format string, args ...any) {
	v.problems = append(v.problems, fmt.Sprintf(format, args...))
	if key != "" {
		v.badKeys[key] = true
	}
}

type inputRec struct {
	f      *sinks.Fetched
	src    string
	seq    int
	kind   string
	key    string // normalized ("" when absent)
	amount float64
	fp     string
	valid  bool
}

// judge checks the run from the three topics. acked are the seqs the
// producer had acknowledged.
func judge(canon *dedupe.Canonicalizer, input, output, dlq []sinks.Fetched, acked map[int]bool) *verdict {
	v := &verdict{inputs: len(input), results: len(output), dlqRecords: len(dlq), badKeys: map[string]bool{}}

	// The input, as the topic holds it.
	inputs := map[string]*inputRec{}
	byKey := map[string][]*inputRec{}
	seqs := map[int]int{}
	homePartition := map[string]int{}
	for i := range input {
		f := &input[i]
		r := &inputRec{f: f, src: source(f), kind: hv(f, headerKind), key: strings.ToLower(hv(f, keyHeader))}
		seq, err := strconv.Atoi(hv(f, headerSeq))
		if err != nil {
			v.problem("", "input %s: no %s header: not a record of this test", r.src, headerSeq)
			continue
		}
		r.seq = seq
		seqs[seq]++
		if seqs[seq] > 1 {
			v.inputDups++
		}
		if r.kind != kindInvalid {
			var body struct {
				Amount *float64 `json:"amount"`
			}
			if err := json.Unmarshal(f.Value, &body); err != nil || body.Amount == nil {
				v.problem(r.key, "input %s: body %q does not parse: %v", r.src, f.Value, err)
				continue
			}
			r.amount, r.valid = *body.Amount, true
			r.fp, err = canon.Fingerprint(f.Value)
			if err != nil {
				v.problem(r.key, "input %s: fingerprint: %v", r.src, err)
			}
			byKey[r.key] = append(byKey[r.key], r)
			if r.kind == kindOriginal {
				homePartition[r.key] = f.Partition
			}
		}
		inputs[r.src] = r
	}
	for seq := range acked {
		if seqs[seq] == 0 {
			v.missingSeqs++
			v.problem("", "record seq %d was acknowledged to the producer but is not in the input topic", seq)
		}
	}
	v.keys = len(byKey)

	// Results: exactly one per key, each from an input record of that key.
	resultOf := map[string]*sinks.Fetched{} // key → the result
	resultSrc := map[string]*sinks.Fetched{}
	for i := range output {
		res := &output[i]
		key, src, fp := hv(res, sinks.HeaderKey), hv(res, sinks.HeaderSource), hv(res, sinks.HeaderFingerprint)
		where := fmt.Sprintf("result %s (key %s, source %s)", source(res), key, src)
		if prev, dup := resultOf[key]; dup {
			v.duplicated++
			v.problem(key, "%s written %s: DUPLICATE result for key %s: also %s written %s (source %s); input records of the key: %s",
				where, res.Time.Format("15:04:05.000"), key, source(prev), prev.Time.Format("15:04:05.000"), hv(prev, sinks.HeaderSource), describe(byKey[key]))
			continue
		}
		resultOf[key] = res
		if prev, dup := resultSrc[src]; dup {
			v.problem(key, "%s: a second result of the same source (first %s)", where, source(prev))
		}
		resultSrc[src] = res
		in, ok := inputs[src]
		switch {
		case !ok:
			v.problem(key, "%s: the source is not an input record", where)
		case in.key != key:
			v.problem(key, "%s: the source carries key %q", where, in.key)
		case string(in.f.Value) != string(res.Value):
			v.problem(key, "%s: value %q, the source's is %q", where, res.Value, in.f.Value)
		case in.fp != fp:
			v.problem(key, "%s: fingerprint %s, the source's is %s", where, fp, in.fp)
		}
		if hv(res, sinks.HeaderOutcome) != "first" {
			v.problem(key, "%s: idemstream-outcome %q", where, hv(res, sinks.HeaderOutcome))
		}
		if ok && in.f.Partition != homePartition[key] {
			v.crossResults++
		}
	}
	v.first = len(resultSrc)
	for key := range byKey {
		if resultOf[key] == nil {
			v.lost++
			v.problem(key, "key %s: LOST: no result (input records: %s)", key, describe(byKey[key]))
		}
	}
	for key := range resultOf {
		if byKey[key] == nil {
			v.problem(key, "key %s: a result, but no valid input record has that key", key)
		}
	}

	// Dead letters, by source; copies of one source must agree.
	dead := map[string][]*sinks.Fetched{}
	for i := range dlq {
		d := &dlq[i]
		src := hv(d, sinks.HeaderSource)
		if len(dead[src]) > 0 {
			v.dlqDups++
			if a, b := hv(dead[src][0], sinks.HeaderReason), hv(d, sinks.HeaderReason); a != b {
				v.problem(hv(d, sinks.HeaderKey), "dead letters %s and %s of source %s disagree: %s vs %s", source(dead[src][0]), source(d), src, a, b)
			}
		}
		dead[src] = append(dead[src], d)
		in, ok := inputs[src]
		if !ok {
			v.problem(hv(d, sinks.HeaderKey), "dead letter %s: source %s is not an input record", source(d), src)
			continue
		}
		if string(d.Value) != string(in.f.Value) {
			v.problem(in.key, "dead letter %s: value %q, the source's is %q", source(d), d.Value, in.f.Value)
		}
	}
	for src, ds := range dead {
		if _, ok := inputs[src]; !ok {
			continue
		}
		switch reason := hv(ds[0], sinks.HeaderReason); reason {
		case string(dedupe.ReasonConflict):
			v.conflict++
		case string(dedupe.ReasonHandlerFailed):
			v.failed++
		default:
			v.invalid++
		}
		if _, both := resultSrc[src]; both {
			v.problem(hv(ds[0], sinks.HeaderKey), "input %s is both a result's source and a dead letter's (%s)", src, hv(ds[0], sinks.HeaderReason))
		}
	}

	// Every input record: the outcome the topics give it is the one its
	// body calls for.
	for _, in := range inputs {
		ds := dead[in.src]
		_, isFirst := resultSrc[in.src]
		if !isFirst && len(ds) == 0 {
			v.replay++
		}
		if !in.valid {
			want := string(dedupe.ReasonMalformedPayload)
			if in.key == "" {
				want = string(dedupe.ReasonMissingKey)
			}
			if len(ds) == 0 || hv(ds[0], sinks.HeaderReason) != want {
				v.problem("", "invalid input %s (%q): want a dead letter %s, have %s", in.src, in.f.Value, want, reasons(ds))
			}
			continue
		}
		win := resultOf[in.key]
		if win == nil {
			continue // reported as lost
		}
		var winBody struct{ Amount float64 }
		_ = json.Unmarshal(win.Value, &winBody)
		winFP := hv(win, sinks.HeaderFingerprint)
		same := in.amount == winBody.Amount
		if same != (in.fp == winFP) {
			v.problem(in.key, "input %s: amount %v vs the winner's %v, but fingerprint %s vs %s", in.src, in.amount, winBody.Amount, in.fp, winFP)
		}
		switch {
		case same && len(ds) > 0:
			v.problem(in.key, "input %s (key %s, %s, seq %d): same command as the result %s, yet dead-lettered as %s",
				in.src, in.key, in.kind, in.seq, hv(win, sinks.HeaderSource), reasons(ds))
		case !same && len(ds) == 0:
			v.problem(in.key, "input %s (key %s, %s, seq %d, amount %v): differs from the result %s (amount %v), yet no dead letter: a changed command passed as a replay",
				in.src, in.key, in.kind, in.seq, in.amount, hv(win, sinks.HeaderSource), winBody.Amount)
		case !same:
			d := ds[0]
			if r := hv(d, sinks.HeaderReason); r != string(dedupe.ReasonConflict) {
				v.problem(in.key, "input %s: dead letter reason %s, want conflict", in.src, r)
			}
			if got := hv(d, sinks.HeaderFirstFingerprint); got != winFP {
				v.problem(in.key, "conflict %s (source %s): first fingerprint %s, the result's is %s", source(d), in.src, got, winFP)
			}
			if got := hv(d, sinks.HeaderFingerprint); got != in.fp {
				v.problem(in.key, "conflict %s (source %s): fingerprint %s, the record's is %s", source(d), in.src, got, in.fp)
			}
			if fs := inputs[hv(d, sinks.HeaderFirstSource)]; fs == nil || fs.key != in.key || fs.fp != winFP {
				v.problem(in.key, "conflict %s (source %s): first source %s is not a record of key %s with the result's fingerprint",
					source(d), in.src, hv(d, sinks.HeaderFirstSource), in.key)
			}
			if paths := hv(d, sinks.HeaderConflictPaths); paths != "" && paths != "/amount" {
				v.problem(in.key, "conflict %s: conflict paths %q, want /amount", source(d), paths)
			}
		}
	}

	// The identity, from the topics.
	if sum := v.first + v.replay + v.conflict + v.invalid + v.failed; sum != v.inputs {
		v.problem("", "first %d + replay %d + conflict %d + invalid %d + failed %d = %d, but the input topic holds %d records",
			v.first, v.replay, v.conflict, v.invalid, v.failed, sum, v.inputs)
	}
	sort.Strings(v.problems)
	return v
}

func describe(recs []*inputRec) string {
	var parts []string
	for _, r := range recs {
		parts = append(parts, fmt.Sprintf("%s %s seq %d amount %v produced %s", r.src, r.kind, r.seq, r.amount, r.f.Time.Format("15:04:05.000")))
	}
	return strings.Join(parts, "; ")
}

func reasons(ds []*sinks.Fetched) string {
	if len(ds) == 0 {
		return "none"
	}
	var parts []string
	for _, d := range ds {
		parts = append(parts, hv(d, sinks.HeaderReason)+"@"+source(d))
	}
	return strings.Join(parts, ",")
}
