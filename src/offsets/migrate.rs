//! `exactly offsets show|import|export`: a group's position, read from or moved to a store.
//!
//! Import validates before it writes: every partition of the topics has an offset (or
//! `--missing` says where to start), every offset lies within the partition's low and high
//! watermarks (or `--clamp` moves it there), and the group has no members (the coordinator
//! refuses offsets from outside a group in use). The table it prints (and `--dry-run` prints
//! alone) has, per partition, the group's offset now, the new one, the watermarks, the last
//! stable offset and the lag after.

use std::fmt::Write as _;

use rdkafka::consumer::{BaseConsumer, Consumer};

use super::{OffsetStore, Offsets};
use crate::config::offsets::{Missing, Target};
use crate::error::Error;
use crate::kafka::{Isolation, Role};

/// One partition's state and, for import, its new offset.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Row {
    /// Topic.
    pub topic: String,
    /// Partition.
    pub partition: i32,
    /// Low watermark.
    pub low: i64,
    /// High watermark.
    pub high: i64,
    /// Last stable offset.
    pub lso: i64,
    /// The group's committed offset.
    pub committed: Option<i64>,
    /// What the import commits (or the export writes).
    pub new: Option<i64>,
    /// How the new offset was found, when not straight from the store.
    pub note: &'static str,
}

impl Row {
    /// What a read_committed consumer has left to read from `offset`.
    fn lag(&self, offset: Option<i64>) -> String {
        offset.map_or("-".into(), |o| (self.lso - o).max(0).to_string())
    }
}

/// The partitions of `target`, with watermarks, last stable offsets and committed offsets.
pub fn state(target: &Target) -> Result<Vec<Row>, Error> {
    let client =
        |role: Role<'_>| -> Result<BaseConsumer, Error> { Ok(target.kafka.client(role).create()?) };
    let group = client(Role::GroupOffsets {
        group: &target.group,
    })?;
    let stable = client(Role::EndOffsets {
        isolation: Isolation::ReadCommitted,
    })?;
    let kafka_err = |context: String| move |source| Error::kafka(&context, source);
    let mut partitions = Vec::new();
    for topic in &target.topics {
        let md = group
            .fetch_metadata(Some(topic), target.timeout)
            .map_err(kafka_err(format!("reading the metadata of '{topic}'")))?;
        let count = md
            .topics()
            .iter()
            .find(|t| t.name() == topic && t.error().is_none())
            .map_or(0, |t| t.partitions().len());
        if count == 0 {
            return Err(Error::Config(format!(
                "--input-topics: topic '{topic}' does not exist"
            )));
        }
        partitions.extend((0..count as i32).map(|p| (topic.clone(), p)));
    }
    let committed = super::group::GroupStore::new(target.kafka.clone(), target.timeout)
        .read(&target.group, &partitions)?;
    let mut rows = Vec::new();
    for (topic, partition) in partitions {
        let at = format!("the offsets of {topic}[{partition}]");
        let (low, high) = group
            .fetch_watermarks(&topic, partition, target.timeout)
            .map_err(kafka_err(at.clone()))?;
        let (_, lso) = stable
            .fetch_watermarks(&topic, partition, target.timeout)
            .map_err(kafka_err(at))?;
        rows.push(Row {
            committed: committed.get(&(topic.clone(), partition)).copied(),
            topic,
            partition,
            low,
            high,
            lso,
            new: None,
            note: "",
        });
    }
    Ok(rows)
}

/// Members of the group now (a running exactly, or the old job with Kafka group management).
fn members(target: &Target) -> Result<usize, Error> {
    let role = Role::GroupOffsets {
        group: &target.group,
    };
    let c: BaseConsumer = target.kafka.client(role).create()?;
    let list = c
        .fetch_group_list(Some(&target.group), target.timeout)
        .map_err(|source| Error::kafka(&format!("describing group {}", target.group), source))?;
    Ok(list.groups().iter().map(|g| g.members().len()).sum())
}

/// The group's offsets now: a table.
pub fn show(target: &Target) -> Result<String, Error> {
    let rows = state(target)?;
    let mut out = format!("group {}\n", target.group);
    table(&mut out, &rows, false);
    Ok(out)
}

/// Moves the offsets in `store` into the group (`dry_run`: only says what it would do).
pub fn import(
    target: &Target,
    store: &dyn OffsetStore,
    missing: Missing,
    clamp: bool,
    dry_run: bool,
) -> Result<String, Error> {
    let mut rows = state(target)?;
    let partitions: Vec<(String, i32)> = rows
        .iter()
        .map(|r| (r.topic.clone(), r.partition))
        .collect();
    let found = store.read(&target.group, &partitions)?;
    // A topic the store has nothing for is a wrong key, table or group, not a partition to
    // start somewhere: --missing would move every partition silently.
    for topic in &target.topics {
        if !found.keys().any(|(t, _)| t == topic) {
            return Err(Error::Config(format!(
                "the store has no offset of topic '{topic}' for group {}: check the group, \
                 --redis-key, --redis-field or the --mysql-* names (--missing is for partitions \
                 missing beside others)",
                target.group
            )));
        }
    }
    for r in &mut rows {
        let (new, note) = place(
            r,
            found.get(&(r.topic.clone(), r.partition)).copied(),
            missing,
            clamp,
        )?;
        r.new = Some(new);
        r.note = note;
    }
    let mut out = format!("group {}\n", target.group);
    if let Some(from) = store.describe() {
        let _ = writeln!(out, "from {from}");
    }
    table(&mut out, &rows, true);
    let active = members(target)?;
    let in_use = format!(
        "group {} has {active} active member(s): stop them first (Kafka refuses offsets for a \
         group in use), then import again",
        target.group
    );
    if dry_run {
        if active > 0 {
            let _ = writeln!(out, "{in_use}");
        }
        out.push_str("dry run: nothing committed\n");
        return Ok(out);
    }
    if active > 0 {
        return Err(Error::Config(in_use));
    }
    let offsets: Offsets = rows
        .iter()
        .filter_map(|r| Some(((r.topic.clone(), r.partition), r.new?)))
        .collect();
    super::group::GroupStore::new(target.kafka.clone(), target.timeout)
        .write(&target.group, &offsets)?;
    let _ = writeln!(
        out,
        "committed {} offsets to group {}",
        offsets.len(),
        target.group
    );
    Ok(out)
}

/// Where the import puts partition `r`, by what the store holds for it (`stored`): there, or
/// clamped into the partition's offsets, or where `missing` says; with a note when not as
/// stored.
fn place(
    r: &Row,
    stored: Option<i64>,
    missing: Missing,
    clamp: bool,
) -> Result<(i64, &'static str), Error> {
    Ok(match (stored, missing) {
        (Some(o), _) if (r.low..=r.high).contains(&o) => (o, ""),
        // A negative offset is a marker (-1: latest, -2: earliest), not a position.
        (Some(o), _) if clamp && o >= 0 => (o.clamp(r.low, r.high), "clamped"),
        (Some(o), _) => {
            return Err(Error::Config(format!(
                "{}[{}]: the store says {o}, outside the partition's offsets {}..{} \
                 (records before {} are deleted; {} is the end); --clamp moves it inside",
                r.topic, r.partition, r.low, r.high, r.low, r.high
            )));
        }
        (None, Missing::Earliest) => (r.low, "missing: earliest"),
        (None, Missing::Latest) => (r.high, "missing: latest"),
        (None, Missing::Error) => {
            return Err(Error::Config(format!(
                "{}[{}] has no offset in the store; --missing earliest|latest says where \
                 to start it",
                r.topic, r.partition
            )));
        }
    })
}

/// Writes the group's committed offsets to `store`, in its layout.
pub fn export(target: &Target, store: &dyn OffsetStore, dry_run: bool) -> Result<String, Error> {
    let mut rows = state(target)?;
    for r in &mut rows {
        r.new = r.committed;
        if r.new.is_none() {
            r.note = "no committed offset: not written";
        }
    }
    let offsets: Offsets = rows
        .iter()
        .filter_map(|r| Some(((r.topic.clone(), r.partition), r.new?)))
        .collect();
    let mut out = format!("group {}\n", target.group);
    table(&mut out, &rows, true);
    if dry_run {
        out.push_str("dry run: nothing written\n");
        return Ok(out);
    }
    store.write(&target.group, &offsets)?;
    let _ = writeln!(out, "wrote {} offsets", offsets.len());
    Ok(out)
}

/// A plain text table of `rows` (`moving`: with the new offset and the lag after it).
fn table(out: &mut String, rows: &[Row], moving: bool) {
    let mut lines: Vec<Vec<String>> = vec![if moving {
        [
            "topic",
            "partition",
            "committed",
            "new",
            "low",
            "high",
            "LSO",
            "lag after",
            "",
        ]
        .map(String::from)
        .to_vec()
    } else {
        [
            "topic",
            "partition",
            "committed",
            "low",
            "high",
            "LSO",
            "lag",
        ]
        .map(String::from)
        .to_vec()
    }];
    for r in rows {
        let committed = r.committed.map_or("-".into(), |c| c.to_string());
        let mut line = vec![r.topic.clone(), r.partition.to_string(), committed];
        if moving {
            line.push(r.new.map_or("-".into(), |n| n.to_string()));
        }
        line.extend([r.low.to_string(), r.high.to_string(), r.lso.to_string()]);
        if moving {
            line.extend([r.lag(r.new), r.note.to_string()]);
        } else {
            line.push(r.lag(r.committed));
        }
        lines.push(line);
    }
    let widths: Vec<usize> = (0..lines[0].len())
        .map(|i| lines.iter().map(|l| l[i].len()).max().unwrap_or(0))
        .collect();
    for l in lines {
        let cells: Vec<String> = l
            .iter()
            .zip(&widths)
            .map(|(c, w)| format!("{c:<w$}"))
            .collect();
        let _ = writeln!(out, "{}", cells.join("  ").trim_end());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_table_lines_up_and_shows_the_lag_after() {
        let row = Row {
            topic: "orders".into(),
            partition: 0,
            low: 0,
            high: 100,
            lso: 90,
            committed: None,
            new: Some(40),
            note: "clamped",
        };
        let mut out = String::new();
        table(&mut out, &[row], true);
        let lines: Vec<&str> = out.lines().collect();
        assert!(
            lines[0].starts_with("topic   partition  committed  new"),
            "{out}"
        );
        assert!(
            lines[1].contains("-  ") && lines[1].contains("50") && lines[1].ends_with("clamped"),
            "{out}"
        );
    }
}
