package sinks_test

import (
	"bytes"
	"context"
	"encoding/json"
	"strings"
	"testing"

	"github.com/idemstream/idemstream/sinks"
)

func TestJSONLinesIsJSON(t *testing.T) {
	var buf bytes.Buffer
	w := sinks.NewJSONLines(&buf)
	ws, err := w.Write(context.Background(), []sinks.Message{{Topic: "t", Partition: 1, Value: []byte("a")}, {Topic: "t", Partition: 1, Value: []byte("b")}})
	if err != nil {
		t.Fatal(err)
	}
	if ws[1].Offset != ws[0].Offset+1 {
		t.Errorf("offsets %v", ws)
	}
	for _, line := range strings.Split(strings.TrimSpace(buf.String()), "\n") {
		var l sinks.Line
		if err := json.Unmarshal([]byte(line), &l); err != nil || l.Topic != "t" {
			t.Errorf("line %q: %v", line, err)
		}
	}
}
