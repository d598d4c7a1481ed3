package frontdoor

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strconv"
)

// How the first request with a key ended, as its stored answer says.
const (
	endedAnswered    = "answered"    // the upstream answered
	endedUnreachable = "unreachable" // the request never reached the upstream
	endedUnknown     = "unknown"     // sent, no answer in time: it may have run
	endedInterrupted = "interrupted" // its holder stopped; taken over, nothing kept
	endedTooLarge    = "too_large"   // answered with more than the front door keeps
)

// answer is what a key's first request got, kept once per decision
// (Store.KeepFirst): the status, the allow-listed headers and the body that
// every retry is given, the request body that a conflict is explained
// against, and whether the key succeeded (replayed) or failed (a retry with
// the same body calls the upstream again).
type answer struct {
	Status  int         `json:"status"`
	Header  http.Header `json:"header,omitempty"`
	Body    []byte      `json:"body,omitempty"`
	Request []byte      `json:"request,omitempty"`
	Failed  bool        `json:"failed,omitempty"`
	Ended   string      `json:"ended"`
}

func (a *answer) encode() []byte {
	b, err := json.Marshal(a)
	if err != nil {
		panic(err) // only maps of strings and byte slices: cannot fail
	}
	return b
}

func decodeAnswer(b []byte) (answer, error) {
	var a answer
	if err := json.Unmarshal(b, &a); err != nil {
		return answer{}, fmt.Errorf("stored answer: %w", err)
	}
	if a.Status < 100 || a.Status > 999 {
		return answer{}, fmt.Errorf("stored answer: status %d", a.Status)
	}
	return a, nil
}

// write sends a to the client; replayed marks a copy given to a retry.
func (a *answer) write(w http.ResponseWriter, replayed bool) {
	h := w.Header()
	for k, vs := range a.Header {
		h[k] = vs
	}
	if replayed {
		h.Set("Idempotent-Replayed", "true")
	}
	h.Set("Content-Length", strconv.Itoa(len(a.Body)))
	w.WriteHeader(a.Status)
	_, _ = w.Write(a.Body)
}

// recorder buffers what the guarded handler answers, up to limit bytes of
// body: the answer is kept before any of it reaches the client, so that
// the client and every retry get the same one.
type recorder struct {
	header   http.Header
	status   int
	body     []byte
	limit    int
	overflow bool
}

func newRecorder(limit int) *recorder { return &recorder{header: http.Header{}, limit: limit} }

func (r *recorder) Header() http.Header { return r.header }

// WriteHeader keeps the final status: informational answers (100
// Continue, 103 Early Hints, which a reverse proxy passes on) precede it
// and are not the answer.
func (r *recorder) WriteHeader(status int) {
	if status >= 100 && status < 200 && status != http.StatusSwitchingProtocols {
		return
	}
	if r.status == 0 {
		r.status = status
	}
}

func (r *recorder) Write(p []byte) (int, error) {
	r.WriteHeader(http.StatusOK)
	if len(r.body)+len(p) > r.limit {
		r.overflow = true
		return len(p), nil
	}
	r.body = append(r.body, p...)
	return len(p), nil
}

// Flush is accepted and ignored: nothing reaches the client before the
// answer is kept.
func (r *recorder) Flush() {}
