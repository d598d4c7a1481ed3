package group

import (
	"context"
	"errors"
	"fmt"
	"github.com/idemstream/idemstream/internal/retry"
	"slices"
	"strconv"
	"time"

	"github.com/segmentio/kafka-go"
)

// Commit commits offsets (the next offset to read, by partition) under
// the member's generation. A commit that meets the end of its generation
// waits for the next one and is sent again for the partitions still owned;
// one for a partition no longer owned fails with ErrNotOwned. A refusal no
// retry can cure (authorization) returns at once; other failures are tried
// again until ctx ends, and the last of them is returned with ctx's error.
func (m *Member) Commit(ctx context.Context, offsets map[int]int64) error {
	again := retry.Backoff{Min: 50 * time.Millisecond, Max: time.Second}
	for {
		m.mu.Lock()
		g, changed := m.gen, m.changed
		for p := range offsets {
			if _, ok := slices.BinarySearch(m.owned, p); !ok {
				m.mu.Unlock()
				return fmt.Errorf("commit %s/%d: %w", m.cfg.Topic, p, ErrNotOwned)
			}
		}
		m.mu.Unlock()
		err := m.commitOnce(ctx, g, offsets)
		switch {
		case err == nil:
			return nil
		case ctx.Err() != nil:
			return fmt.Errorf("%w (last: %w)", ctx.Err(), err)
		case IsFatal(err):
			return err
		case isGroupError(err):
			// The generation it was sent under is over: wait for what
			// comes next, and check ownership again.
			select {
			case <-changed:
			case <-ctx.Done():
				return fmt.Errorf("%w (last: %w)", ctx.Err(), err)
			}
		default:
			if retry.Sleep(ctx, again.Next()) != nil {
				return fmt.Errorf("%w (last: %w)", ctx.Err(), err)
			}
		}
	}
}

func (m *Member) commitOnce(ctx context.Context, g Generation, offsets map[int]int64) error {
	commits := make([]kafka.OffsetCommit, 0, len(offsets))
	for p, o := range offsets {
		commits = append(commits, kafka.OffsetCommit{Partition: p, Offset: o})
	}
	res, err := m.cfg.Client.OffsetCommit(ctx, &kafka.OffsetCommitRequest{
		GroupID: m.cfg.Group, GenerationID: g.ID, MemberID: g.MemberID, InstanceID: m.cfg.InstanceID,
		Topics: map[string][]kafka.OffsetCommit{m.cfg.Topic: commits},
	})
	if err != nil {
		return classify("offset commit", err)
	}
	for _, p := range res.Topics[m.cfg.Topic] {
		if p.Error != nil {
			return classify("offset commit "+strconv.Itoa(p.Partition), p.Error)
		}
	}
	return nil
}

// IsFatal says whether err is a refusal that no retry or rejoin can cure
// (authorization, a group that cannot take the member): the member stops
// (Run returns it) rather than try for ever, and so does a caller whose
// commit it refused.
func IsFatal(err error) bool {
	for _, e := range []error{kafka.GroupAuthorizationFailed, kafka.TopicAuthorizationFailed, kafka.ClusterAuthorizationFailed,
		kafka.SASLAuthenticationFailed, kafka.InconsistentGroupProtocol, kafka.InvalidSessionTimeout, kafka.GroupMaxSizeReached} {
		if errors.Is(err, e) {
			return true
		}
	}
	return false
}
