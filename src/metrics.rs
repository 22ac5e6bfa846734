//! Prometheus metrics: one registry, typed handles for the call sites.
//!
//! Names follow Prometheus conventions (`exactly_` prefix, base units, `_total` on counters).
//! Labels are bounded: topics, partitions, fixed reason and outcome names; never keys or
//! offsets.

use prometheus::{
    Gauge, Histogram, HistogramOpts, IntCounter, IntCounterVec, IntGauge, IntGaugeVec, Opts,
    Registry,
};

/// Every metric exactly exports.
#[derive(Clone)]
pub struct Metrics {
    registry: Registry,
    /// Input records consumed, by topic and partition.
    pub records_consumed: IntCounterVec,
    /// Output records produced (committed or not), by topic.
    pub records_produced: IntCounterVec,
    /// Input records the transform turned into no output.
    pub records_filtered: IntCounter,
    /// Records written to the DLQ, by reason.
    pub records_dlq: IntCounterVec,
    /// Transactions ended, by outcome (committed, aborted).
    pub transactions: IntCounterVec,
    /// Aborted transactions, by reason.
    pub transaction_aborts: IntCounterVec,
    /// Time from send_offsets_to_transaction to the end of commit_transaction.
    pub commit_duration: Histogram,
    /// Input records per committed transaction.
    pub transaction_records: Histogram,
    /// Age of the open transaction, 0 when none is open.
    pub open_transaction_age: Gauge,
    /// Unix time of the last commit.
    pub last_commit_timestamp: IntGauge,
    /// Rebalance events, by event (assign, revoke, lost).
    pub rebalances: IntCounterVec,
    /// Partitions this instance owns.
    pub assigned_partitions: IntGauge,
    /// Producer re-creations, by reason.
    pub producer_recreations: IntCounterVec,
    /// 1 when initialised and consuming.
    pub ready: IntGauge,
    /// Records read from a partition minus its last stable offset, per owned partition.
    pub consumer_lag: IntGaugeVec,
}

impl Metrics {
    /// Builds and registers every metric.
    pub fn new() -> Metrics {
        let registry = Registry::new_custom(Some("exactly".into()), None).expect("registry");
        let counter_vec = |name: &str, help: &str, labels: &[&str]| {
            let c = IntCounterVec::new(Opts::new(name, help), labels).expect("metric");
            registry.register(Box::new(c.clone())).expect("register");
            c
        };
        let gauge = |name: &str, help: &str| {
            let g = IntGauge::new(name, help).expect("metric");
            registry.register(Box::new(g.clone())).expect("register");
            g
        };
        let histogram = |name: &str, help: &str, buckets: Vec<f64>| {
            let h = Histogram::with_opts(HistogramOpts::new(name, help).buckets(buckets))
                .expect("metric");
            registry.register(Box::new(h.clone())).expect("register");
            h
        };
        let records_filtered = IntCounter::new(
            "records_filtered_total",
            "Input records that yielded no output.",
        )
        .expect("metric");
        registry
            .register(Box::new(records_filtered.clone()))
            .expect("register");
        let consumer_lag = IntGaugeVec::new(
            Opts::new(
                "consumer_lag_records",
                "Last stable offset minus the next offset to consume, per owned partition.",
            ),
            &["topic", "partition"],
        )
        .expect("metric");
        registry
            .register(Box::new(consumer_lag.clone()))
            .expect("register");
        let build_info = IntGaugeVec::new(
            Opts::new("build_info", "Version of exactly and of librdkafka."),
            &["version", "librdkafka"],
        )
        .expect("metric");
        registry
            .register(Box::new(build_info.clone()))
            .expect("register");
        build_info
            .with_label_values(&[
                env!("CARGO_PKG_VERSION"),
                &rdkafka::util::get_rdkafka_version().1,
            ])
            .set(1);
        Metrics {
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
                "Transactions ended, by outcome.",
                &["outcome"],
            ),
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
            open_transaction_age: {
                let g = Gauge::new(
                    "open_transaction_age_seconds",
                    "Age of the open transaction; 0 when none is open.",
                )
                .expect("metric");
                registry.register(Box::new(g.clone())).expect("register");
                g
            },
            last_commit_timestamp: gauge(
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
            ready: gauge("ready", "1 when initialised and consuming."),
            consumer_lag,
            registry,
        }
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
    }
}
