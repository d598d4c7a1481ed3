package dlq_test

import (
	"context"
	"encoding/json"
	"os"
	"slices"
	"strings"
	"testing"

	"github.com/idemstream/idemstream/dlq"
)

// docExample is the ```json block under heading in docs/dlq.md.
func docExample(t *testing.T, doc, heading string) any {
	t.Helper()
	i := strings.Index(doc, "\n"+heading+"\n")
	if i < 0 {
		t.Fatalf("docs/dlq.md has no %q", heading)
	}
	rest := doc[i:]
	start := strings.Index(rest, "```json\n")
	end := strings.Index(rest[start+8:], "```")
	if start < 0 || end < 0 {
		t.Fatalf("docs/dlq.md: no json block under %q", heading)
	}
	var v any
	if err := json.Unmarshal([]byte(rest[start+8:start+8+end]), &v); err != nil {
		t.Fatalf("docs/dlq.md, %s: %v", heading, err)
	}
	return v
}

// opaque members hold maps keyed by data (reasons) or bytes
// ({"text"} or {"base64"}): their inner names are not the shape's.
var opaque = []string{"hours[].reasons", "sent_by_reason", "refused", "skipped", "record.key", "record.value", "record.headers[].value"}

// members lists the member paths of a decoded JSON value, arrays as [].
func members(v any, path string, out map[string]bool) {
	if slices.Contains(opaque, path) {
		return
	}
	switch x := v.(type) {
	case map[string]any:
		for k, e := range x {
			p := k
			if path != "" {
				p = path + "." + k
			}
			out[p] = true
			members(e, p, out)
		}
	case []any:
		for _, e := range x {
			members(e, path+"[]", out)
		}
	}
}

func shapeOf(t *testing.T, v any) map[string]bool {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	var decoded any
	if err := json.Unmarshal(b, &decoded); err != nil {
		t.Fatal(err)
	}
	out := map[string]bool{}
	members(decoded, "", out)
	return out
}

// The JSON of summary, show and redrive has the members docs/dlq.md
// documents, no more and no fewer.
func TestJSONShapesAsDocumented(t *testing.T) {
	b, err := os.ReadFile("../docs/dlq.md")
	if err != nil {
		t.Fatal(err)
	}
	doc := string(b)
	sum, err := dlq.Summarize(context.Background(), outage(), dlq.SummaryOptions{Pipeline: "claims", Topic: "dlq", Input: "in"})
	if err != nil {
		t.Fatal(err)
	}
	shown := dlq.Shown{First: &dlq.Copy{}, Diff: &dlq.Diff{}, Record: dlq.Record{Headers: []dlq.Header{{Key: "k"}}}}
	report := dlq.RedriveReport{Redriven: []dlq.Redriven{{}}}
	for heading, v := range map[string]any{"### summary -o json": sum, "### show -o json": shown, "### redrive -o json": report} {
		want, got := shapeOf(t, docExample(t, doc, heading)), shapeOf(t, v)
		for m := range got {
			if !want[m] {
				t.Errorf("%s: %q is in the output, not in docs/dlq.md's example", heading, m)
			}
		}
		for m := range want {
			if !got[m] {
				t.Errorf("%s: %q is in docs/dlq.md's example, not in the output", heading, m)
			}
		}
	}
}

// Every reason a redrive skips a dead letter for is explained under
// "### redrive -o json", and the text output explains each too.
func TestSkipReasonsAsDocumented(t *testing.T) {
	b, err := os.ReadFile("../docs/dlq.md")
	if err != nil {
		t.Fatal(err)
	}
	doc := string(b)
	i := strings.Index(doc, "\n### redrive -o json\n")
	if i < 0 {
		t.Fatal(`docs/dlq.md has no "### redrive -o json"`)
	}
	section := doc[i+1:]
	if end := strings.Index(section, "\n## "); end >= 0 {
		section = section[:end]
	}
	section = strings.Join(strings.Fields(section), " ")
	for _, why := range dlq.SkipReasons() {
		if !strings.Contains(section, "`"+why+"` (") {
			t.Errorf("docs/dlq.md, redrive -o json: skip reason %q is not explained", why)
		}
		rep := dlq.RedriveReport{Skipped: map[string]int64{why: 1}}
		var text strings.Builder
		if err := rep.WriteText(&text); err != nil || !strings.Contains(text.String(), "  "+why+" ") {
			t.Errorf("the text output does not explain %q (%v):\n%s", why, err, text.String())
		}
	}
}
