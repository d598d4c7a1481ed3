package group

import (
	"errors"
	"fmt"

	"github.com/segmentio/kafka-go"
)

// classify names the step and makes a fenced instance ErrFenced, keeping
// the broker's error in the chain for errors.Is.
func classify(op string, err error) error {
	if errors.Is(err, kafka.FencedInstanceID) {
		return fmt.Errorf("group: %s: %w: %w", op, ErrFenced, err)
	}
	return fmt.Errorf("group: %s: %w", op, err)
}

// isGroupError says whether the coordinator refused the member's place in
// the generation, rather than failed to answer.
func isGroupError(err error) bool {
	for _, e := range []error{kafka.RebalanceInProgress, kafka.IllegalGeneration, kafka.UnknownMemberId, kafka.FencedInstanceID} {
		if errors.Is(err, e) {
			return true
		}
	}
	return false
}
