package redisstore

import "strings"

// hashSlot is Redis Cluster's key slot: CRC16 (XMODEM) of the hash tag, or
// of the whole name when it has none, modulo 16384.
func hashSlot(name string) uint16 {
	if open := strings.IndexByte(name, '{'); open >= 0 {
		if close := strings.IndexByte(name[open+1:], '}'); close > 0 {
			name = name[open+1 : open+1+close]
		}
	}
	return crc16(name) % 16384
}

func crc16(s string) uint16 {
	var crc uint16
	for i := 0; i < len(s); i++ {
		crc ^= uint16(s[i]) << 8
		for range 8 {
			if crc&0x8000 != 0 {
				crc = crc<<1 ^ 0x1021
			} else {
				crc <<= 1
			}
		}
	}
	return crc
}
