//! `exactly audit` over a database sink's table (`--db-url`): the rows stand for the output
//! topics, matched to their inputs by the lineage column, and the dead-letter table for the
//! DLQ topic.
//!
//! The lineages are read and accounted as outputs are (lost, twice, unexpected, in both);
//! what a table holds beyond that, the database judges, since only it types a value as its
//! column does: each expected row is sent to it and compared there with the row of its
//! lineage (`1.10` and `1.1` in a numeric column are one value); and an expected row that is
//! not there is looked up by its key, since an upsert replaces a row with a later output of
//! the same key: overwritten by a later output of its source partition, or by any output of
//! another (their order is not defined), it is not lost; overwritten by an earlier one, it is.

use std::collections::HashMap;

use super::{History, Lineage, Parts, Rec, Report, show};
use crate::db::{self, ReadTarget, Reader};
use crate::error::Error;
use crate::headers::{self, ERROR_REASON, LINEAGE};

/// Reads `target`'s rows and dead-letter copies into `history`, as outputs and DLQ records
/// (their lineage and reason as headers, no values): the reader, to compare with later.
/// With `group`, what it processed is what the offsets table says (the Kafka group holds a
/// copy, for the lag tools), read first: every input below it has its rows by then.
pub fn read(
    target: &ReadTarget,
    group: Option<&str>,
    history: &mut History,
) -> Result<Table, Error> {
    let reader = db::open_reader(target).map_err(|e| {
        let flag = match e.step {
            db::Step::Connect => "--db-url",
            db::Step::Rows => "--db-table",
            _ => "--db-dlq-table",
        };
        Error::Store(format!("{flag}: {}", e.failure))
    })?;
    let failed = |e: db::Failure| Error::Store(format!("--db-url: {e}"));
    if let Some(group) = group {
        let offsets = |e: db::Failure| Error::Store(format!("--db-offsets-table: {e}"));
        history.committed = Some(table_offsets(&*reader, group, history).map_err(offsets)?);
    }
    let (lineages, without) = reader.lineages().map_err(failed)?;
    let row = |i: usize, headers| Rec {
        topic: target.rows.clone(),
        partition: 0,
        offset: i as i64,
        timestamp: None,
        key: None,
        value: None,
        headers,
    };
    history.outputs = (lineages.into_iter().enumerate())
        .map(|(i, l)| row(i, vec![(LINEAGE.as_bytes().to_vec(), Some(l.into_bytes()))]))
        .collect();
    let counted = history.outputs.len();
    history
        .outputs
        .extend((0..without).map(|i| row(counted + i, Vec::new())));
    let dead = reader.dead_letters().map_err(failed)?;
    history.dlq = (dead.into_iter().enumerate())
        .map(|(i, d)| {
            let mut headers = Vec::new();
            for (name, value) in [(ERROR_REASON, d.reason), (LINEAGE, d.lineage)] {
                if let Some(v) = value {
                    headers.push((name.as_bytes().to_vec(), Some(v.into_bytes())));
                }
            }
            Rec {
                topic: target.dead.clone(),
                ..row(i, headers)
            }
        })
        .collect();
    history.rows = true;
    Ok(Table {
        reader,
        lineage_column: target.lineage_column.clone(),
    })
}

/// A table being audited.
pub struct Table {
    reader: Box<dyn Reader>,
    lineage_column: String,
}

/// [`super::analyze`]'s judgement finished for a table: the rows found compared by the
/// database with what the replay expects, the missing ones looked up by their key.
pub fn check(parts: Parts<'_>, table: &Table) -> Result<Report, db::Failure> {
    let Parts {
        mut report,
        history,
        expected,
        missing,
    } = parts;
    debug_assert!(history.rows);
    let row = |l: &Lineage| {
        let value = expected.outputs.get(l)?.value.as_deref()?;
        db::row_text(value, Some((&table.lineage_column, Some(&show(l)))))
    };
    if report.replayed {
        let missing_set: std::collections::HashSet<&Lineage> = missing.iter().collect();
        let mut found: Vec<&Lineage> = (expected.outputs.keys())
            .filter(|l| !missing_set.contains(l))
            .collect();
        found.sort();
        let rows: Vec<(usize, String)> = (found.iter().enumerate())
            .filter_map(|(i, l)| Some((i, row(l)?)))
            .collect();
        for (i, columns) in table.reader.differing(&rows)? {
            report.unexpected += 1;
            report.note(format!(
                "row {} differs from the replay in {}",
                show(found[i]),
                columns.join(", ")
            ));
        }
    }
    let rows: Vec<(usize, String)> = (missing.iter().enumerate())
        .filter_map(|(i, l)| Some((i, row(l)?)))
        .collect();
    let holders: HashMap<usize, Option<String>> =
        table.reader.holders(&rows)?.into_iter().collect();
    for (i, l) in missing.iter().enumerate() {
        let holder = holders.get(&i).cloned().flatten();
        let holder = holder
            .as_deref()
            .and_then(|h| headers::parse_lineage(h.as_bytes()));
        match holder {
            Some(h) if overwrites(&h, l) => report.overwritten += 1,
            Some(h) => {
                report.lost += 1;
                report.note(format!(
                    "output {} is missing: the row of its key holds {}, an earlier output",
                    show(l),
                    show(&h)
                ));
            }
            None => {
                report.lost += 1;
                report.note(format!("output {} is missing", show(l)));
            }
        }
    }
    Ok(report)
}

/// Whether a row of output `holder` may stand where output `l` was written: a later output of
/// the same source partition, or any output of another.
fn overwrites(holder: &Lineage, l: &Lineage) -> bool {
    (&holder.0, holder.1) != (&l.0, l.1) || (holder.2, holder.3) > (l.2, l.3)
}

/// The offsets table's next offsets of `group` for the partitions of `history`'s range.
fn table_offsets(
    reader: &dyn Reader,
    group: &str,
    history: &History,
) -> Result<std::collections::BTreeMap<(String, i32), i64>, db::Failure> {
    let mut by_topic: std::collections::BTreeMap<&str, Vec<i32>> = Default::default();
    for (t, p) in history.range.keys() {
        by_topic.entry(t).or_default().push(*p);
    }
    let mut committed = std::collections::BTreeMap::new();
    for (topic, partitions) in by_topic {
        for (p, next) in reader.offsets(group, topic, &partitions)? {
            if let Some(next) = next {
                committed.insert((topic.to_string(), p), next);
            }
        }
    }
    Ok(committed)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::audit::{Replay, analyze_parts};
    use crate::config::{OnError, TransformSpec};
    use crate::transform::Limits;

    /// A table as a fake database sees it: the rows by lineage, and the lineage at each key
    /// (`k`).
    struct Fake {
        /// (lineage, k, v) of each row.
        rows: Vec<(String, i64, i64)>,
    }

    impl Reader for Fake {
        fn offsets(
            &self,
            _: &str,
            _: &str,
            _: &[i32],
        ) -> Result<Vec<(i32, Option<i64>)>, db::Failure> {
            Ok(Vec::new())
        }

        fn lineages(&self) -> Result<(Vec<String>, usize), db::Failure> {
            Ok((self.rows.iter().map(|r| r.0.clone()).collect(), 0))
        }

        fn dead_letters(&self) -> Result<Vec<db::DeadLetterRead>, db::Failure> {
            Ok(Vec::new())
        }

        fn differing(
            &self,
            rows: &[(usize, String)],
        ) -> Result<Vec<(usize, Vec<String>)>, db::Failure> {
            let mut out = Vec::new();
            for (i, text) in rows {
                let e: serde_json::Value = serde_json::from_str(text).unwrap();
                let held = self.rows.iter().find(|r| e["lineage"] == r.0.as_str());
                if let Some((_, k, v)) = held
                    && (e["k"] != *k || e["v"] != *v)
                {
                    out.push((*i, vec!["v".to_string()]));
                }
            }
            Ok(out)
        }

        fn holders(
            &self,
            rows: &[(usize, String)],
        ) -> Result<Vec<(usize, Option<String>)>, db::Failure> {
            Ok(rows
                .iter()
                .map(|(i, text)| {
                    let e: serde_json::Value = serde_json::from_str(text).unwrap();
                    let held = self.rows.iter().find(|r| e["k"] == r.1);
                    (*i, held.map(|r| r.0.clone()))
                })
                .collect())
        }
    }

    /// Inputs `{"k", "v"}` on partitions 0 and 1 (six each), replayed with `.`.
    fn judged(rows: Vec<(&str, i64, i64)>) -> Report {
        let mut h = History::default();
        for p in 0..2 {
            for o in 0..6 {
                // Partition 0 writes keys 0, 1, 2, 0, 1, 2; partition 1 keys 10..16.
                let k = if p == 0 { o % 3 } else { 10 + o };
                h.inputs.push(Rec {
                    topic: "in".into(),
                    partition: p,
                    offset: o,
                    value: Some(format!(r#"{{"k":{k},"v":{}}}"#, o * 10).into_bytes()),
                    ..Rec::default()
                });
            }
            h.range.insert(("in".into(), p), (0, 6));
        }
        let fake = Fake {
            rows: rows.into_iter().map(|(l, k, v)| (l.into(), k, v)).collect(),
        };
        let mut history = h;
        history.outputs = (fake.rows.iter().enumerate())
            .map(|(i, r)| Rec {
                topic: "t".into(),
                offset: i as i64,
                headers: vec![(LINEAGE.into(), Some(r.0.clone().into_bytes()))],
                ..Rec::default()
            })
            .collect();
        history.rows = true;
        let limits = Limits {
            max_output_bytes: 10_000,
            max_outputs: 10,
        };
        let spec = TransformSpec::Jq {
            program: ".".into(),
            envelope: false,
        };
        let t = crate::transform::new(&spec, limits).unwrap();
        let mut replay = Replay::Transform(t);
        let parts = analyze_parts(&history, &mut replay, OnError::Dlq, "t", 1 << 20);
        let table = Table {
            reader: Box::new(fake),
            lineage_column: "lineage".into(),
        };
        check(parts, &table).unwrap()
    }

    /// An upserted table as it should be: partition 0's keys hold its last writes, partition
    /// 1's every write (one key each).
    fn upserted() -> Vec<(&'static str, i64, i64)> {
        let mut rows = vec![
            ("in/0/3/0", 0, 30),
            ("in/0/4/0", 1, 40),
            ("in/0/5/0", 2, 50),
        ];
        let ones = [
            "in/1/0/0", "in/1/1/0", "in/1/2/0", "in/1/3/0", "in/1/4/0", "in/1/5/0",
        ];
        rows.extend(
            ones.iter()
                .enumerate()
                .map(|(o, l)| (*l, 10 + o as i64, o as i64 * 10)),
        );
        rows
    }

    #[test]
    fn an_upserted_table_is_clean_its_overwritten_rows_counted_apart() {
        let r = judged(upserted());
        assert_eq!(r.anomalies(), 0, "{}", r.summary());
        assert_eq!((r.outputs, r.overwritten, r.expected_outputs), (9, 3, 12));
    }

    #[test]
    fn a_row_lost_doubled_overwritten_by_an_earlier_write_or_differing_is_an_anomaly() {
        // Key 0 held by the first write of it, not the last: the last is lost.
        let mut rows = upserted();
        rows[0] = ("in/0/0/0", 0, 0);
        let r = judged(rows);
        assert_eq!(r.lost, 1, "{}", r.summary());
        // Partition 1's offset 2 missing, with nothing at its key.
        let mut rows = upserted();
        rows.remove(5);
        assert_eq!(judged(rows).lost, 1);
        // A row twice (an append-only table's duplicate).
        let mut rows = upserted();
        rows.push(("in/1/5/0", 15, 50));
        assert_eq!(judged(rows).duplicated, 1);
        // A row whose value is not the replay's.
        let mut rows = upserted();
        rows[1].2 = 41;
        let r = judged(rows);
        assert_eq!(r.unexpected, 1, "{}", r.summary());
        assert!(
            r.examples[0].contains("in/0/4/0 differs"),
            "{:?}",
            r.examples
        );
    }

    #[test]
    fn a_later_output_of_the_partition_or_any_of_another_overwrites_an_earlier_one() {
        let l = |t: &str, p, o, i| (t.to_string(), p, o, i);
        let written = l("in", 0, 10, 0);
        assert!(overwrites(&l("in", 0, 11, 0), &written));
        assert!(overwrites(&l("in", 0, 10, 1), &written));
        assert!(overwrites(&l("in", 1, 3, 0), &written));
        assert!(overwrites(&l("other", 0, 3, 0), &written));
        assert!(!overwrites(&l("in", 0, 9, 5), &written));
        assert!(!overwrites(&written, &written));
    }
}
