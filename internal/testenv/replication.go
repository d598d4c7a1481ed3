package testenv

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// Port is the server's TCP port.
func (s *RedisServer) Port() int { return s.port }

// StartRedisReplica starts a private redis-server that replicates from
// master (host:port, which may be a ReplicationProxy), and waits until its
// link to the master is up and the master lists it online.
func StartRedisReplica(t testing.TB, master string, cfg RedisConfig) *RedisServer {
	t.Helper()
	host, port, err := net.SplitHostPort(master)
	if err != nil {
		t.Fatalf("replica of %q: %v", master, err)
	}
	cfg.Args = append(append([]string{}, cfg.Args...), "--replicaof", host, port)
	r := StartRedis(t, cfg)
	WaitRedisInfo(t, r.Addr, "master_link_status:up", 20*time.Second)
	// The master lists a replica online only once its first REPLCONF ACK
	// came (up to a second after the sync): until then a check of
	// min_replicas counts it out.
	WaitRedisInfo(t, master, "state=online", 20*time.Second)
	return r
}

// WaitRedisInfo polls INFO on addr until it contains want.
func WaitRedisInfo(t testing.TB, addr, want string, within time.Duration) {
	t.Helper()
	deadline := time.Now().Add(within)
	var last string
	for {
		info, err := RedisCommand(addr, "INFO")
		if err == nil && strings.Contains(info, want) {
			return
		}
		last = info
		if err != nil {
			last = err.Error()
		}
		if time.Now().After(deadline) {
			t.Fatalf("redis %s: no %q in INFO within %s; last answer: %.400s", addr, want, within, last)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// RedisCommand sends one command in RESP and returns the reply as text:
// a bulk string's content, an integer's digits, an error as an error, an
// array's elements one per line (nested arrays flattened). It needs no
// client library.
func RedisCommand(addr string, args ...string) (string, error) {
	c, err := net.DialTimeout("tcp", addr, time.Second)
	if err != nil {
		return "", err
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(3 * time.Second))
	var b bytes.Buffer
	fmt.Fprintf(&b, "*%d\r\n", len(args))
	for _, a := range args {
		fmt.Fprintf(&b, "$%d\r\n%s\r\n", len(a), a)
	}
	if _, err := c.Write(b.Bytes()); err != nil {
		return "", err
	}
	return readReply(bufio.NewReader(c))
}

// readReply reads one RESP2 reply as RedisCommand returns it.
func readReply(r *bufio.Reader) (string, error) {
	line, err := r.ReadString('\n')
	if err != nil {
		return "", err
	}
	if len(line) < 3 || !strings.HasSuffix(line, "\r\n") {
		return "", fmt.Errorf("unsupported reply %q", line)
	}
	body := line[1 : len(line)-2]
	switch line[0] {
	case '+', ':':
		return body, nil
	case '-':
		return "", errors.New(body)
	case '$':
		n, err := strconv.Atoi(body)
		if err != nil || n < 0 {
			return "", err
		}
		buf := make([]byte, n+2)
		if _, err := io.ReadFull(r, buf); err != nil {
			return "", err
		}
		return string(buf[:n]), nil
	case '*':
		n, err := strconv.Atoi(body)
		if err != nil || n < 0 {
			return "", err
		}
		items := make([]string, 0, n)
		for range n {
			item, err := readReply(r)
			if err != nil {
				return "", err
			}
			items = append(items, item)
		}
		return strings.Join(items, "\n"), nil
	}
	return "", fmt.Errorf("unsupported reply %q", line)
}

// StartRedisSentinels starts n Sentinels that monitor master (host:port)
// as "mymaster" with the given quorum, and fail it over quickly: down
// after three seconds. (One second was quicker, and a test machine busy
// with other suites stalled the promoted master that long now and then:
// the Sentinels failed it over in turn.) It returns their addresses; they
// stop when the test ends.
func StartRedisSentinels(t testing.TB, master string, n, quorum int) []string {
	t.Helper()
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		unavailable(t, "redis-server not found (apt-get install redis-server)")
	}
	host, mport, err := net.SplitHostPort(master)
	if err != nil {
		t.Fatalf("sentinels of %q: %v", master, err)
	}
	var addrs []string
	for range n {
		dir := t.TempDir()
		port := freePort(t)
		conf := filepath.Join(dir, "sentinel.conf")
		text := fmt.Sprintf("port %d\nbind 127.0.0.1\ndir %s\n"+
			"sentinel monitor mymaster %s %s %d\n"+
			"sentinel down-after-milliseconds mymaster 3000\n"+
			"sentinel failover-timeout mymaster 6000\n"+
			"sentinel parallel-syncs mymaster 1\n", port, dir, host, mport, quorum)
		if err := os.WriteFile(conf, []byte(text), 0o600); err != nil {
			t.Fatal(err)
		}
		addr := startSentinel(t, bin, conf, dir, port)
		addrs = append(addrs, addr)
	}
	return addrs
}

// ReplicationProxy is a TCP proxy in front of a Redis master that can cut
// the replication link alone. A replica connects to the master through
// it, and so may everybody else (Sentinel insists that a replica's
// replicaof is the address it monitors): connections that speak REPLCONF
// or PSYNC are the replication links, the others are left alone.
type ReplicationProxy struct {
	Addr   string
	target string
	ln     net.Listener

	mu          sync.Mutex
	partitioned bool
	heal        chan struct{}
	conns       map[*proxied]struct{}
	wg          sync.WaitGroup
}

type proxied struct {
	client, server net.Conn
	replication    bool
}

// StartReplicationProxy listens on a free loopback port and forwards to
// target; it closes when the test ends.
func StartReplicationProxy(t testing.TB, target string) *ReplicationProxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("proxy listen: %v", err)
	}
	p := &ReplicationProxy{Addr: ln.Addr().String(), target: target, ln: ln, heal: make(chan struct{}), conns: map[*proxied]struct{}{}}
	p.wg.Add(1)
	go p.accept()
	t.Cleanup(p.Close)
	return p
}

// retarget makes later connections go to target.
func (p *ReplicationProxy) retarget(target string) {
	p.mu.Lock()
	p.target = target
	p.mu.Unlock()
}

// Partition stops the replication links: what either side sends on them
// is held, not delivered, until Heal or Cut.
func (p *ReplicationProxy) Partition() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if !p.partitioned {
		p.partitioned = true
		p.heal = make(chan struct{})
	}
}

// Heal delivers what the partition held and lets the links run again.
func (p *ReplicationProxy) Heal() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.partitioned {
		p.partitioned = false
		close(p.heal)
	}
}

// Cut closes the replication links, dropping what the partition held, and
// ends the partition for later links: the master died with it.
func (p *ReplicationProxy) Cut() {
	p.mu.Lock()
	for c := range p.conns {
		if c.replication {
			c.client.Close()
			c.server.Close()
		}
	}
	p.mu.Unlock()
	p.Heal()
}

// Close stops the proxy and closes every connection.
func (p *ReplicationProxy) Close() {
	p.ln.Close()
	p.mu.Lock()
	for c := range p.conns {
		c.client.Close()
		c.server.Close()
	}
	p.mu.Unlock()
	p.Heal()
	p.wg.Wait()
}

func (p *ReplicationProxy) accept() {
	defer p.wg.Done()
	for {
		client, err := p.ln.Accept()
		if err != nil {
			return
		}
		p.mu.Lock()
		target := p.target
		p.mu.Unlock()
		server, err := net.DialTimeout("tcp", target, time.Second)
		if err != nil {
			client.Close()
			continue
		}
		c := &proxied{client: client, server: server}
		p.mu.Lock()
		p.conns[c] = struct{}{}
		p.mu.Unlock()
		p.wg.Add(2)
		go p.pipe(c, client, server, true)
		go p.pipe(c, server, client, false)
	}
}

// pipe copies from src to dst; on a replication link under a partition it
// holds each chunk until the partition ends.
func (p *ReplicationProxy) pipe(c *proxied, src, dst net.Conn, fromClient bool) {
	defer p.wg.Done()
	defer func() {
		src.Close()
		dst.Close()
		p.mu.Lock()
		delete(p.conns, c)
		p.mu.Unlock()
	}()
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 {
			p.mu.Lock()
			if fromClient && !c.replication && (bytes.Contains(buf[:n], []byte("REPLCONF")) || bytes.Contains(buf[:n], []byte("PSYNC"))) {
				c.replication = true
			}
			hold, heal := c.replication && p.partitioned, p.heal
			p.mu.Unlock()
			if hold {
				<-heal
				p.mu.Lock()
				_, alive := p.conns[c]
				p.mu.Unlock()
				if !alive {
					return
				}
			}
			if _, err := dst.Write(buf[:n]); err != nil {
				return
			}
		}
		if err != nil {
			return
		}
	}
}

// ReplicatedCluster is a Redis Cluster of three masters, each with one
// replica. Every master announces the address of a ReplicationProxy in
// front of it, so that its replica (and every client) reaches it through
// the proxy, while the cluster bus goes direct: a partition of the proxy
// cuts replication and nothing else.
type ReplicatedCluster struct {
	Masters  []*RedisServer
	Proxies  []*ReplicationProxy
	Replicas []*RedisServer
}

// Addrs are the addresses clients start from: the masters' proxies.
func (c *ReplicatedCluster) Addrs() []string {
	var out []string
	for _, p := range c.Proxies {
		out = append(out, p.Addr)
	}
	return out
}

// StartReplicatedCluster starts the cluster, assigns the slots in three
// ranges, attaches the replicas, and waits until every node reports
// cluster_state:ok and every replica's link is up. cluster-node-timeout is
// one second, so that a dead master is failed over within seconds.
func StartReplicatedCluster(t testing.TB) *ReplicatedCluster {
	t.Helper()
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		unavailable(t, "redis-server not found (apt-get install redis-server)")
	}
	// The bus port is chosen, not derived (port + 10000 can overflow).
	busPorts := map[*RedisServer]int{}
	clusterArgs := func(bus int) []string {
		return []string{"--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf", "--cluster-node-timeout", "1000",
			"--cluster-port", strconv.Itoa(bus)}
	}
	c := &ReplicatedCluster{}
	for range 3 {
		m := &RedisServer{t: t, bin: bin, dir: t.TempDir(), port: freePort(t)}
		m.Addr = "127.0.0.1:" + strconv.Itoa(m.port)
		p := StartReplicationProxy(t, m.Addr)
		_, pport, _ := net.SplitHostPort(p.Addr)
		busPorts[m] = freePort(t)
		m.cfg = RedisConfig{Args: append(clusterArgs(busPorts[m]), "--cluster-announce-ip", "127.0.0.1", "--cluster-announce-port", pport)}
		m.Start()
		p.retarget(m.Addr) // Start may have moved to another port
		t.Cleanup(m.Stop)
		c.Masters, c.Proxies = append(c.Masters, m), append(c.Proxies, p)
	}
	for range 3 {
		c.Replicas = append(c.Replicas, StartRedis(t, RedisConfig{Args: clusterArgs(freePort(t))}))
	}
	all := append(append([]*RedisServer{}, c.Masters...), c.Replicas...)
	first := all[0]
	firstBus := strconv.Itoa(busPorts[first])
	for _, n := range all[1:] {
		if _, err := RedisCommand(n.Addr, "CLUSTER", "MEET", "127.0.0.1", strconv.Itoa(first.port), firstBus); err != nil {
			t.Fatalf("cluster meet from %s: %v", n.Addr, err)
		}
	}
	for i, r := range [][2]int{{0, 5460}, {5461, 10922}, {10923, 16383}} {
		if _, err := RedisCommand(c.Masters[i].Addr, "CLUSTER", "ADDSLOTSRANGE", strconv.Itoa(r[0]), strconv.Itoa(r[1])); err != nil {
			t.Fatalf("cluster addslotsrange on %s: %v", c.Masters[i].Addr, err)
		}
	}
	deadline := time.Now().Add(30 * time.Second)
	for i, r := range c.Replicas {
		id, err := RedisCommand(c.Masters[i].Addr, "CLUSTER", "MYID")
		if err != nil {
			t.Fatal(err)
		}
		for {
			// The replica must know the master before it can follow it.
			if _, err = RedisCommand(r.Addr, "CLUSTER", "REPLICATE", id); err == nil {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("cluster replicate on %s: %v", r.Addr, err)
			}
			time.Sleep(100 * time.Millisecond)
		}
	}
	for _, n := range all {
		waitClusterOK(t, n.Addr, time.Until(deadline))
	}
	for _, r := range c.Replicas {
		WaitRedisInfo(t, r.Addr, "master_link_status:up", time.Until(deadline))
	}
	return c
}

func waitClusterOK(t testing.TB, addr string, within time.Duration) {
	t.Helper()
	deadline := time.Now().Add(within)
	for {
		info, err := RedisCommand(addr, "CLUSTER", "INFO")
		if err == nil && strings.Contains(info, "cluster_state:ok") && strings.Contains(info, "cluster_known_nodes:6") {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("redis cluster node %s not ok: %s %v", addr, info, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// StartRedisClusterNodes starts a Redis Cluster of three masters without
// replicas and returns their handles: a node killed and started again
// keeps its nodes.conf, and so its slots, but no data (no persistence),
// which is a node restored empty. cluster-node-timeout is one second.
func StartRedisClusterNodes(t testing.TB) []*RedisServer {
	t.Helper()
	var nodes []*RedisServer
	buses := map[*RedisServer]int{}
	for range 3 {
		bus := freePort(t)
		n := StartRedis(t, RedisConfig{Args: []string{"--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf",
			"--cluster-node-timeout", "1000", "--cluster-port", strconv.Itoa(bus)}})
		buses[n] = bus
		nodes = append(nodes, n)
	}
	first := nodes[0]
	for _, n := range nodes[1:] {
		if _, err := RedisCommand(n.Addr, "CLUSTER", "MEET", "127.0.0.1", strconv.Itoa(first.port), strconv.Itoa(buses[first])); err != nil {
			t.Fatalf("cluster meet from %s: %v", n.Addr, err)
		}
	}
	for i, r := range [][2]int{{0, 5460}, {5461, 10922}, {10923, 16383}} {
		if _, err := RedisCommand(nodes[i].Addr, "CLUSTER", "ADDSLOTSRANGE", strconv.Itoa(r[0]), strconv.Itoa(r[1])); err != nil {
			t.Fatalf("cluster addslotsrange on %s: %v", nodes[i].Addr, err)
		}
	}
	for _, n := range nodes {
		WaitClusterOK(t, n.Addr, 3, 30*time.Second)
	}
	return nodes
}

// WaitClusterOK waits until the node at addr reports cluster_state:ok and
// knows nodes nodes.
func WaitClusterOK(t testing.TB, addr string, nodes int, within time.Duration) {
	t.Helper()
	deadline := time.Now().Add(within)
	for {
		info, err := RedisCommand(addr, "CLUSTER", "INFO")
		if err == nil && strings.Contains(info, "cluster_state:ok") && strings.Contains(info, "cluster_known_nodes:"+strconv.Itoa(nodes)+"\r") {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("redis cluster node %s not ok within %s: %s %v", addr, within, info, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}
