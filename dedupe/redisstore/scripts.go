package redisstore

import (
	"context"
	_ "embed"
	"fmt"

	"github.com/redis/go-redis/v9"

	"github.com/idemstream/idemstream/dedupe"
)

// Each script is the shared entry.lua (clock, load, save) followed by
// its own body, so that the encoding of an entry is written once.
var (
	//go:embed entry.lua
	entrySrc string
	//go:embed decide.lua
	decideSrc string
	//go:embed complete.lua
	completeSrc string
	//go:embed lookup.lua
	lookupSrc string

	decideScript   = redis.NewScript(entrySrc + decideSrc)
	completeScript = redis.NewScript(entrySrc + completeSrc)
	lookupScript   = redis.NewScript(entrySrc + lookupSrc)
)

// maxGroup bounds the records one script call decides, so that no call
// blocks the server for long.
const maxGroup = 512

// runGroups decides how items travel: on one node, in groups of up to
// maxGroup per script call; on a cluster, one group per hash slot (a
// script may only touch one slot). All groups go in one pipelined round
// trip. Groups that a server answers NOSCRIPT (it restarted, or a failover
// moved the slot) are sent again after loading the script; the others are
// not, so no item runs twice.
//
// shared, when set, gives the arguments that precede a group's items (taken
// from its first item); class tells which items may share them.
func (s *Store) runGroups(ctx context.Context, op string, script *redis.Script, names []string, args [][]any,
	shared func(i int) []any, class func(i int) string, handle func(idx []int, rep []any) error) error {
	groups := s.group(names, class)
	for attempt := 0; ; attempt++ {
		cmds := make([]*redis.Cmd, len(groups))
		sent := make([]redis.Cmder, len(groups))
		routes := make([]string, len(groups))
		for g, idx := range groups {
			keys := make([]string, len(idx))
			var flat []any
			if shared != nil {
				flat = append(flat, shared(idx[0])...)
			}
			for j, i := range idx {
				keys[j] = names[i]
				flat = append(flat, args[i]...)
			}
			cmds[g] = evalSha(ctx, script, keys, flat)
			sent[g], routes[g] = cmds[g], keys[0]
		}
		execErr, ackErr := s.roundTrip(ctx, op, routes, sent)
		if isMarkerFailure(execErr) {
			return execErr
		}
		if ackErr != nil && (execErr == nil || redis.HasErrorPrefix(execErr, "NOSCRIPT")) {
			// Made but not acknowledged: no item of the call is decided.
			return ackErr
		}
		var missing [][]int
		for g, idx := range groups {
			err := cmds[g].Err()
			switch {
			case err == nil:
				rep, ok := cmds[g].Val().([]any)
				if !ok {
					return fmt.Errorf("%s: unexpected reply %T", op, cmds[g].Val())
				}
				if err := handle(idx, rep); err != nil {
					return err
				}
			case redis.HasErrorPrefix(err, "NOSCRIPT"):
				missing = append(missing, idx)
			default:
				return classify(op, err)
			}
		}
		if len(missing) == 0 {
			if execErr != nil && !redis.HasErrorPrefix(execErr, "NOSCRIPT") {
				return classify(op, execErr)
			}
			return nil
		}
		if attempt > 0 {
			return fmt.Errorf("%s: %w: script still missing after loading it", op, dedupe.ErrStoreUnavailable)
		}
		if err := s.loadScript(ctx, script); err != nil {
			return classify(op, err)
		}
		groups = missing
	}
}

// group splits items into script calls. Items of one slot keep their
// order: each joins the newest group of its slot, and a full group or a
// change of class opens a new one behind it.
func (s *Store) group(names []string, class func(i int) string) [][]int {
	_, cluster := s.client.(*redis.ClusterClient)
	var groups [][]int
	var classes []string
	newest := map[uint16]int{}
	for i, n := range names {
		var slot uint16
		if cluster {
			slot = hashSlot(n)
		}
		c := ""
		if class != nil {
			c = class(i)
		}
		g, ok := newest[slot]
		if !ok || len(groups[g]) == maxGroup || classes[g] != c {
			g = len(groups)
			newest[slot] = g
			groups = append(groups, nil)
			classes = append(classes, c)
		}
		groups[g] = append(groups[g], i)
	}
	return groups
}

func (s *Store) loadScript(ctx context.Context, script *redis.Script) error {
	if cc, ok := s.client.(*redis.ClusterClient); ok {
		return cc.ForEachShard(ctx, func(ctx context.Context, c *redis.Client) error {
			return script.Load(ctx, c).Err()
		})
	}
	return script.Load(ctx, s.client).Err()
}
