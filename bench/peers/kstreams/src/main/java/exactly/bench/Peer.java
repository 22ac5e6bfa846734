package exactly.bench;

import com.fasterxml.jackson.databind.ObjectMapper;
import com.fasterxml.jackson.databind.node.ObjectNode;
import java.nio.charset.StandardCharsets;
import java.time.Duration;
import java.time.Instant;
import java.util.Arrays;
import java.util.Properties;
import java.util.concurrent.CountDownLatch;
import org.apache.kafka.clients.consumer.ConsumerConfig;
import org.apache.kafka.clients.producer.ProducerConfig;
import org.apache.kafka.common.serialization.Serdes;
import org.apache.kafka.streams.KafkaStreams;
import org.apache.kafka.streams.StreamsBuilder;
import org.apache.kafka.streams.KeyValue;
import org.apache.kafka.streams.StreamsConfig;
import org.apache.kafka.streams.kstream.Consumed;
import org.apache.kafka.streams.kstream.Grouped;
import org.apache.kafka.streams.kstream.KStream;
import org.apache.kafka.streams.kstream.Materialized;
import org.apache.kafka.streams.kstream.Produced;
import org.apache.kafka.streams.kstream.Suppressed;
import org.apache.kafka.streams.kstream.TimeWindows;
import org.apache.kafka.streams.processor.api.Processor;
import org.apache.kafka.streams.processor.api.ProcessorContext;
import org.apache.kafka.streams.processor.api.Record;
import org.apache.kafka.streams.state.KeyValueStore;
import org.apache.kafka.streams.state.Stores;

/**
 * The benchmark's Kafka Streams peer: input to output through the same transforms as exactly.
 *
 * <p>Arguments: bootstrap input[,input…] output application-id guarantee commit-interval-ms transform
 * [producer], where guarantee is exactly_once_v2 or at_least_once, transform is passthrough or enrich
 * (parse the millisecond "ts", add "dt" (ISO-8601) and "hr" (hour of day), drop "drop": what
 * exactly's jq program `.dt = (.ts / 1000 | todate) | .hr = (.ts / 3600000 | floor % 24) |
 * del(.drop)` does), and producer is shared (the default: the producer settings come from the
 * environment as exactly's do, so both systems run with the same ones) or own (Kafka Streams'
 * own producer defaults, to report against its best). Transform dedup is exactly's
 * `--window 1d` on the record timestamp and the Kafka key: the first record of each (UTC
 * day, key) goes on, through a persistent (RocksDB) key-value store with its changelog, the way
 * Kafka Streams users write it (it has no dedup operator: KIP-655). Transform count is
 * exactly's `--window 1d --aggregate count --aggregate-emit final`: the records per (UTC day,
 * key), each day's count once it closes (`windowedBy(…).count()` with
 * `suppress(untilWindowCloses)`), the grace from BENCH_WINDOW_GRACE_MS (default an hour).
 */
public final class Peer {
  private static final ObjectMapper JSON = new ObjectMapper();

  private Peer() {}

  static byte[] enrich(byte[] value) {
    try {
      ObjectNode o = (ObjectNode) JSON.readTree(value);
      long ts = o.get("ts").asLong();
      String dt = Instant.ofEpochMilli(ts - ts % 1000).toString();
      o.put("dt", dt);
      o.put("hr", (ts / 3_600_000L) % 24);
      o.remove("drop");
      return JSON.writeValueAsBytes(o);
    } catch (Exception e) {
      throw new IllegalArgumentException("not the benchmark's JSON", e);
    }
  }

  /** The first record of each (UTC day, key): a RocksDB store of the (day, key) seen. */
  static final class FirstPerDay implements Processor<byte[], byte[], byte[], byte[]> {
    private ProcessorContext<byte[], byte[]> context;
    private KeyValueStore<byte[], byte[]> seen;

    @Override
    public void init(ProcessorContext<byte[], byte[]> context) {
      this.context = context;
      this.seen = context.getStateStore("seen");
    }

    @Override
    public void process(Record<byte[], byte[]> r) {
      byte[] key = r.key() == null ? new byte[0] : r.key();
      long day = Math.floorDiv(r.timestamp(), 86_400_000L);
      byte[] k = java.nio.ByteBuffer.allocate(8 + key.length).putLong(day).put(key).array();
      if (seen.get(k) == null) {
        seen.put(k, new byte[] {1});
        context.forward(r);
      }
    }
  }

  public static void main(String[] args) throws Exception {
    boolean shared = args.length == 7 || (args.length == 8 && args[7].equals("shared"));
    if (!shared && !(args.length == 8 && args[7].equals("own"))) {
      System.err.println(
          "usage: Peer bootstrap input[,input...] output application-id guarantee commit-interval-ms"
              + " passthrough|enrich|dedup|count [shared|own]");
      System.exit(2);
    }
    Properties p = new Properties();
    p.put(StreamsConfig.BOOTSTRAP_SERVERS_CONFIG, args[0]);
    p.put(StreamsConfig.APPLICATION_ID_CONFIG, args[3]);
    p.put(StreamsConfig.PROCESSING_GUARANTEE_CONFIG, args[4]);
    p.put(StreamsConfig.COMMIT_INTERVAL_MS_CONFIG, Long.parseLong(args[5]));
    p.put(StreamsConfig.NUM_STREAM_THREADS_CONFIG, 1);
    p.put(StreamsConfig.STATE_DIR_CONFIG, System.getProperty("java.io.tmpdir") + "/kstreams-" + args[3]);
    p.put(StreamsConfig.consumerPrefix(ConsumerConfig.AUTO_OFFSET_RESET_CONFIG), "earliest");
    if (shared) {
      // The benchmark's producer settings, identical for every system.
      p.put(StreamsConfig.producerPrefix(ProducerConfig.LINGER_MS_CONFIG), env("BENCH_LINGER_MS"));
      p.put(
          StreamsConfig.producerPrefix(ProducerConfig.BATCH_SIZE_CONFIG), env("BENCH_BATCH_SIZE"));
      p.put(StreamsConfig.producerPrefix(ProducerConfig.ACKS_CONFIG), "all");
      p.put(
          StreamsConfig.producerPrefix(ProducerConfig.COMPRESSION_TYPE_CONFIG),
          env("BENCH_COMPRESSION"));
    }
    // BENCH_STREAMS_CONFIG="k=v;k=v": StreamsConfig entries last (enable.transactional.statestores
    // on 4.4+); a key this Kafka Streams does not know fails the start instead of a warning.
    String extra = System.getenv("BENCH_STREAMS_CONFIG");
    if (extra != null) {
      for (String kv : extra.split(";")) {
        if (kv.isBlank()) {
          continue;
        }
        int eq = kv.indexOf('=');
        String k = eq > 0 ? kv.substring(0, eq).trim() : "";
        boolean prefixed = k.matches("(main\\.|restore\\.|global\\.)?(consumer|producer|admin)\\..+");
        if (!prefixed && !StreamsConfig.configDef().names().contains(k)) {
          throw new IllegalArgumentException("BENCH_STREAMS_CONFIG: unknown here: " + kv);
        }
        p.put(k, kv.substring(eq + 1).trim());
      }
      System.err.println("BENCH_STREAMS_CONFIG applied: " + extra);
    }

    StreamsBuilder b = new StreamsBuilder();
    KStream<byte[], byte[]> in =
        b.stream(
            Arrays.asList(args[1].split(",")),
            Consumed.with(Serdes.ByteArray(), Serdes.ByteArray()));
    KStream<byte[], byte[]> out;
    if (args[6].equals("dedup")) {
      b.addStateStore(
          Stores.keyValueStoreBuilder(
              Stores.persistentKeyValueStore("seen"), Serdes.ByteArray(), Serdes.ByteArray()));
      out = in.process(FirstPerDay::new, "seen");
    } else if (args[6].equals("count")) {
      String g = System.getenv("BENCH_WINDOW_GRACE_MS");
      Duration grace = Duration.ofMillis(g == null ? 3_600_000L : Long.parseLong(g));
      out =
          in.groupByKey(Grouped.with(Serdes.ByteArray(), Serdes.ByteArray()))
              .windowedBy(TimeWindows.ofSizeAndGrace(Duration.ofDays(1), grace))
              .count(Materialized.with(Serdes.ByteArray(), Serdes.Long()))
              .suppress(Suppressed.untilWindowCloses(Suppressed.BufferConfig.unbounded()))
              .toStream()
              .map(
                  (w, n) -> {
                    String day = Instant.ofEpochMilli(w.window().start()).toString().substring(0, 10);
                    String key = new String(w.key(), StandardCharsets.UTF_8);
                    String v = "{\"window\":\"" + day + "\",\"group\":\"" + key + "\",\"count\":" + n + "}";
                    return KeyValue.pair(
                        ("[\"" + day + "\",\"" + key + "\"]").getBytes(StandardCharsets.UTF_8),
                        v.getBytes(StandardCharsets.UTF_8));
                  });
    } else {
      out = args[6].equals("enrich") ? in.mapValues(Peer::enrich) : in;
    }
    out.to(args[2], Produced.with(Serdes.ByteArray(), Serdes.ByteArray()));

    KafkaStreams streams = new KafkaStreams(b.build(), p);
    CountDownLatch done = new CountDownLatch(1);
    Runtime.getRuntime()
        .addShutdownHook(
            new Thread(
                () -> {
                  streams.close();
                  done.countDown();
                }));
    streams.start();
    done.await();
  }

  private static String env(String name) {
    String v = System.getenv(name);
    if (v == null) {
      throw new IllegalStateException(name + " is not set");
    }
    return v;
  }
}
