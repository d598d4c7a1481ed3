// Dedup is the Kafka Streams peer of `make load`: the same job as
// `idemstream run` with the load's pipeline (strict semantics, the same
// volatile fields and unordered array, the key from a header), written as
// a Kafka Streams user would write it: a processor with a persistent
// (RocksDB) key-value store of fingerprints, exactly-once v2. The first
// record of a key is forwarded to the output; a later one with the same
// fingerprint is a replay and dropped; one with another fingerprint is a
// conflict and goes to the dead-letter topic. The window is not enforced
// (the run is shorter than any window).
//
// Usage: java -cp CLASSPATH Dedup BROKERS APPLICATION_ID INPUT OUTPUT DLQ
// VOLATILE_PATHS UNORDERED_PATHS KEY_HEADER, the paths comma-separated
// JSON Pointers where "*" matches any array index.
import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.ObjectMapper;
import com.fasterxml.jackson.databind.node.ArrayNode;
import com.fasterxml.jackson.databind.node.JsonNodeFactory;
import com.fasterxml.jackson.databind.node.ObjectNode;
import java.nio.charset.StandardCharsets;
import java.security.MessageDigest;
import java.util.ArrayList;
import java.util.HexFormat;
import java.util.List;
import java.util.Map;
import java.util.Properties;
import java.util.TreeMap;
import java.util.concurrent.CountDownLatch;
import org.apache.kafka.common.header.Header;
import org.apache.kafka.common.serialization.Serdes;
import org.apache.kafka.streams.KafkaStreams;
import org.apache.kafka.streams.StreamsConfig;
import org.apache.kafka.streams.Topology;
import org.apache.kafka.streams.processor.api.Processor;
import org.apache.kafka.streams.processor.api.ProcessorContext;
import org.apache.kafka.streams.processor.api.Record;
import org.apache.kafka.streams.state.KeyValueStore;
import org.apache.kafka.streams.state.Stores;

public final class Dedup {
  static final ObjectMapper JSON = new ObjectMapper();
  static final String STORE = "fingerprints";

  public static void main(String[] args) throws Exception {
    if (args.length != 8) {
      System.err.println("usage: Dedup BROKERS APPLICATION_ID INPUT OUTPUT DLQ VOLATILE UNORDERED KEY_HEADER");
      System.exit(2);
    }
    String brokers = args[0], app = args[1], input = args[2], output = args[3], dlq = args[4];
    List<String[]> volatilePaths = paths(args[5]);
    List<String[]> unorderedPaths = paths(args[6]);
    String keyHeader = args[7];

    Properties p = new Properties();
    p.put(StreamsConfig.APPLICATION_ID_CONFIG, app);
    p.put(StreamsConfig.BOOTSTRAP_SERVERS_CONFIG, brokers);
    p.put(StreamsConfig.PROCESSING_GUARANTEE_CONFIG, StreamsConfig.EXACTLY_ONCE_V2);
    p.put(StreamsConfig.STATE_DIR_CONFIG, System.getProperty("java.io.tmpdir") + "/state");
    p.put(StreamsConfig.NUM_STREAM_THREADS_CONFIG, Integer.getInteger("dedup.threads", 2));
    p.put(StreamsConfig.REPLICATION_FACTOR_CONFIG, 1);
    p.put(StreamsConfig.consumerPrefix("auto.offset.reset"), "earliest");
    // Tuned for throughput, as a user draining a backlog would: a commit
    // (one transaction per task) every second instead of every 100 ms,
    // and a 64 MB record cache in front of RocksDB.
    p.put(StreamsConfig.COMMIT_INTERVAL_MS_CONFIG, Integer.getInteger("dedup.commit.ms", 1000));
    p.put(StreamsConfig.STATESTORE_CACHE_MAX_BYTES_CONFIG, 64L << 20);

    Topology t = new Topology();
    t.addSource("in", Serdes.ByteArray().deserializer(), Serdes.ByteArray().deserializer(), input);
    t.addProcessor("dedup", () -> new Processor<byte[], byte[], byte[], byte[]>() {
      ProcessorContext<byte[], byte[]> ctx;
      KeyValueStore<String, String> seen;
      MessageDigest sha;

      @Override
      public void init(ProcessorContext<byte[], byte[]> c) {
        ctx = c;
        seen = c.getStateStore(STORE);
        try {
          sha = MessageDigest.getInstance("SHA-256");
        } catch (Exception e) {
          throw new IllegalStateException(e);
        }
      }

      @Override
      public void process(Record<byte[], byte[]> r) {
        Header h = r.headers().lastHeader(keyHeader);
        String fp;
        try {
          fp = fingerprint(r.value(), volatilePaths, unorderedPaths, sha);
        } catch (Exception e) {
          fp = null;
        }
        if (h == null || fp == null) {
          ctx.forward(r, "dlq");
          return;
        }
        String key = new String(h.value(), StandardCharsets.UTF_8);
        String prior = seen.get(key);
        if (prior == null) {
          seen.put(key, fp);
          ctx.forward(r, "out");
        } else if (!prior.equals(fp)) {
          ctx.forward(r, "dlq");
        }
      }
    }, "in");
    t.addStateStore(Stores.keyValueStoreBuilder(Stores.persistentKeyValueStore(STORE), Serdes.String(), Serdes.String()), "dedup");
    t.addSink("out", output, Serdes.ByteArray().serializer(), Serdes.ByteArray().serializer(), "dedup");
    t.addSink("dlq", dlq, Serdes.ByteArray().serializer(), Serdes.ByteArray().serializer(), "dedup");

    KafkaStreams streams = new KafkaStreams(t, p);
    CountDownLatch done = new CountDownLatch(1);
    Runtime.getRuntime().addShutdownHook(new Thread(() -> {
      streams.close();
      streams.cleanUp(); // the local state of a run is not kept
      done.countDown();
    }));
    streams.start();
    done.await();
  }

  static List<String[]> paths(String csv) {
    List<String[]> out = new ArrayList<>();
    for (String s : csv.split(",")) {
      s = s.trim();
      if (s.startsWith("/")) {
        out.add(s.substring(1).split("/"));
      }
    }
    return out;
  }

  // fingerprint: parse, drop volatile paths, sort unordered arrays by their
  // elements' canonical text, write with sorted members, SHA-256.
  static String fingerprint(byte[] value, List<String[]> vol, List<String[]> unordered, MessageDigest sha) throws Exception {
    JsonNode root = JSON.readTree(value);
    for (String[] path : vol) {
      remove(root, path, 0);
    }
    for (String[] path : unordered) {
      sortArrays(root, path, 0);
    }
    StringBuilder b = new StringBuilder(value.length);
    write(root, b);
    sha.reset();
    return "sha256:" + HexFormat.of().formatHex(sha.digest(b.toString().getBytes(StandardCharsets.UTF_8)));
  }

  static void remove(JsonNode n, String[] path, int i) {
    if (n == null) {
      return;
    }
    String step = path[i];
    boolean last = i == path.length - 1;
    if (n.isObject()) {
      if (last) {
        ((ObjectNode) n).remove(step);
      } else {
        remove(n.get(step), path, i + 1);
      }
    } else if (n.isArray() && step.equals("*")) {
      for (JsonNode e : n) {
        if (!last) {
          remove(e, path, i + 1);
        }
      }
    }
  }

  static void sortArrays(JsonNode n, String[] path, int i) {
    if (n == null) {
      return;
    }
    if (i == path.length) {
      if (n.isArray()) {
        ArrayNode a = (ArrayNode) n;
        Map<String, List<JsonNode>> byText = new TreeMap<>();
        for (JsonNode e : a) {
          StringBuilder b = new StringBuilder();
          write(e, b);
          byText.computeIfAbsent(b.toString(), k -> new ArrayList<>()).add(e);
        }
        a.removeAll();
        for (List<JsonNode> es : byText.values()) {
          a.addAll(es);
        }
      }
      return;
    }
    String step = path[i];
    if (n.isObject()) {
      sortArrays(n.get(step), path, i + 1);
    } else if (n.isArray() && step.equals("*")) {
      for (JsonNode e : n) {
        sortArrays(e, path, i + 1);
      }
    }
  }

  static void write(JsonNode n, StringBuilder b) {
    if (n.isObject()) {
      List<String> names = new ArrayList<>();
      n.fieldNames().forEachRemaining(names::add);
      names.sort(null);
      b.append('{');
      for (int i = 0; i < names.size(); i++) {
        if (i > 0) {
          b.append(',');
        }
        b.append(JsonNodeFactory.instance.textNode(names.get(i)).toString()).append(':');
        write(n.get(names.get(i)), b);
      }
      b.append('}');
    } else if (n.isArray()) {
      b.append('[');
      for (int i = 0; i < n.size(); i++) {
        if (i > 0) {
          b.append(',');
        }
        write(n.get(i), b);
      }
      b.append(']');
    } else {
      b.append(n.toString());
    }
  }
}
