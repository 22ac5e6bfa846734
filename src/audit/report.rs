//! What the audit read ([`History`]) and what it found ([`Report`]), with the human summary.

use std::collections::BTreeMap;

use serde::Serialize;

use super::Rec;

/// High watermark and last stable offset of one partition, at the start and end of the audit.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct PartitionState {
    /// Topic.
    pub topic: String,
    /// Partition.
    pub partition: i32,
    /// High watermark at the start.
    pub high_watermark: i64,
    /// Last stable offset at the start.
    pub last_stable_offset: i64,
    /// Last stable offset at the end.
    pub last_stable_offset_at_end: i64,
    /// High watermark at the end.
    pub high_watermark_at_end: i64,
}

impl PartitionState {
    /// Records written but not yet decided (high watermark − last stable offset), at the end.
    pub fn unstable(&self) -> i64 {
        self.high_watermark_at_end - self.last_stable_offset_at_end
    }

    /// A transaction held the partition unstable for the whole audit without progress.
    pub fn hanging(&self) -> bool {
        self.unstable() > 0
            && self.last_stable_offset < self.high_watermark
            && self.last_stable_offset_at_end == self.last_stable_offset
    }
}

/// The audited range of each input partition: [start, end).
pub type Range = BTreeMap<(String, i32), (i64, i64)>;

/// Everything the audit read.
#[derive(Clone, Debug, Default)]
pub struct History {
    /// Input records before the range, from the start of each partition: read only for a
    /// stateful replay (the dedup), never judged.
    pub earlier: Vec<Rec>,
    /// Input partitions whose start is gone (low watermark above 0: retention), read for a
    /// stateful replay: topic, partition, low watermark.
    pub truncated: Vec<(String, i32, i64)>,
    /// Input records in the audited range, read_committed.
    pub inputs: Vec<Rec>,
    /// Audited range per input partition: [start, end).
    pub range: Range,
    /// Output records, read_committed, all output topics.
    pub outputs: Vec<Rec>,
    /// DLQ records, read_committed.
    pub dlq: Vec<Rec>,
    /// The outputs are a database table's rows (`table`): no values, no order; the
    /// database compares them.
    pub rows: bool,
    /// Records of the output and DLQ topics that only read_uncommitted sees (aborted).
    pub aborted: usize,
    /// The group's committed offsets on the input, if a group was given.
    pub committed: Option<BTreeMap<(String, i32), i64>>,
    /// Partition states of every audited topic.
    pub partitions: Vec<PartitionState>,
}

/// What the audit found. Counts are of records.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct Report {
    /// The transform was replayed (false: accounted by lineage alone, expected counts unknown).
    pub replayed: bool,
    /// Input records in the audited range.
    pub inputs: usize,
    /// Inputs beyond the group's committed offsets: not processed yet, so not judged.
    pub pending: usize,
    /// Inputs before the range replayed for the dedup's state (what came first), not judged.
    pub replayed_before_range: usize,
    /// Judged inputs the replay gives nothing for (a program's `empty`; for the dedup, a
    /// later record of a (window, key), or a late one dropped): none of them may be in the
    /// output or the DLQ.
    pub dropped: usize,
    /// Outputs the replayed transform expects for the judged inputs.
    pub expected_outputs: usize,
    /// DLQ records it expects.
    pub expected_dlq: usize,
    /// Inputs whose outputs the broker rejected (DLQ reason `rejected_by_broker`): expected in
    /// the DLQ instead of the output, since no replay can tell what a broker will refuse.
    pub rejected_by_broker: usize,
    /// Inputs whose outputs were routed to a topic that kept refusing them (DLQ reason
    /// `route_refused`): expected in the DLQ too, since no replay can tell what a cluster
    /// refused then.
    pub route_refused: usize,
    /// Outputs read that belong to the audited range.
    pub outputs: usize,
    /// DLQ records read that belong to the audited range.
    pub dlq: usize,
    /// Expected outputs or DLQ records that are missing.
    pub lost: usize,
    /// A database table's rows replaced by a later output of the same key (an upsert): not
    /// lost, and not an anomaly.
    pub overwritten: usize,
    /// Extra copies of an output or DLQ record.
    pub duplicated: usize,
    /// Outputs or DLQ records the transform does not give for their input.
    pub unexpected: usize,
    /// Inputs with records in both the output and the DLQ.
    pub in_output_and_dlq: usize,
    /// Outputs of one source partition out of order on an output partition.
    pub order_violations: usize,
    /// Output or DLQ records without a lineage header.
    pub without_lineage: usize,
    /// Records only read_uncommitted sees: aborted transactions. Expected; not an anomaly.
    pub aborted: usize,
    /// The group's committed offsets reached the end of the audited range (None: no group).
    pub group_reached_end: Option<bool>,
    /// Partitions held unstable by a transaction that did not move during the audit.
    pub hanging_partitions: usize,
    /// High watermark and last stable offset of every audited partition.
    pub partitions: Vec<PartitionState>,
    /// The first anomalies, described.
    pub examples: Vec<String>,
    /// What the audit could not know, which may make anomalies of what is not one.
    pub caveats: Vec<String>,
}

impl Report {
    /// Number of anomalies: anything here means the pipeline did not deliver exactly once.
    pub fn anomalies(&self) -> usize {
        self.lost
            + self.duplicated
            + self.unexpected
            + self.in_output_and_dlq
            + self.order_violations
            + self.without_lineage
            + self.hanging_partitions
    }

    pub(crate) fn note(&mut self, what: String) {
        if self.examples.len() < 20 {
            self.examples.push(what);
        }
    }

    /// The human summary.
    pub fn summary(&self) -> String {
        let mut s = String::new();
        let mut line = |k: &str, v: String| s.push_str(&format!("{k:<28}{v}\n"));
        self.counts(&mut line);
        self.findings(&mut line);
        for e in &self.examples {
            s.push_str(&format!("  ! {e}\n"));
        }
        for c in &self.caveats {
            s.push_str(&format!("  ? {c}\n"));
        }
        s.push_str(&if self.anomalies() == 0 {
            "result: CLEAN, exactly once\n".to_string()
        } else {
            format!("result: {} ANOMALIES\n", self.anomalies())
        });
        s
    }

    /// The summary's lines of what was read and expected.
    fn counts(&self, line: &mut impl FnMut(&str, String)) {
        line("inputs audited", self.inputs.to_string());
        line("  pending (not committed)", self.pending.to_string());
        if self.replayed_before_range > 0 {
            line(
                "  replayed before range",
                format!("{} (for the dedup's state)", self.replayed_before_range),
            );
        }
        line(
            "  dropped by the transform",
            match self.replayed {
                true => format!("{} (no output, no DLQ record)", self.dropped),
                false => "– (not replayed)".into(),
            },
        );
        let expected = |n: usize| match self.replayed {
            true => n.to_string(),
            false => "– (not replayed)".into(),
        };
        line(
            "outputs expected / read",
            format!("{} / {}", expected(self.expected_outputs), self.outputs),
        );
        line(
            "DLQ expected / read",
            format!("{} / {}", expected(self.expected_dlq), self.dlq),
        );
        line(
            "  rejected by broker",
            format!(
                "{} (their DLQ copies stand in for outputs)",
                self.rejected_by_broker
            ),
        );
        line(
            "  route refused",
            format!(
                "{} (their DLQ copies stand in for outputs)",
                self.route_refused
            ),
        );
    }

    /// The summary's lines of what was found.
    fn findings(&self, line: &mut impl FnMut(&str, String)) {
        line("lost", self.lost.to_string());
        if self.overwritten > 0 {
            line(
                "  overwritten (upserts)",
                format!("{} (a later output of the same key)", self.overwritten),
            );
        }
        line("duplicated", self.duplicated.to_string());
        line("unexpected", self.unexpected.to_string());
        line("in output and DLQ", self.in_output_and_dlq.to_string());
        line("order violations", self.order_violations.to_string());
        line("without lineage", self.without_lineage.to_string());
        line(
            "aborted (read_uncommitted)",
            format!("{} (expected, not an anomaly)", self.aborted),
        );
        line(
            "group reached end of range",
            match self.group_reached_end {
                Some(true) => "yes".into(),
                Some(false) => "no".into(),
                None => "not checked (no --group-id)".into(),
            },
        );
        let unstable: Vec<String> = self
            .partitions
            .iter()
            .filter(|p| p.unstable() > 0)
            .map(|p| format!("{}[{}]={}", p.topic, p.partition, p.unstable()))
            .collect();
        line(
            "unstable (HW - LSO)",
            if unstable.is_empty() {
                "none".into()
            } else {
                unstable.join(" ")
            },
        );
        line("hanging partitions", self.hanging_partitions.to_string());
    }
}
