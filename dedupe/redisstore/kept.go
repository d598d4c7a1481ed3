package redisstore

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"time"

	"github.com/redis/go-redis/v9"
)

// keptKey names a kept value: the namespace and the hashed name in one
// hash tag, so that a Cluster spreads the values of a namespace over its
// slots, and names of any length stay bounded.
func (s *Store) keptKey(namespace, name string) string {
	sum := sha256.Sum256([]byte(name))
	return s.prefix + ":kept:{" + namespace + ":" + hex.EncodeToString(sum[:]) + "}"
}

// KeepFirst keeps value under name in namespace unless a value is kept
// there already, and returns the value kept: value itself, or the one
// that was there first (SET NX GET, one command, so two writers never
// both win). Either way the value kept is kept for at least ttl from now
// (PEXPIRE GT). Replicas acknowledge it as they do a decision
// (WithReplicas). It needs Redis 7.0 or later. The HTTP front door keeps
// a first request's answer with it.
func (s *Store) KeepFirst(ctx context.Context, namespace, name string, value []byte, ttl time.Duration) ([]byte, error) {
	if err := s.ready(ctx); err != nil {
		return nil, err
	}
	key := s.keptKey(namespace, name)
	px := max(ttl.Milliseconds(), 1)
	cmd := redis.NewStringCmd(ctx, "SET", key, value, "NX", "GET", "PX", px)
	extend := redis.NewIntCmd(ctx, "PEXPIRE", key, px, "GT")
	execErr, ackErr := s.roundTrip(ctx, "keep", []string{key, key}, []redis.Cmder{cmd, extend})
	if execErr == nil || errors.Is(execErr, redis.Nil) {
		if err := extend.Err(); err != nil {
			return nil, classify("keep", err)
		}
	}
	switch {
	case errors.Is(execErr, redis.Nil):
		// Absent before: kept now, once the replicas have it.
		if ackErr != nil {
			return nil, ackErr
		}
		return value, nil
	case execErr != nil:
		return nil, classify("keep", execErr)
	}
	first, err := cmd.Bytes()
	if err != nil {
		return nil, classify("keep", err)
	}
	return first, nil
}

// Kept returns the value kept under name in namespace, and false when
// none is (or it expired).
func (s *Store) Kept(ctx context.Context, namespace, name string) ([]byte, bool, error) {
	v, err := s.client.Get(ctx, s.keptKey(namespace, name)).Bytes()
	switch {
	case errors.Is(err, redis.Nil):
		return nil, false, nil
	case err != nil:
		return nil, false, classify("kept", err)
	}
	return v, true, nil
}
