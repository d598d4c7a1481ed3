package main

import (
	"io"
	"strings"
	"testing"
)

func TestParseNamesTheBadFlag(t *testing.T) {
	ok := []string{"--brokers", "127.0.0.1:9092", "--input", "in", "--output", "out", "--group", "g"}
	if _, err := parse(ok, io.Discard); err != nil {
		t.Fatalf("parse %v: %v", ok, err)
	}
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"--input", "in", "--output", "out", "--group", "g"}, "--brokers"},
		{[]string{"--brokers", "b", "--output", "out", "--group", "g"}, "--input"},
		{[]string{"--brokers", "b", "--input", "in", "--output", "in", "--group", "g"}, "--output"},
		{append(ok[:len(ok):len(ok)], "--batch", "0"), "--batch"},
		{append(ok[:len(ok):len(ok)], "--batch-timeout", "0s"), "--batch-timeout"},
	} {
		_, err := parse(c.args, io.Discard)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("parse %v: %v, want an error naming %s", c.args, err, c.want)
		}
	}
}
