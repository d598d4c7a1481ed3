package sinks

import (
	"errors"
	"testing"

	"github.com/segmentio/kafka-go"

	"github.com/idemstream/idemstream/dedupe"
)

// What a failed produce means decides whether a result may be sent again
// at once (nothing appended), only after a settle wait and a scan (maybe
// appended), never (refused for good), or becomes a dead letter (too
// large).
func TestClassifyProduce(t *testing.T) {
	cases := []struct {
		err       error
		ambiguous bool
		class     dedupe.Class
	}{
		// A leader that loses its leadership while an acks=all produce
		// waits answers NOT_LEADER_OR_FOLLOWER: the new leader may hold
		// the records.
		{kafka.NotLeaderForPartition, true, dedupe.Retryable},
		{kafka.RequestTimedOut, true, dedupe.Retryable},
		{kafka.NotEnoughReplicasAfterAppend, true, dedupe.Retryable},
		{kafka.KafkaStorageError, true, dedupe.Retryable},
		{errors.New("read tcp: connection reset by peer"), true, dedupe.Retryable},
		{kafka.NotEnoughReplicas, false, dedupe.Retryable},
		{kafka.LeaderNotAvailable, false, dedupe.Retryable},
		{kafka.MessageSizeTooLarge, false, dedupe.Poison},
		{kafka.TopicAuthorizationFailed, false, dedupe.Fatal},
		{kafka.InvalidTopic, false, dedupe.Fatal},
	}
	for _, tc := range cases {
		err := classifyProduce("out", 3, 10, tc.err)
		if got := errors.Is(err, ErrAmbiguous); got != tc.ambiguous {
			t.Errorf("%v: ambiguous = %v, want %v", tc.err, got, tc.ambiguous)
		}
		if got := dedupe.Classify(err); got != tc.class {
			t.Errorf("%v: class %v, want %v", tc.err, got, tc.class)
		}
	}
}
