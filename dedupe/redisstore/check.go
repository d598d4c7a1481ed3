package redisstore

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"strconv"
	"strings"
	"sync"

	"github.com/redis/go-redis/v9"
)

// SettingsError is a server whose settings would lose idempotency state
// without a word. Problems has one line per setting, each naming the
// setting and the fix.
type SettingsError struct {
	Problems []string
	// Field is the configuration field to change, when one can fix every
	// problem (store.redis.min_replicas), else store.redis: the fix is on
	// the server.
	Field string
}

func (e *SettingsError) Error() string { return strings.Join(e.Problems, "; ") }

// CheckServer reads the settings of every master (each master of a
// Cluster) and refuses those under which an acknowledged decision can be
// forgotten:
//
//   - maxmemory-policy other than noeviction: every entry has a TTL, so
//     volatile-* policies evict them as readily as allkeys-*, and an
//     evicted key is decided first again;
//   - appendonly no when no replica must acknowledge (min_replicas 0): a
//     restart forgets every decision since the last snapshot;
//   - fewer replicas connected than min_replicas: every write would time
//     out;
//   - Sentinel or Cluster with min_replicas 0: a failover promotes a
//     replica that may lack the latest decisions (the failover test shows
//     it), as a restart without appendonly does.
//
// It returns a *SettingsError for those, warnings for what could not be
// verified (managed services that refuse CONFIG) or is merely weaker than
// it could be (appendfsync everysec), and an error wrapping
// dedupe.ErrStoreUnavailable when a master did not answer at all.
func (s *Store) CheckServer(ctx context.Context) (warnings []string, err error) {
	var mu sync.Mutex
	var problems []string
	field := ""
	check := func(ctx context.Context, c *redis.Client) error {
		w, p, f, err := checkNode(ctx, c, s.acks.replicas)
		if err == nil && len(p) == 0 && s.acks.replicas > 0 {
			aof, possible, err := s.waitsWithAOF(ctx, c)
			if err != nil && !refused(err) {
				return err
			}
			if possible && !aof {
				w = append(w, fmt.Sprintf("redis %s: fewer than %d replicas acknowledged an fsync (WAITAOF) within store.redis.replica_timeout, so writes wait with WAIT: the replicas have each decision in memory, not on disk; set appendonly yes on the replicas and restart to wait for their fsyncs", c.Options().Addr, s.acks.replicas))
			}
		}
		mu.Lock()
		defer mu.Unlock()
		warnings, problems = append(warnings, w...), append(problems, p...)
		for _, f := range f {
			if field == "" || field == f {
				field = f
			} else {
				field = "store.redis"
			}
		}
		return err
	}
	// A deployment that promotes replicas (Sentinel, Cluster) forgets every
	// decision the promoted replica had not received yet, whatever the
	// old master had on disk: only replica acknowledgement keeps them.
	failover := func(kind string) {
		if s.acks.replicas == 0 {
			problems = append(problems, fmt.Sprintf("redis %s with store.redis.min_replicas 0: a failover promotes a replica that may not have the latest decisions, and their keys are decided first again; set store.redis.min_replicas to 1 or more (or check_server: false to accept the risk)", kind))
			if field == "" || field == "store.redis.min_replicas" {
				field = "store.redis.min_replicas"
			} else {
				field = "store.redis"
			}
		}
	}
	switch c := s.client.(type) {
	case *redis.ClusterClient:
		failover("Cluster")
		err = c.ForEachMaster(ctx, check)
	case *redis.Client:
		if c.Options().Addr == "FailoverClient" {
			failover("Sentinel")
		}
		err = check(ctx, c)
	default:
		return nil, fmt.Errorf("check server: unsupported client %T", s.client)
	}
	if err != nil {
		return warnings, classify("check server", err)
	}
	sort.Strings(warnings)
	sort.Strings(problems)
	if len(problems) > 0 {
		return warnings, &SettingsError{Problems: problems, Field: field}
	}
	return warnings, nil
}

// checkNode checks one master.
func checkNode(ctx context.Context, c *redis.Client, minReplicas int) (warnings, problems, fields []string, err error) {
	problem := func(field, format string, args ...any) {
		problems, fields = append(problems, fmt.Sprintf(format, args...)), append(fields, field)
	}
	name := "redis " + c.Options().Addr
	if c.Options().Addr == "FailoverClient" {
		name = "redis master (from Sentinel)"
	}
	replInfo, err := c.Info(ctx, "replication").Result()
	switch {
	case refused(err):
		warnings = append(warnings, fmt.Sprintf("%s: INFO replication refused (%v): could not verify that it is a master with %d replicas connected", name, err, minReplicas))
	case err != nil:
		return nil, nil, nil, err
	default:
		f := infoFields(replInfo)
		if role := f["role"]; role != "" && role != "master" {
			problem("store.redis", "%s: role is %s, not master: it refuses writes; point store.redis at the master (or use Sentinel: addrs and master_name)", name, role)
		}
		if online := onlineReplicas(f); online < minReplicas {
			problem("store.redis.min_replicas", "%s: %d replicas connected, but store.redis.min_replicas is %d: every write would time out; connect replicas or lower store.redis.min_replicas", name, online, minReplicas)
		}
	}

	cfg, err := configGet(ctx, c, "maxmemory-policy", "appendonly", "appendfsync")
	if refused(err) {
		warnings = append(warnings, fmt.Sprintf("%s: CONFIG GET refused (%v): could not verify maxmemory-policy (must be noeviction) nor persistence (appendonly yes with appendfsync always, or store.redis.min_replicas >= 1)", name, err))
		return warnings, problems, fields, nil
	}
	if err != nil {
		return nil, nil, nil, err
	}
	if p := cfg["maxmemory-policy"]; p != "noeviction" {
		problem("store.redis", "%s: maxmemory-policy is %s: under memory pressure Redis evicts idempotency entries (every one has a TTL) and their keys are decided first again; set maxmemory-policy noeviction (CONFIG SET maxmemory-policy noeviction, and in redis.conf)", name, p)
	}
	if minReplicas == 0 {
		switch {
		case cfg["appendonly"] != "yes":
			problem("store.redis", "%s: appendonly is %s and store.redis.min_replicas is 0: a restart forgets every decision since the last snapshot; set appendonly yes with appendfsync always, or store.redis.min_replicas >= 1 with replicas", name, cfg["appendonly"])
		case cfg["appendfsync"] != "always":
			warnings = append(warnings, fmt.Sprintf("%s: appendfsync is %s: a crash of the host can forget up to a second of decisions; appendfsync always (or store.redis.min_replicas >= 1) keeps every acknowledged one", name, cfg["appendfsync"]))
		}
	}
	return warnings, problems, fields, nil
}

// onlineReplicas counts the replicas INFO replication lists as online;
// connected_slaves also counts those still in their first sync.
func onlineReplicas(f map[string]string) int {
	n := 0
	for k, v := range f {
		if strings.HasPrefix(k, "slave") && strings.Contains(v, "state=online") {
			if _, err := strconv.Atoi(strings.TrimPrefix(k, "slave")); err == nil {
				n++
			}
		}
	}
	return n
}

// configGet reads parameters one by one: CONFIG GET of several at once
// needs Redis 7.
func configGet(ctx context.Context, c *redis.Client, params ...string) (map[string]string, error) {
	out := map[string]string{}
	for _, p := range params {
		m, err := c.ConfigGet(ctx, p).Result()
		if err != nil {
			return nil, err
		}
		out[p] = m[p]
	}
	return out, nil
}

// refused tells a server that answered "no" (a managed service that
// renames or forbids CONFIG, an ACL without the permission) from one that
// did not answer.
func refused(err error) bool {
	var rerr redis.Error
	if err == nil || !errors.As(err, &rerr) {
		return false
	}
	msg := strings.ToUpper(err.Error())
	// Credentials are no answer about CONFIG: WRONGPASS ends "or user is
	// disabled", and must not pass for a forbidden command.
	if strings.HasPrefix(msg, "WRONGPASS") || strings.HasPrefix(msg, "NOAUTH") {
		return false
	}
	for _, p := range []string{"UNKNOWN COMMAND", "NOPERM", "NOT ALLOWED", "DISABLED", "UNKNOWN SUBCOMMAND"} {
		if strings.Contains(msg, p) {
			return true
		}
	}
	return false
}
