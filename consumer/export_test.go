package consumer

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// SetTopicWait shortens the start-up wait for missing topics in tests.
func SetTopicWait(d time.Duration) (restore func()) {
	old := topicWait
	topicWait = d
	return func() { topicWait = old }
}

// InstrumentStore is instrumentStore, for the black-box tests.
var InstrumentStore = instrumentStore

// The series the black-box tests read.
func (m *Metrics) Records() *prometheus.CounterVec                 { return m.records }
func (m *Metrics) DLQRecords() *prometheus.CounterVec              { return m.dlqRecords }
func (m *Metrics) LenientMismatch() *prometheus.CounterVec         { return m.lenientMismatch }
func (m *Metrics) ScanFloorTruncated() *prometheus.CounterVec      { return m.scanFloorTruncated }
func (m *Metrics) RepliesSkipped() *prometheus.CounterVec          { return m.repliesSkipped }
func (m *Metrics) StoreErrors() *prometheus.CounterVec             { return m.storeErrors }
func (m *Metrics) StoreReplicaAckFailures() *prometheus.CounterVec { return m.storeReplicaAckFailures }
