package frontdoor

import (
	"encoding/json"
	"net/http"
	"strconv"
	"time"
)

// problem is an RFC 9457 problem document, the body of every answer the
// front door gives itself (the IETF draft "The Idempotency-Key HTTP Header
// Field" asks for application/problem+json). Code is the article's
// machine-readable name (IDEMPOTENCY_KEY_CONFLICT, IDEMPOTENCY_PENDING).
type problem struct {
	Type   string `json:"type"`
	Title  string `json:"title"`
	Status int    `json:"status"`
	Detail string `json:"detail,omitempty"`
	Code   string `json:"code"`
	// ConflictPaths are the JSON Pointers where a reused key's body
	// differs from its first request's.
	ConflictPaths []string `json:"conflict_paths,omitempty"`
}

const problemBase = "https://idemstream.dev/problems/"

func newProblem(status int, code, slug, title, detail string) *problem {
	return &problem{Type: problemBase + slug, Title: title, Status: status, Detail: detail, Code: code}
}

func (p *problem) answer() answer {
	body, err := json.Marshal(p)
	if err != nil {
		panic(err)
	}
	return answer{Status: p.Status, Header: http.Header{"Content-Type": {"application/problem+json"}}, Body: body}
}

func (p *problem) write(w http.ResponseWriter, retryAfter time.Duration) {
	if retryAfter > 0 {
		w.Header().Set("Retry-After", strconv.Itoa(int(max(1, (retryAfter+time.Second-1)/time.Second))))
	}
	a := p.answer()
	a.write(w, false)
}
