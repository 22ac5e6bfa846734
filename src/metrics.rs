//! Prometheus metrics: one registry, typed handles for the call sites.
//!
//! Names follow Prometheus conventions (`exactly_` prefix, base units, `_total` on counters).
//! Labels are bounded: topics, partitions, fixed reason and outcome names; never keys or
//! offsets.

use std::collections::HashSet;
use std::sync::{Arc, Mutex};

use prometheus::core::Collector;
use prometheus::{
    Gauge, Histogram, HistogramOpts, HistogramVec, IntCounter, IntCounterVec, IntGauge,
    IntGaugeVec, Opts, Registry,
};

/// Buckets of the histograms of a call's duration (the application's, the loop's blocking
/// calls): half a millisecond to half a minute.
const CALL_BUCKETS: [f64; 14] = [
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 10.0, 30.0,
];

/// Every metric exactly exports.
#[derive(Clone)]
pub struct Metrics {
    registry: Registry,
    /// Input records consumed in committed transactions, by topic and partition.
    pub records_consumed: IntCounterVec,
    /// Output records produced (committed or not), by topic.
    pub records_produced: IntCounterVec,
    /// Input records the transform turned into no output.
    pub records_filtered: IntCounter,
    /// Records written to the DLQ, by reason.
    pub records_dlq: IntCounterVec,
    /// Transactions ended, by outcome (committed, aborted); offsets-only ones apart.
    pub transactions: IntCounterVec,
    /// Transactions that committed only offsets (the group moved past transaction markers).
    pub offsets_only_commits: IntCounter,
    /// Aborted transactions, by reason.
    pub transaction_aborts: IntCounterVec,
    /// Time from send_offsets_to_transaction to the end of commit_transaction.
    pub commit_duration: Histogram,
    /// Input records per committed transaction.
    pub transaction_records: Histogram,
    /// Age of the open transaction, 0 when none is open.
    pub open_transaction_age: Gauge,
    /// Unix time of the last commit.
    pub last_commit_timestamp: Gauge,
    /// Rebalance events, by event (assign, revoke, lost).
    pub rebalances: IntCounterVec,
    /// Partitions this instance owns.
    pub assigned_partitions: IntGauge,
    /// Producer re-creations, by reason.
    pub producer_recreations: IntCounterVec,
    /// Starts and rewinds raised to what this process had committed in their partition: the
    /// group answered less (a broker that lost the group's offsets, or a reset made while this
    /// process was out of the group).
    pub committed_offsets_went_back: IntCounter,
    /// Claims whose starts could not be held (`events::ClaimUnchecked`).
    pub claims_unchecked: IntCounter,
    /// 1 when initialised and consuming.
    pub ready: IntGauge,
    /// How long the loop has been inside the transactional librdkafka call it is in; 0
    /// outside one.
    pub kafka_call_waiting: Gauge,
    /// `--stuck-call-timeout`: a librdkafka call inside that long ends the process (exit 4).
    pub stuck_call_timeout: Gauge,
    /// Time the loop spent inside each blocking call it names (librdkafka's transaction
    /// calls, flushes, database commits), by call: the phases of a commit.
    pub blocking_call_duration: HistogramVec,
    /// Last stable offset minus the next offset to process, per owned partition.
    pub consumer_lag: IntGaugeVec,
    /// High watermark minus last stable offset, per owned partition.
    pub partition_unstable: IntGaugeVec,
    /// Last stable offset, per owned partition: a hanging transaction holds it still.
    pub partition_last_stable: IntGaugeVec,
    /// Commit time minus input record timestamp.
    pub end_to_end_latency: Histogram,
    /// Calls to the application (--call-url), by outcome.
    pub calls: IntCounterVec,
    /// From sending a call to its decoded answer.
    pub call_duration: Histogram,
    /// Input records per call.
    pub call_records: Histogram,
    /// Calls out now.
    pub calls_in_flight: IntGauge,
    /// The dedup's decisions, by verdict (first, duplicate, late, full; aggregated: a record
    /// the aggregates took), aborted units' too.
    pub dedup_records: IntCounterVec,
    /// Keys held in the dedup's committed state.
    pub state_keys: IntGauge,
    /// Windows held in it (over the partitions owned).
    pub state_windows: IntGauge,
    /// Keys in the fullest window of one partition.
    pub state_window_keys_max: IntGauge,
    /// The most keys a window of one partition takes (`--window-max-keys`).
    pub state_window_keys_limit: IntGauge,
    /// Owned partitions whose records wait for their state to be read back.
    pub state_restoring: IntGauge,
    /// Owned partitions held: their state has no home (the input grew, the changelog could
    /// not).
    pub state_partitions_held: IntGauge,
    /// How long before its restore the state last read back was written.
    pub state_restored_age: Gauge,
    /// How old restored state may be before the changelog's retention may have deleted keys
    /// of windows still open: `--window-max-ahead` and a day.
    pub state_changelog_margin: Gauge,
    /// When (Unix seconds) a restore last read back state older than half of
    /// `state_changelog_margin`; 0: none since start.
    pub state_aged_restore_time: Gauge,
    /// Changelog records read back by restores.
    pub state_restored_records: IntCounter,
    /// Restores that did not reach the changelog's end.
    pub state_restore_failures: IntCounter,
    /// The database sink's rows, by outcome (written: in a committed transaction; refused:
    /// by the database, for what they hold).
    pub database_rows: IntCounterVec,
    /// From BEGIN to the COMMIT's answer, of the database sink's committed transactions.
    pub database_transaction_duration: Histogram,
    /// Partitions whose offset's compare-and-set matched no row (another instance claimed
    /// them): their transaction rolled back.
    pub database_fenced_partitions: IntCounter,
    /// Database calls that failed, by kind (conflict, lost, unreachable, setup, other).
    pub database_failures: IntCounterVec,
    /// Partitions the two gauges above were last set for, to drop the ones no longer owned.
    reported: Arc<Mutex<HashSet<(String, String)>>>,
    catalog: Vec<Family>,
}

/// One metric family, as registered.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Family {
    /// Full name, `exactly_` prefix included.
    pub name: String,
    /// `counter`, `gauge` or `histogram`.
    pub kind: &'static str,
    /// Label names (none for a plain counter, gauge or histogram).
    pub labels: Vec<String>,
}

/// Offsets of one owned partition, as librdkafka last saw them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PartitionOffsets {
    /// Topic.
    pub topic: String,
    /// Partition.
    pub partition: i32,
    /// High watermark.
    pub high_watermark: i64,
    /// Last stable offset: a read_committed consumer reads no further.
    pub last_stable: i64,
    /// Next offset the pipeline processes, if known.
    pub position: Option<i64>,
}

impl Metrics {
    /// Builds and registers every metric.
    pub fn new() -> Metrics {
        let registry = Registry::new_custom(Some("exactly".into()), None).expect("registry");
        let catalog = std::cell::RefCell::new(Vec::new());
        let register = |c: Box<dyn Collector>, kind: &'static str| {
            for d in c.desc() {
                catalog.borrow_mut().push(Family {
                    name: format!("exactly_{}", d.fq_name),
                    kind,
                    labels: d.variable_labels.clone(),
                });
            }
            registry.register(c).expect("register");
        };
        let counter_vec = |name: &str, help: &str, labels: &[&str]| {
            let c = IntCounterVec::new(Opts::new(name, help), labels).expect("metric");
            register(Box::new(c.clone()), "counter");
            c
        };
        let gauge = |name: &str, help: &str| {
            let g = IntGauge::new(name, help).expect("metric");
            register(Box::new(g.clone()), "gauge");
            g
        };
        let float_gauge = |name: &str, help: &str| {
            let g = Gauge::new(name, help).expect("metric");
            register(Box::new(g.clone()), "gauge");
            g
        };
        let histogram = |name: &str, help: &str, buckets: Vec<f64>| {
            let h = Histogram::with_opts(HistogramOpts::new(name, help).buckets(buckets))
                .expect("metric");
            register(Box::new(h.clone()), "histogram");
            h
        };
        let gauge_vec = |name: &str, help: &str, labels: &[&str]| {
            let g = IntGaugeVec::new(Opts::new(name, help), labels).expect("metric");
            register(Box::new(g.clone()), "gauge");
            g
        };
        let records_filtered = IntCounter::new(
            "records_filtered_total",
            "Input records that yielded no output.",
        )
        .expect("metric");
        register(Box::new(records_filtered.clone()), "counter");
        let plain_counter = |name: &str, help: &str| {
            let c = IntCounter::new(name, help).expect("metric");
            register(Box::new(c.clone()), "counter");
            c
        };
        let offsets_only_commits = IntCounter::new(
            "offsets_only_commits_total",
            "Transactions that committed offsets and no record: the group moving past \
             transaction markers of the input.",
        )
        .expect("metric");
        register(Box::new(offsets_only_commits.clone()), "counter");
        let build_info = gauge_vec(
            "build_info",
            "Version of exactly and of librdkafka.",
            &["version", "librdkafka"],
        );
        build_info
            .with_label_values(&[
                env!("CARGO_PKG_VERSION"),
                &crate::kafka::librdkafka_version(),
            ])
            .set(1);
        let mut metrics = Metrics {
            records_consumed: counter_vec(
                "records_consumed_total",
                "Input records consumed.",
                &["topic", "partition"],
            ),
            records_produced: counter_vec(
                "records_produced_total",
                "Output records handed to the producer inside transactions (aborted ones too).",
                &["topic"],
            ),
            records_filtered,
            records_dlq: counter_vec(
                "records_dlq_total",
                "Records written to the dead-letter topic.",
                &["reason"],
            ),
            transactions: counter_vec(
                "transactions_total",
                "Transactions ended, by outcome (offsets-only ones are counted apart).",
                &["outcome"],
            ),
            offsets_only_commits,
            transaction_aborts: counter_vec(
                "transaction_aborts_total",
                "Aborted transactions, by reason.",
                &["reason"],
            ),
            commit_duration: histogram(
                "transaction_commit_duration_seconds",
                "Time to send the offsets and commit a transaction.",
                vec![
                    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 10.0,
                ],
            ),
            transaction_records: histogram(
                "transaction_records",
                "Input records per committed transaction.",
                prometheus::exponential_buckets(1.0, 4.0, 10).expect("buckets"),
            ),
            open_transaction_age: float_gauge(
                "open_transaction_age_seconds",
                "Age of the open transaction; 0 when none is open.",
            ),
            last_commit_timestamp: float_gauge(
                "last_commit_timestamp_seconds",
                "Unix time of the last committed transaction.",
            ),
            rebalances: counter_vec("rebalances_total", "Rebalance events.", &["event"]),
            assigned_partitions: gauge("assigned_partitions", "Partitions this instance owns."),
            producer_recreations: counter_vec(
                "producer_recreations_total",
                "Transactional producers replaced, by reason.",
                &["reason"],
            ),
            committed_offsets_went_back: plain_counter(
                "committed_offsets_went_back_total",
                "Starts and rewinds of a partition raised to what this process had committed \
                 there: the group answered less (a broker that lost the group's offsets, or a \
                 reset made while this process was out of the group).",
            ),
            claims_unchecked: plain_counter(
                "claims_unchecked_total",
                "Claims of partitions this process had committed in whose starts could not be \
                 held: the group's committed offsets were unreadable in time, so they started \
                 where librdkafka's fetch said.",
            ),
            ready: gauge("ready", "1 when initialised and consuming."),
            kafka_call_waiting: float_gauge(
                "kafka_call_waiting_seconds",
                "How long the loop has been inside its current transactional librdkafka call; \
                 0 outside one.",
            ),
            stuck_call_timeout: float_gauge(
                "stuck_call_timeout_seconds",
                "--stuck-call-timeout: past it inside one librdkafka call, exactly exits 4.",
            ),
            blocking_call_duration: {
                let h = HistogramVec::new(
                    HistogramOpts::new(
                        "blocking_call_duration_seconds",
                        "Time the loop spent inside a blocking call, by call: \
                         send_offsets_to_transaction, flush, commit_transaction and the others.",
                    )
                    .buckets(CALL_BUCKETS.to_vec()),
                    &["call"],
                )
                .expect("metric");
                register(Box::new(h.clone()), "histogram");
                h
            },
            consumer_lag: gauge_vec(
                "consumer_lag_records",
                "Last stable offset minus the next offset to process, per owned partition.",
                &["topic", "partition"],
            ),
            partition_unstable: gauge_vec(
                "partition_unstable_records",
                "High watermark minus last stable offset, per owned partition: records of \
                 transactions still open upstream.",
                &["topic", "partition"],
            ),
            partition_last_stable: gauge_vec(
                "partition_last_stable_offset",
                "Last stable offset, per owned partition.",
                &["topic", "partition"],
            ),
            end_to_end_latency: histogram(
                "end_to_end_latency_seconds",
                "Commit time minus the input record's timestamp.",
                vec![
                    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
                    300.0,
                ],
            ),
            calls: counter_vec(
                "calls_total",
                "Calls to the application behind --call-url, by outcome.",
                &["outcome"],
            ),
            call_duration: histogram(
                "call_duration_seconds",
                "From sending a batch to the application to its decoded answer.",
                CALL_BUCKETS.to_vec(),
            ),
            call_records: histogram(
                "call_records",
                "Input records per call to the application.",
                prometheus::exponential_buckets(1.0, 4.0, 10).expect("buckets"),
            ),
            calls_in_flight: gauge(
                "calls_in_flight",
                "Calls to the application sent and not yet answered.",
            ),
            dedup_records: counter_vec(
                "dedup_records_total",
                "The dedup's decisions, by verdict (aborted transactions' too).",
                &["verdict"],
            ),
            database_rows: counter_vec(
                "database_rows_total",
                "The database sink's rows, by outcome: written (committed), refused (by the \
                 database, for what they hold).",
                &["outcome"],
            ),
            database_transaction_duration: histogram(
                "database_transaction_duration_seconds",
                "From BEGIN to the COMMIT's answer, of the database sink's committed \
                 transactions.",
                vec![
                    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 10.0,
                ],
            ),
            database_fenced_partitions: plain_counter(
                "database_fenced_partitions_total",
                "Partitions whose offset's compare-and-set matched no row: another instance \
                 claimed them, and the transaction rolled back.",
            ),
            database_failures: counter_vec(
                "database_failures_total",
                "The database sink's failed calls, by kind: conflict (a deadlock, a \
                 serialization failure, a lock wait), lost (the connection), unreachable (a \
                 connection not made), setup (a table, a column, a permission), other.",
                &["kind"],
            ),
            state_keys: gauge("state_keys", "Keys held in the dedup's committed state."),
            state_windows: gauge("state_windows", "Windows held in the dedup's state."),
            state_window_keys_max: gauge(
                "state_window_keys_max",
                "Keys in the dedup's fullest window of one partition.",
            ),
            state_window_keys_limit: gauge(
                "state_window_keys_limit",
                "The most keys a dedup window of one partition takes (--window-max-keys).",
            ),
            state_restoring: gauge(
                "state_restoring_partitions",
                "Owned partitions whose records wait for their dedup state to be read back.",
            ),
            state_partitions_held: gauge(
                "state_partitions_held",
                "Owned partitions held: the input grew and the changelog could not; their \
                 records wait.",
            ),
            state_restored_age: float_gauge(
                "state_restored_age_seconds",
                "How long before it was read back the state of the last partition restored was \
                 written.",
            ),
            state_changelog_margin: float_gauge(
                "state_changelog_margin_seconds",
                "How old restored state may be before the changelog's retention may have \
                 deleted keys of windows still open (--window-max-ahead and a day).",
            ),
            state_aged_restore_time: float_gauge(
                "state_aged_restore_timestamp_seconds",
                "When (Unix time) a restore last read back state older than half of \
                 state_changelog_margin_seconds; 0: none since start.",
            ),
            state_restored_records: plain_counter(
                "state_restored_records_total",
                "Changelog records read back by restores.",
            ),
            state_restore_failures: plain_counter(
                "state_restore_failures_total",
                "Restores that did not reach the changelog's end (tried again).",
            ),
            reported: Arc::default(),
            registry,
            catalog: Vec::new(),
        };
        for verdict in ["first", "duplicate", "late", "full", "aggregated"] {
            metrics.dedup_records.with_label_values(&[verdict]);
        }
        metrics.catalog = catalog.into_inner();
        metrics
    }

    /// Every family: name, type and label names (the docs are checked against this).
    pub fn catalog(&self) -> &[Family] {
        &self.catalog
    }

    /// Sets the lag and unstable-records gauges of the owned partitions, and removes those of
    /// partitions no longer owned.
    pub fn set_partition_offsets(&self, partitions: &[PartitionOffsets]) {
        let mut reported = self.reported.lock().unwrap_or_else(|p| p.into_inner());
        let mut now = HashSet::with_capacity(partitions.len());
        for p in partitions {
            let labels = (p.topic.clone(), p.partition.to_string());
            let values = [labels.0.as_str(), labels.1.as_str()];
            self.partition_unstable
                .with_label_values(&values)
                .set((p.high_watermark - p.last_stable).max(0));
            self.partition_last_stable
                .with_label_values(&values)
                .set(p.last_stable);
            match p.position {
                Some(pos) => self
                    .consumer_lag
                    .with_label_values(&values)
                    .set((p.last_stable - pos).max(0)),
                None => {
                    let _ = self.consumer_lag.remove_label_values(&values);
                }
            }
            now.insert(labels);
        }
        for (t, p) in reported.difference(&now) {
            let _ = self.consumer_lag.remove_label_values(&[t, p]);
            let _ = self.partition_unstable.remove_label_values(&[t, p]);
            let _ = self.partition_last_stable.remove_label_values(&[t, p]);
        }
        *reported = now;
    }

    /// The text exposition of every metric.
    pub fn render(&self) -> String {
        let mut out = String::new();
        let encoder = prometheus::TextEncoder::new();
        if let Err(e) = encoder.encode_utf8(&self.registry.gather(), &mut out) {
            tracing::warn!(error = %e, "encoding metrics");
        }
        out
    }
}

/// The per-record counter, looked up once per topic instead of per record: a labelled look-up
/// hashes the label values. (Records consumed, filtered and dead-lettered are counted per
/// transaction, when it commits.)
#[derive(Default)]
pub struct RecordCounters {
    produced: foldhash::HashMap<String, IntCounter>,
}

impl RecordCounters {
    /// `exactly_records_produced_total{topic}`.
    pub fn produced(&mut self, m: &Metrics, topic: &str) -> &IntCounter {
        if !self.produced.contains_key(topic) {
            let c = m.records_produced.with_label_values(&[topic]);
            self.produced.insert(topic.to_string(), c);
        }
        &self.produced[topic]
    }
}

impl Default for Metrics {
    fn default() -> Self {
        Metrics::new()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_prefixed_names_with_help() {
        let m = Metrics::new();
        m.records_consumed.with_label_values(&["in", "0"]).inc_by(3);
        m.transaction_aborts
            .with_label_values(&["test_injected"])
            .inc();
        m.commit_duration.observe(0.004);
        let text = m.render();
        assert!(
            text.contains("exactly_records_consumed_total{partition=\"0\",topic=\"in\"} 3"),
            "{text}"
        );
        assert!(text.contains("exactly_transaction_aborts_total{reason=\"test_injected\"} 1"));
        assert!(text.contains("# HELP exactly_transaction_commit_duration_seconds"));
        assert!(text.contains("exactly_build_info{librdkafka="));
        // Fixed labels exist before their first event: events::initialise, tested there.
    }

    #[test]
    fn cached_counters_are_the_registered_ones() {
        let m = Metrics::new();
        let mut c = RecordCounters::default();
        c.produced(&m, "out").inc();
        c.produced(&m, "out").inc_by(2);
        let text = m.render();
        assert!(text.contains(r#"exactly_records_produced_total{topic="out"} 3"#));
    }

    #[test]
    fn lag_is_against_the_last_stable_offset_and_revoked_partitions_disappear() {
        let m = Metrics::new();
        let at = |p, hw, lso, pos| PartitionOffsets {
            topic: "in".into(),
            partition: p,
            high_watermark: hw,
            last_stable: lso,
            position: pos,
        };
        m.set_partition_offsets(&[at(0, 100, 90, Some(40)), at(1, 7, 7, None)]);
        let text = m.render();
        assert!(text.contains(r#"exactly_consumer_lag_records{partition="0",topic="in"} 50"#));
        assert!(
            text.contains(r#"exactly_partition_unstable_records{partition="0",topic="in"} 10"#)
        );
        assert!(text.contains(r#"exactly_partition_unstable_records{partition="1",topic="in"} 0"#));
        assert!(
            !text.contains(r#"exactly_consumer_lag_records{partition="1""#),
            "{text}"
        );
        m.set_partition_offsets(&[at(1, 9, 9, Some(9))]);
        let text = m.render();
        assert!(!text.contains(r#"partition="0""#), "{text}");
        assert!(text.contains(r#"exactly_consumer_lag_records{partition="1",topic="in"} 0"#));
    }
}
