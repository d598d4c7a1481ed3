package audit_test

import (
	"context"
	"strings"
	"testing"

	"github.com/idemstream/idemstream/dedupe/audit"
	"github.com/idemstream/idemstream/dedupe/audit/audittest"
)

func TestPlantedPatterns(t *testing.T) {
	p := audittest.Plant("claims", 3)
	r, err := audit.Run(context.Background(), audit.Records(p.Records), audit.Options{Policy: audittest.Policy(t)})
	if err != nil {
		t.Fatal(err)
	}
	audittest.Check(t, p, r)
	if r.Passes != 2 || r.Partitions != 3 || r.Topic != "claims" {
		t.Errorf("passes %d, partitions %d, topic %q", r.Passes, r.Partitions, r.Topic)
	}
	if t.Failed() {
		var b strings.Builder
		_ = r.WriteText(&b, nil)
		t.Log(b.String())
	}
}
