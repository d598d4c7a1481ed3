package redisstore_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/idemstream/idemstream/dedupe/redisstore"
	"github.com/idemstream/idemstream/internal/testenv"
)

func checkServer(t *testing.T, c redis.UniversalClient, minReplicas int) ([]string, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	return redisstore.New(c, "idem", redisstore.WithReplicas(minReplicas, time.Second)).CheckServer(ctx)
}

// Each setting that loses state silently is refused with one line that
// names the setting and the fix; settings that are merely weaker, or that
// cannot be read, are warnings.
func TestCheckServerRefusesSettingsThatLoseState(t *testing.T) {
	aof := testenv.RedisConfig{AppendOnly: true}
	cases := []struct {
		name        string
		cfg         testenv.RedisConfig
		minReplicas int
		want        []string // in the one problem line; none: accepted
		warn        []string // in the one warning; none: no warning
	}{
		{name: "durable single node", cfg: aof},
		{name: "allkeys eviction", cfg: testenv.RedisConfig{AppendOnly: true, Args: []string{"--maxmemory-policy", "allkeys-lru"}},
			want: []string{"maxmemory-policy is allkeys-lru", "set maxmemory-policy noeviction"}},
		{name: "volatile eviction", cfg: testenv.RedisConfig{AppendOnly: true, Args: []string{"--maxmemory-policy", "volatile-ttl"}},
			want: []string{"maxmemory-policy is volatile-ttl", "every one has a TTL", "set maxmemory-policy noeviction"}},
		{name: "no persistence", cfg: testenv.RedisConfig{},
			want: []string{"appendonly is no", "store.redis.min_replicas is 0", "set appendonly yes with appendfsync always, or store.redis.min_replicas >= 1"}},
		{name: "snapshots only", cfg: testenv.RedisConfig{Args: []string{"--save", "60 1"}},
			want: []string{"appendonly is no", "since the last snapshot"}},
		{name: "fsync every second", cfg: testenv.RedisConfig{AppendOnly: true, Args: []string{"--appendfsync", "everysec"}},
			warn: []string{"appendfsync is everysec", "appendfsync always"}},
		{name: "too few replicas", cfg: aof, minReplicas: 1,
			want: []string{"0 replicas connected", "store.redis.min_replicas is 1", "connect replicas or lower store.redis.min_replicas"}},
		{name: "CONFIG refused", cfg: testenv.RedisConfig{Args: []string{"--rename-command", "CONFIG", ""}},
			warn: []string{"CONFIG GET refused", "could not verify maxmemory-policy (must be noeviction) nor persistence"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			srv := testenv.StartRedis(t, tc.cfg)
			warnings, err := checkServer(t, client(t, srv.Addr), tc.minReplicas)
			if len(tc.want) == 0 && err != nil {
				t.Fatalf("refused: %v", err)
			}
			if len(tc.want) > 0 {
				var se *redisstore.SettingsError
				if !errors.As(err, &se) || len(se.Problems) != 1 {
					t.Fatalf("CheckServer = %v; want one problem saying %q", err, tc.want)
				}
				for _, w := range append(tc.want, srv.Addr) {
					if !strings.Contains(se.Problems[0], w) {
						t.Errorf("problem %q does not say %q", se.Problems[0], w)
					}
				}
			}
			if len(tc.warn) == 0 && len(warnings) > 0 {
				t.Errorf("unexpected warnings: %q", warnings)
			}
			if len(tc.warn) > 0 {
				if len(warnings) != 1 {
					t.Fatalf("warnings = %q; want one saying %q", warnings, tc.warn)
				}
				for _, w := range tc.warn {
					if !strings.Contains(warnings[0], w) {
						t.Errorf("warning %q does not say %q", warnings[0], w)
					}
				}
			}
		})
	}
}

// With replicas that must acknowledge, a master without persistence is
// accepted: the replicas hold the decisions. A store pointed at the
// replica is refused.
func TestCheckServerWithReplicas(t *testing.T) {
	master, _, replica := masterWithReplica(t)
	if w, err := checkServer(t, client(t, master.Addr), 1); err != nil || len(w) > 0 {
		t.Errorf("master with one replica, min_replicas 1: %v %q", err, w)
	}
	_, err := checkServer(t, client(t, master.Addr), 2)
	if err == nil || !strings.Contains(err.Error(), "1 replicas connected, but store.redis.min_replicas is 2") {
		t.Errorf("min_replicas 2 with one replica: %v", err)
	}
	_, err = checkServer(t, client(t, replica.Addr), 1)
	if err == nil || !strings.Contains(err.Error(), "role is slave, not master") {
		t.Errorf("store on the replica: %v", err)
	}
}

// On a Cluster every master is checked, and the line names the one at
// fault.
func TestCheckServerChecksEveryClusterMaster(t *testing.T) {
	addrs := testenv.StartRedisCluster(t)
	for _, a := range addrs {
		if _, err := testenv.RedisCommand(a, "CONFIG", "SET", "appendonly", "yes"); err != nil {
			t.Fatal(err)
		}
		if _, err := testenv.RedisCommand(a, "CONFIG", "SET", "appendfsync", "always"); err != nil {
			t.Fatal(err)
		}
	}
	c, err := redisstore.NewClient(redisstore.Options{Addrs: addrs, Timeout: 3 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	// Every master has appendonly yes and appendfsync always, yet a
	// failover promotes a replica that may lack the latest decisions:
	// without replica acknowledgement a Cluster is refused.
	w, err := checkServer(t, c, 0)
	var se *redisstore.SettingsError
	if !errors.As(err, &se) || len(se.Problems) != 1 || se.Field != "store.redis.min_replicas" ||
		!strings.Contains(se.Problems[0], "Cluster with store.redis.min_replicas 0") || len(w) > 0 {
		t.Fatalf("durable cluster, min_replicas 0: %v %q, want the one failover problem naming store.redis.min_replicas", err, w)
	}
	if _, err := testenv.RedisCommand(addrs[2], "CONFIG", "SET", "maxmemory-policy", "volatile-lru"); err != nil {
		t.Fatal(err)
	}
	_, err = checkServer(t, c, 0)
	if !errors.As(err, &se) || len(se.Problems) != 2 || se.Field != "store.redis" ||
		!strings.Contains(strings.Join(se.Problems, "\n"), "redis "+addrs[2]+": maxmemory-policy is volatile-lru") {
		t.Errorf("one master with volatile-lru: %v", err)
	}
}

// A Sentinel deployment without replica acknowledgement is refused like
// appendonly no: TestSentinelFailoverLosesDecisionsWithoutReplicaAcks
// shows a promotion forgetting decisions. With min_replicas 1 it passes.
func TestCheckServerRefusesSentinelWithoutReplicaAcks(t *testing.T) {
	f := startSentinelFailover(t)
	for _, a := range []string{f.master.Addr, f.replica.Addr} {
		for _, kv := range [][2]string{{"appendonly", "yes"}, {"appendfsync", "always"}} {
			if _, err := testenv.RedisCommand(a, "CONFIG", "SET", kv[0], kv[1]); err != nil {
				t.Fatal(err)
			}
		}
	}
	c := sentinelClient(t, f.sentinels, 0)
	_, err := checkServer(t, c, 0)
	var se *redisstore.SettingsError
	if !errors.As(err, &se) || se.Field != "store.redis.min_replicas" || !strings.Contains(err.Error(), "Sentinel with store.redis.min_replicas 0") {
		t.Errorf("Sentinel, min_replicas 0: %v, want refused naming store.redis.min_replicas", err)
	}
	if _, err := checkServer(t, c, 1); err != nil {
		t.Errorf("Sentinel, min_replicas 1: %v", err)
	}
}

// An ACL user without +config (as managed services hand out) gets NOPERM:
// a warning, not a refusal.
func TestCheckServerWarnsOnNOPERM(t *testing.T) {
	srv := testenv.StartRedis(t, testenv.RedisConfig{AppendOnly: true, Args: []string{"--user", "svc", "on", ">pw-1", "~*", "&*", "+@all", "-config"}})
	c, err := redisstore.NewClient(redisstore.Options{URL: "redis://" + srv.Addr + "/0", Username: "svc", Password: "pw-1", Timeout: 3 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	warnings, err := checkServer(t, c, 0)
	if err != nil || len(warnings) != 1 || !strings.Contains(warnings[0], "CONFIG GET refused") || !strings.Contains(warnings[0], "NOPERM") {
		t.Errorf("CheckServer as a user without +config = %q, %v; want one warning naming NOPERM", warnings, err)
	}
}
