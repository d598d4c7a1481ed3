package consumer

import "time"

// SetTopicWait shortens the start-up wait for missing topics in tests.
func SetTopicWait(d time.Duration) (restore func()) {
	old := topicWait
	topicWait = d
	return func() { topicWait = old }
}

// InstrumentStore is instrumentStore, for the black-box tests.
var InstrumentStore = instrumentStore
