package redisstore

import (
	"fmt"
	"testing"
	"time"
)

// A Cluster's markers are written one slot after the other: a store that
// reads them meanwhile finishes the arm instead of taking the slots not
// yet written for lost, but only while the arm is fresh and only towards
// the generation it succeeds.
func TestArmInProgress(t *testing.T) {
	now := time.UnixMilli(1_800_000_000_000)
	armed := func(gen, prev string, age time.Duration) string {
		return fmt.Sprintf("armed %s %s %d", gen, prev, now.Add(-age).UnixMilli())
	}
	forgot := func(gen string) string { return fmt.Sprintf("forgot %s %d lost", gen, now.Add(-time.Hour).UnixMilli()) }
	fresh, succ := armed("b", "-", time.Second), armed("c", "a", time.Second)
	for _, tc := range []struct {
		name string
		vals []string
		want string
	}{
		{"a new arm half written", []string{fresh, "", fresh, ""}, fresh},
		{"a new arm written long ago, some markers missing: a loss", []string{armed("b", "-", time.Hour), "", ""}, ""},
		{"a loss accepted, half written over the loss", []string{succ, forgot("a"), "", succ}, succ},
		{"a loss accepted, half written over the old generation", []string{succ, armed("a", "-", time.Hour), succ}, succ},
		{"another generation beside the old one: a loss", []string{armed("b", "-", time.Second), armed("a", "-", time.Hour)}, ""},
		{"a succession of another generation: a loss", []string{armed("c", "z", time.Second), armed("a", "-", time.Hour)}, ""},
		{"a new arm beside a recorded loss: a loss", []string{fresh, forgot("a")}, ""},
	} {
		got, ok := armInProgress(tc.vals, now)
		if got != tc.want || ok != (tc.want != "") {
			t.Errorf("%s: armInProgress = %q %v, want %q", tc.name, got, ok, tc.want)
		}
	}
}
