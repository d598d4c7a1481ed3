package schemas

import (
	"bytes"
	"fmt"
	"strings"
	"text/template"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/idemstream/idemstream/dedupe"
)

// The HTTP routes' contract: the same five things as a pipeline's, told
// in HTTP's terms, and every answer the front door gives itself.

type contractRoute struct {
	Route
	Required      bool
	RetryAfterS   int
	KeyFormat     string
	SemanticsName string
	SameBody      string
	OtherBody     string
	AfterWindow   string
	Pending       string
	Failed        string
	Stored        string
	Unknown       string
	RulesDigest   string
}

var routeSemanticsText = map[string][3]string{
	"strict": {
		"strict (A): the key and the canonical body identify a request",
		"the first answer again (same status, body and the headers listed below), with `Idempotent-Replayed: true`",
		"422 `IDEMPOTENCY_KEY_CONFLICT`, an `application/problem+json` body whose `conflict_paths` name the JSON Pointers that differ; the first answer stands",
	},
	"lenient": {
		"lenient (B): the key alone identifies a request",
		"the first answer again, with `Idempotent-Replayed: true`",
		"the first answer again as well: the body of the first request is the one acted on",
	},
	"window": {
		"window (C): the key identifies a request inside the window",
		"the first answer again, with `Idempotent-Replayed: true`",
		"the first answer again as well",
	},
}

func describeRoute(cfg *Config, r Route) (contractRoute, error) {
	cr := contractRoute{Route: r, Required: r.KeyRequired == nil || *r.KeyRequired}
	cr.RetryAfterS = int((r.RetryAfter.D() + time.Second - 1) / time.Second)
	cr.KeyFormat = keyFormatText(r.Key.Format) + fmt.Sprintf(", at most %d bytes, sent bare or as an RFC 8941 string (`\"…\"`)", r.Key.MaxLength)
	t := routeSemanticsText[r.Semantics]
	cr.SemanticsName, cr.SameBody, cr.OtherBody = t[0], t[1], t[2]
	cr.AfterWindow = fmt.Sprintf("After %s from the first request the key is forgotten: the next request with it is a new request.", r.Window)
	cr.Pending = fmt.Sprintf("A retry that arrives while the first request is still being handled waits for it up to %s and then gets its answer, or 409 `IDEMPOTENCY_PENDING` with `Retry-After: %d`; retry with the same key and body.",
		r.PendingTimeout, cr.RetryAfterS)
	cr.Stored = fmt.Sprintf("answers of class %s are kept and replayed", strings.Join(r.StoreResponses, ", "))
	cr.Failed = fmt.Sprintf("Any other answer (and 502 `UPSTREAM_UNREACHABLE` when the service could not be reached) fails the key for %s: ", r.FailedTTL)
	if r.Semantics == string(dedupe.Strict) {
		cr.Failed += "the same key with the same body is handled again, another body is a conflict. To change your mind, generate a new key."
	} else {
		cr.Failed += "the same key is handled again, whatever the body."
	}
	cr.Unknown = fmt.Sprintf("The service is never called twice for one key. When the outcome of the first request is unknown (no answer within %s, or the proxy stopped while the service handled it; the key is then held for %s), every request with the key gets 504 or 502 `IDEMPOTENCY_OUTCOME_UNKNOWN` for the rest of the window: check the effect, then send a new key.",
		cfg.HTTP.UpstreamTimeout, formatDuration(2*cfg.routeHold(r)))
	canon, err := dedupe.NewCanonicalizer(routeRules(r))
	if err != nil {
		return cr, err
	}
	cr.RulesDigest = canon.RulesDigest()
	return cr, nil
}

// routeRules is the canonical form of a route's bodies.
func routeRules(r Route) dedupe.CanonicalRules {
	return dedupe.CanonicalRules{Payload: dedupe.PayloadJSON, Volatile: r.Volatile, Unordered: r.Unordered}
}

var routeMarkdownTmpl = template.Must(template.New("routes").Funcs(contractFuncs).Parse(`{{range .}}
## {{.Name}}: ` + "`{{.Method}} {{.Path}}`" + `

1. **Key**: header ` + "`{{.Key.Name}}`" + `; {{.KeyFormat}}. {{if .Required}}Without it the request is refused, 400 ` + "`IDEMPOTENCY_KEY_MISSING`" + `{{else}}Without it the request is passed on unguarded{{end}}; a malformed key is 400 ` + "`IDEMPOTENCY_KEY_INVALID`" + `. A key is scoped by the method{{if .ClientHeader}}, the request's path and the client (header ` + "`{{.ClientHeader}}`" + `){{else}} and the request's path{{end}}. Use a new key for every new request.
2. **Semantics**: {{.SemanticsName}}. Same key, same body: {{.SameBody}}. Same key, another body: {{.OtherBody}}.
3. **Window**: {{.Window}}. {{.AfterWindow}}
4. **Volatile fields** (ignored when comparing bodies, safe to change on retry): {{code .Volatile}}; headers such as {{code .VolatileHeaders}} may change too: no header is ever compared. Arrays compared as unordered sets: {{code .Unordered}}. Bodies are compared in RFC 8785 canonical form.
5. **While pending**: {{.Pending}}

Answers: {{.Stored}}, with the headers {{code .ReplayHeaders}}. {{.Failed}} {{.Unknown}}

| answer | when |
|---|---|
| the first answer, ` + "`Idempotent-Replayed: true`" + ` | a retry of a kept answer |
| 400 ` + "`IDEMPOTENCY_KEY_MISSING`, `IDEMPOTENCY_KEY_INVALID`, `REQUEST_BODY_INVALID`, `REQUEST_BODY_UNREADABLE`" + ` | no key, a malformed key, a body that is not JSON or could not be read |
| 409 ` + "`IDEMPOTENCY_PENDING`" + ` + ` + "`Retry-After`" + ` | the first request still in progress |
| 413 ` + "`PAYLOAD_TOO_LARGE`" + ` | a body over {{.MaxPayloadBytes}} bytes |
| 422 ` + "`IDEMPOTENCY_KEY_CONFLICT`" + ` | the key with another body |
| 503 ` + "`IDEMPOTENCY_STORE_UNAVAILABLE`" + ` + ` + "`Retry-After`" + ` | the idempotency store did not answer; nothing was passed on |
| 502 ` + "`UPSTREAM_UNREACHABLE`" + ` | the service could not be reached; the key is failed (above) |
| 502/504 ` + "`IDEMPOTENCY_OUTCOME_UNKNOWN`" + `, 502 ` + "`ANSWER_TOO_LARGE`" + ` | the first request's outcome is unknown, or its answer too large to keep (above) |

Rules digest: ` + "`{{.RulesDigest}}`" + `.
{{end}}`))

// openAPIOperation is route r's OpenAPI operation: its key header and
// path parameters, every answer the front door gives, the promise under
// x-idempotency.
func openAPIOperation(r contractRoute) yamlMap {
	type m = yamlMap
	key := m{"type": "string", "maxLength": r.Key.MaxLength}
	if r.Key.Format == "uuid" {
		key["format"] = "uuid"
	}
	params := []m{{"name": r.Key.Name, "in": "header", "required": r.Required, "schema": key,
		"description": "Idempotency key (IETF draft \"The Idempotency-Key HTTP Header Field\"): " + r.KeyFormat}}
	for _, seg := range strings.Split(r.Path, "/") {
		if strings.HasPrefix(seg, "{") && strings.HasSuffix(seg, "}") {
			name := strings.TrimSuffix(strings.TrimSuffix(seg[1:len(seg)-1], "..."), "$")
			if name != "" {
				params = append(params, m{"name": name, "in": "path", "required": true, "schema": m{"type": "string"}})
			}
		}
	}
	return m{
		"operationId": r.Name,
		"parameters":  params,
		"responses": m{
			"400": problemAnswer("no key, a malformed key, or a body that is not JSON", false),
			"409": problemAnswer("a request with this key is still in progress", true),
			"413": problemAnswer(fmt.Sprintf("a body over %d bytes", r.MaxPayloadBytes), false),
			"422": problemAnswer("the key was first sent with another body: conflict_paths names where", false),
			"502": problemAnswer("the service could not be reached (UPSTREAM_UNREACHABLE), its answer was too large to keep (ANSWER_TOO_LARGE), or the first request was interrupted (IDEMPOTENCY_OUTCOME_UNKNOWN)", false),
			"503": problemAnswer("the idempotency store did not answer; the request was not passed on", true),
			"504": problemAnswer("the first request's outcome is unknown (IDEMPOTENCY_OUTCOME_UNKNOWN)", false),
		},
		"x-idempotency": m{
			"semantics": r.Semantics, "sameKeySameBody": r.SameBody, "sameKeyNewBody": r.OtherBody,
			"window": r.Window.String(), "volatile": nonNil(r.Volatile), "volatileHeaders": nonNil(r.VolatileHeaders),
			"unordered": nonNil(r.Unordered), "storedAnswers": r.StoreResponses, "replayHeaders": r.ReplayHeaders,
			"failedTTL": r.FailedTTL.String(), "pending": r.Pending, "unknownOutcome": r.Unknown, "rulesDigest": r.RulesDigest,
		},
	}
}

// problemAnswer is an answer with an RFC 9457 problem body, and a
// Retry-After header when the client should wait.
func problemAnswer(desc string, retryAfter bool) yamlMap {
	type m = yamlMap
	resp := m{"description": desc, "content": m{"application/problem+json": m{"schema": m{"$ref": "#/components/schemas/IdempotencyProblem"}}}}
	if retryAfter {
		resp["headers"] = m{"Retry-After": m{"description": "seconds to wait before retrying with the same key and body", "schema": m{"type": "integer"}}}
	}
	return resp
}

func describeRoutes(cfg *Config) ([]contractRoute, error) {
	if cfg.HTTP == nil {
		return nil, nil
	}
	out := make([]contractRoute, 0, len(cfg.HTTP.Routes))
	for _, r := range cfg.HTTP.Routes {
		cr, err := describeRoute(cfg, r)
		if err != nil {
			return nil, err
		}
		out = append(out, cr)
	}
	return out, nil
}

func routesMarkdown(cfg *Config) ([]byte, error) {
	routes, err := describeRoutes(cfg)
	if err != nil || len(routes) == 0 {
		return nil, err
	}
	var b bytes.Buffer
	if err := routeMarkdownTmpl.Execute(&b, routes); err != nil {
		return nil, err
	}
	return b.Bytes(), nil
}

// ContractOpenAPI renders the HTTP routes' contract as an OpenAPI 3.1
// fragment: for every route its key header and every answer the front
// door gives, with the promise under x-idempotency, for a team to merge
// into its own API document.
func ContractOpenAPI(cfg *Config) ([]byte, error) {
	routes, err := describeRoutes(cfg)
	if err != nil {
		return nil, err
	}
	if len(routes) == 0 {
		return nil, &FieldError{Field: "http.routes", Msg: "the OpenAPI contract covers HTTP routes, and the file has none"}
	}
	paths := yamlMap{}
	for _, r := range routes {
		item, _ := paths[r.Path].(yamlMap)
		if item == nil {
			item = yamlMap{}
			paths[r.Path] = item
		}
		item[strings.ToLower(r.Method)] = openAPIOperation(r)
	}
	type m = yamlMap
	doc := m{
		"openapi": "3.1.0",
		"info": m{"title": "idemstream idempotency contract", "version": "1.0.0",
			"description": "Generated by `idemstream contract -o openapi` from the configuration the front door runs."},
		"paths": paths,
		"components": m{"schemas": m{"IdempotencyProblem": m{
			"type": "object", "required": []string{"type", "title", "status", "code"},
			"properties": m{
				"type": m{"type": "string", "format": "uri"}, "title": m{"type": "string"}, "status": m{"type": "integer"},
				"detail": m{"type": "string"},
				"code": m{"enum": []string{"IDEMPOTENCY_KEY_MISSING", "IDEMPOTENCY_KEY_INVALID", "REQUEST_BODY_INVALID", "REQUEST_BODY_UNREADABLE", "PAYLOAD_TOO_LARGE",
					"IDEMPOTENCY_PENDING", "IDEMPOTENCY_KEY_CONFLICT", "IDEMPOTENCY_STORE_UNAVAILABLE", "UPSTREAM_UNREACHABLE",
					"IDEMPOTENCY_OUTCOME_UNKNOWN", "ANSWER_TOO_LARGE"}},
				"conflict_paths": m{"type": "array", "items": m{"type": "string"}, "description": "JSON Pointers where the body differs from the first request's"},
			},
		}}},
	}
	var b bytes.Buffer
	enc := yaml.NewEncoder(&b)
	enc.SetIndent(2)
	if err := enc.Encode(doc); err != nil {
		return nil, err
	}
	return b.Bytes(), enc.Close()
}
