package main

import (
	"testing"

	"github.com/idemstream/idemstream/internal/testenv"
)

// The tests of this package share one Kafka broker when it runs in a
// container: testenv.Main removes it when they end.
func TestMain(m *testing.M) { testenv.Main(m) }
