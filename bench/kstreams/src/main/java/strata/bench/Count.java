// Kafka Streams' count() on the input of bench/worker.ts, one phase of that bench (it builds and starts this program).
//
// Reads the source topic (String keys, byte[] values), groupByKey() (no repartition: the keys are unchanged) and
// count()s into a store named "counts": an in-memory store or Kafka Streams' default RocksDB store, with its
// compacted changelog (the brokers' default replication, acks=all). Commits every commit.interval.ms (1000) with the
// processing guarantee given. A processValues() step before the grouping sees every record: it notes the time of the
// first and, once as many records as the source holds were seen, asks for a commit (ProcessorContext.commit), so
// the last commit comes at once rather than up to a commit interval later.
//
// Done when the group's committed offsets (read with requireStable, so an open transaction's offsets are waited
// for) equal the source's highwaters on every partition: every record processed and committed. Timed from the
// first record seen to then; CPU (the whole JVM, and the stream thread alone) from just before start() to then,
// as bench/worker.ts times the Worker. Then, untimed: every count in the store written to a file, one
// "key<TAB>count" line each, for bench/worker.ts to check; the client closed and its local state removed.
//
// Arguments, name=value: broker, source, app (application.id), store (memory | rocksdb), guarantee (at_least_once |
// exactly_once_v2), partitions, records (the source's record count), stateDir, countsFile, cacheBytes
// (statestore.cache.max.bytes), threads (num.stream.threads).
// Prints one line on stdout: KSTREAMS-RESULT {"ms":..,"joinMs":..,"cpuMs":..,"mainCpuMs":..,"peakRssMB":..,"commits":..}
package strata.bench;

import java.io.BufferedWriter;
import java.io.IOException;
import java.lang.management.ManagementFactory;
import java.lang.management.ThreadMXBean;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.time.Duration;
import java.util.HashMap;
import java.util.Map;
import java.util.Properties;
import java.util.concurrent.atomic.AtomicLong;
import java.util.concurrent.atomic.AtomicReference;
import org.apache.kafka.clients.admin.Admin;
import org.apache.kafka.clients.admin.AdminClientConfig;
import org.apache.kafka.clients.admin.ListConsumerGroupOffsetsOptions;
import org.apache.kafka.clients.admin.OffsetSpec;
import org.apache.kafka.clients.consumer.ConsumerConfig;
import org.apache.kafka.clients.consumer.OffsetAndMetadata;
import org.apache.kafka.clients.producer.ProducerConfig;
import org.apache.kafka.common.Metric;
import org.apache.kafka.common.MetricName;
import org.apache.kafka.common.TopicPartition;
import org.apache.kafka.common.serialization.Serdes;
import org.apache.kafka.common.utils.Bytes;
import org.apache.kafka.streams.KafkaStreams;
import org.apache.kafka.streams.KeyValue;
import org.apache.kafka.streams.StoreQueryParameters;
import org.apache.kafka.streams.StreamsBuilder;
import org.apache.kafka.streams.StreamsConfig;
import org.apache.kafka.streams.errors.StreamsUncaughtExceptionHandler;
import org.apache.kafka.streams.kstream.Consumed;
import org.apache.kafka.streams.kstream.Grouped;
import org.apache.kafka.streams.kstream.Materialized;
import org.apache.kafka.streams.processor.api.FixedKeyProcessor;
import org.apache.kafka.streams.processor.api.FixedKeyProcessorContext;
import org.apache.kafka.streams.processor.api.FixedKeyRecord;
import org.apache.kafka.streams.state.KeyValueIterator;
import org.apache.kafka.streams.state.KeyValueStore;
import org.apache.kafka.streams.state.QueryableStoreTypes;
import org.apache.kafka.streams.state.ReadOnlyKeyValueStore;
import org.apache.kafka.streams.state.Stores;

public final class Count {
  private static final String STORE = "counts";
  private static final long COMMIT_MS = 1000;

  /** Records seen by the counting topology (every task), and when the first one was seen (nanoTime, 0: none yet). */
  private static final AtomicLong SEEN = new AtomicLong();

  private static final AtomicLong FIRST_AT = new AtomicLong();

  private Count() {}

  /** Notes each record on its way to the count and asks for a commit once every source record was seen. */
  private static final class Watch implements FixedKeyProcessor<String, byte[], byte[]> {
    private final long records;
    private FixedKeyProcessorContext<String, byte[]> context;

    Watch(long records) {
      this.records = records;
    }

    @Override
    public void init(FixedKeyProcessorContext<String, byte[]> context) {
      this.context = context;
    }

    @Override
    public void process(FixedKeyRecord<String, byte[]> record) {
      FIRST_AT.compareAndSet(0, System.nanoTime());
      context.forward(record);
      if (SEEN.incrementAndGet() >= records) context.commit();
    }
  }

  public static void main(String[] argv) throws Exception {
    Map<String, String> args = new HashMap<>();
    for (String a : argv) {
      int eq = a.indexOf('=');
      if (eq < 0) throw new IllegalArgumentException("expected name=value, got " + a);
      args.put(a.substring(0, eq), a.substring(eq + 1));
    }
    String broker = arg(args, "broker");
    String source = arg(args, "source");
    String app = arg(args, "app");
    String store = arg(args, "store");
    int partitions = Integer.parseInt(arg(args, "partitions"));
    long records = Long.parseLong(arg(args, "records"));

    Properties props = new Properties();
    props.put(StreamsConfig.APPLICATION_ID_CONFIG, app);
    props.put(StreamsConfig.BOOTSTRAP_SERVERS_CONFIG, broker);
    props.put(StreamsConfig.PROCESSING_GUARANTEE_CONFIG, arg(args, "guarantee"));
    props.put(StreamsConfig.COMMIT_INTERVAL_MS_CONFIG, COMMIT_MS);
    props.put(StreamsConfig.NUM_STREAM_THREADS_CONFIG, Integer.parseInt(arg(args, "threads")));
    props.put(StreamsConfig.STATESTORE_CACHE_MAX_BYTES_CONFIG, Long.parseLong(arg(args, "cacheBytes")));
    props.put(StreamsConfig.STATE_DIR_CONFIG, arg(args, "stateDir"));
    // The changelog as the Worker's: the brokers' default replication, written with acks=all.
    props.put(StreamsConfig.REPLICATION_FACTOR_CONFIG, -1);
    props.put(StreamsConfig.producerPrefix(ProducerConfig.ACKS_CONFIG), "all");
    props.put(StreamsConfig.consumerPrefix(ConsumerConfig.AUTO_OFFSET_RESET_CONFIG), "earliest");

    StreamsBuilder builder = new StreamsBuilder();
    Materialized<String, Long, KeyValueStore<Bytes, byte[]>> materialized =
        switch (store) {
          case "memory" -> Materialized.as(Stores.inMemoryKeyValueStore(STORE));
          // The DSL's default store: RocksDB (timestamped).
          case "rocksdb" -> Materialized.as(STORE);
          default -> throw new IllegalArgumentException("store: memory or rocksdb, got " + store);
        };
    builder.stream(source, Consumed.with(Serdes.String(), Serdes.ByteArray()))
        .processValues(() -> new Watch(records))
        .groupByKey(Grouped.with(Serdes.String(), Serdes.ByteArray()))
        .count(materialized.withKeySerde(Serdes.String()).withValueSerde(Serdes.Long()));

    AtomicReference<Throwable> failure = new AtomicReference<>();
    try (Admin admin = Admin.create(Map.of(AdminClientConfig.BOOTSTRAP_SERVERS_CONFIG, broker));
        KafkaStreams streams = new KafkaStreams(builder.build(), props)) {
      Map<TopicPartition, Long> highwaters = highwaters(admin, source, partitions);
      streams.setUncaughtExceptionHandler(
          e -> {
            failure.compareAndSet(null, e);
            return StreamsUncaughtExceptionHandler.StreamThreadExceptionResponse.SHUTDOWN_CLIENT;
          });

      com.sun.management.OperatingSystemMXBean os =
          (com.sun.management.OperatingSystemMXBean) ManagementFactory.getOperatingSystemMXBean();
      long cpu0 = os.getProcessCpuTime();
      long t0 = System.nanoTime();
      streams.start();
      Map<Long, Long> threadCpu0 = streamThreadCpu();
      ListConsumerGroupOffsetsOptions stable = new ListConsumerGroupOffsetsOptions().requireStable(true);
      while (true) {
        if (failure.get() != null) throw new RuntimeException("the stream thread failed", failure.get());
        KafkaStreams.State state = streams.state();
        if (state == KafkaStreams.State.ERROR || state == KafkaStreams.State.NOT_RUNNING)
          throw new IllegalStateException("Kafka Streams stopped: " + state);
        if (threadCpu0.isEmpty()) threadCpu0 = streamThreadCpu();
        if (SEEN.get() >= records && committedAll(admin, app, stable, highwaters)) break;
        Thread.sleep(20);
      }
      long t1 = System.nanoTime();
      long cpu1 = os.getProcessCpuTime();
      long mainCpu = 0;
      for (Map.Entry<Long, Long> e : streamThreadCpu().entrySet())
        mainCpu += e.getValue() - threadCpu0.getOrDefault(e.getKey(), 0L);
      long commits = commitTotal(streams);

      // Untimed: the counts, for the bench to check.
      ReadOnlyKeyValueStore<String, Long> counts =
          streams.store(StoreQueryParameters.fromNameAndType(STORE, QueryableStoreTypes.keyValueStore()));
      try (BufferedWriter out = Files.newBufferedWriter(Path.of(arg(args, "countsFile")), StandardCharsets.UTF_8);
          KeyValueIterator<String, Long> all = counts.all()) {
        while (all.hasNext()) {
          KeyValue<String, Long> kv = all.next();
          out.write(kv.key + "\t" + kv.value + "\n");
        }
      }
      long firstAt = FIRST_AT.get();
      String result =
          String.format(
              "{\"ms\":%.3f,\"joinMs\":%.3f,\"cpuMs\":%.3f,\"mainCpuMs\":%.3f,\"peakRssMB\":%d,\"commits\":%d}",
              (t1 - firstAt) / 1e6,
              (firstAt - t0) / 1e6,
              (cpu1 - cpu0) / 1e6,
              mainCpu / 1e6,
              peakRssMB(),
              commits);
      streams.close(Duration.ofSeconds(60));
      streams.cleanUp();
      System.out.println("KSTREAMS-RESULT " + result);
      System.out.flush();
    }
    System.exit(0);
  }

  private static String arg(Map<String, String> args, String name) {
    String v = args.get(name);
    if (v == null) throw new IllegalArgumentException("missing argument " + name + "=...");
    return v;
  }

  private static Map<TopicPartition, Long> highwaters(Admin admin, String topic, int partitions) throws Exception {
    Map<TopicPartition, OffsetSpec> latest = new HashMap<>();
    for (int p = 0; p < partitions; p++) latest.put(new TopicPartition(topic, p), OffsetSpec.latest());
    Map<TopicPartition, Long> out = new HashMap<>();
    admin.listOffsets(latest).all().get().forEach((tp, info) -> out.put(tp, info.offset()));
    return out;
  }

  /** Whether the group committed every partition's highwater (a partition with no record needs none). */
  private static boolean committedAll(
      Admin admin, String group, ListConsumerGroupOffsetsOptions options, Map<TopicPartition, Long> highwaters)
      throws Exception {
    Map<TopicPartition, OffsetAndMetadata> committed =
        admin.listConsumerGroupOffsets(group, options).partitionsToOffsetAndMetadata().get();
    for (Map.Entry<TopicPartition, Long> e : highwaters.entrySet()) {
      if (e.getValue() == 0) continue;
      OffsetAndMetadata c = committed.get(e.getKey());
      if (c == null || c.offset() < e.getValue()) return false;
    }
    return true;
  }

  /** CPU time (ns) of each live stream thread, by thread id. */
  private static Map<Long, Long> streamThreadCpu() {
    ThreadMXBean mx = ManagementFactory.getThreadMXBean();
    Map<Long, Long> out = new HashMap<>();
    for (Thread t : Thread.getAllStackTraces().keySet()) {
      if (t.getName().contains("-StreamThread-")) out.put(t.getId(), mx.getThreadCpuTime(t.getId()));
    }
    return out;
  }

  /** The stream threads' commit-total metrics, added up. */
  private static long commitTotal(KafkaStreams streams) {
    long total = 0;
    for (Map.Entry<MetricName, ? extends Metric> e : streams.metrics().entrySet()) {
      MetricName n = e.getKey();
      if (n.name().equals("commit-total") && n.group().equals("stream-thread-metrics")) {
        Object v = e.getValue().metricValue();
        if (v instanceof Number num) total += num.longValue();
      }
    }
    return total;
  }

  /** The JVM's peak resident set (VmHWM), in MiB. */
  private static long peakRssMB() throws IOException {
    for (String line : Files.readAllLines(Path.of("/proc/self/status"))) {
      if (line.startsWith("VmHWM:")) return Long.parseLong(line.replaceAll("[^0-9]", "")) / 1024;
    }
    return -1;
  }
}
