package sinks

import (
	"context"
	"encoding/json"
	"io"
	"strconv"
	"sync"
)

// JSONLines writes messages as JSON lines instead of producing them: for
// local debugging (`idemstream run --sink stdout`). Key and value are
// base64, headers strings, as schemas/result.schema.json and
// schemas/dlq.schema.json describe. Offsets count lines per topic
// partition, so that nothing downstream mistakes them for Kafka's.
type JSONLines struct {
	mu   sync.Mutex
	w    io.Writer
	next map[string]int64
}

// NewJSONLines writes to w.
func NewJSONLines(w io.Writer) *JSONLines { return &JSONLines{w: w, next: map[string]int64{}} }

// Line is the JSON form of one message.
type Line struct {
	Topic     string            `json:"topic"`
	Partition int               `json:"partition"`
	Offset    int64             `json:"offset"`
	Key       []byte            `json:"key"`
	Value     []byte            `json:"value"`
	Headers   map[string]string `json:"headers"`
}

// Write implements the consumer's writer side.
func (j *JSONLines) Write(_ context.Context, msgs []Message) ([]Written, error) {
	j.mu.Lock()
	defer j.mu.Unlock()
	out := make([]Written, len(msgs))
	enc := json.NewEncoder(j.w)
	for i, m := range msgs {
		p := max(m.Partition, 0)
		slot := m.Topic + "/" + strconv.Itoa(p)
		line := Line{Topic: m.Topic, Partition: p, Offset: j.next[slot], Key: m.Key, Value: m.Value, Headers: map[string]string{}}
		for _, h := range m.Headers {
			line.Headers[h.Key] = string(h.Value)
		}
		if err := enc.Encode(line); err != nil {
			return nil, err
		}
		out[i] = Written{Partition: p, Offset: j.next[slot]}
		j.next[slot]++
	}
	return out, nil
}
