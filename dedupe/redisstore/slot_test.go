package redisstore

import "testing"

// The values of the Redis Cluster specification and of CLUSTER KEYSLOT.
func TestHashSlot(t *testing.T) {
	cases := map[string]uint16{
		"123456789":            0x31C3 % 16384,
		"foo":                  12182,
		"{user1000}.following": hashSlot("user1000"),
		"idem:{p:k}":           hashSlot("p:k"),
		"{}x":                  hashSlot("{}x"),
	}
	if crc16("123456789") != 0x31C3 {
		t.Fatalf("crc16(123456789) = %#x, want 0x31c3", crc16("123456789"))
	}
	for name, want := range cases {
		if got := hashSlot(name); got != want {
			t.Errorf("hashSlot(%q) = %d, want %d", name, got, want)
		}
	}
}
