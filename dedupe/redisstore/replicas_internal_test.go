package redisstore

import "testing"

// WAITAOF exists from Redis 7.2: the detection must read versions right.
func TestVersionAtLeast(t *testing.T) {
	for v, want := range map[string]bool{"7.0.15": false, "7.2.0": true, "7.2.4": true, "7.10.1": true, "8.0.0": true, "6.2.14": false, "": false, "x.y": false} {
		if got := versionAtLeast(v, 7, 2); got != want {
			t.Errorf("versionAtLeast(%q, 7, 2) = %v, want %v", v, got, want)
		}
	}
}

func TestParseWait(t *testing.T) {
	if r, l, err := parseWait(ackMode{}, int64(2)); err != nil || r != 2 || l != 0 {
		t.Errorf("WAIT 2: %d %d %v", r, l, err)
	}
	if r, l, err := parseWait(ackMode{aof: true, numlocal: 1}, []any{int64(1), int64(3)}); err != nil || r != 3 || l != 1 {
		t.Errorf("WAITAOF [1 3]: %d %d %v", r, l, err)
	}
	if _, _, err := parseWait(ackMode{aof: true}, int64(1)); err == nil {
		t.Error("WAITAOF with an integer reply accepted")
	}
}
