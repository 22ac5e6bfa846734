//! The offsets table in MySQL or MariaDB, in one of two layouts ([`Layout`]):
//!
//! - exactly's: `(group_id, topic, partition_id, next_offset, owner_epoch, owner, updated)`
//!   (`partition` is a reserved word);
//! - the Spark recipes' `kafka_offset(group_id, topic, partition_id, fromOffset,
//!   untilOffset)` (the one description of it, [`KafkaOffset`], which the offsets tool
//!   reads and writes by too), which a job that kept its offsets there hands over without
//!   replay. A Spark job's `REPLACE INTO` would reset a column added to its table, so the owners'
//!   epochs live beside it in `<table>_owner`, of the same key. Each commit moves
//!   `untilOffset` by compare-and-set and sets `fromOffset` to the one before, as the recipes
//!   do with a batch's range; an old job still writing there changes `untilOffset` under
//!   exactly, which then finds its compare-and-set fenced.
//!
//! Epochs come from a one-row table, `<table>_epoch` (`LAST_INSERT_ID(epoch + 1)`: MySQL has
//! no sequences), so an epoch never repeats, even for a row deleted and seeded again.
//!
//! Group and topic names compare exactly ([`Key`]), whatever the columns' collation: the
//! recipes create `kafka_offset` with the server's default, which ignores case (and accents),
//! and under it `Orders` would read and move `orders`'s rows. Such a table cannot hold both
//! (its key ignores case too): a group or topic whose name collides with another's there is
//! refused, with the `ALTER TABLE` that makes the names exact.

use mysql_async::Value;
use mysql_async::prelude::Queryable;

use super::{Conn, bigint, exists, identifier};
use crate::db::kafka_offset::KafkaOffset;
use crate::db::{Advance, Claimed, Failure, Layout, in_claim_order, partitions_once};

/// Moves per statement: well under MySQL's 65,535 placeholders.
const CHUNK: usize = 1000;

/// A table's key columns, quoted, and `names`: the clause that picks a group's rows of a
/// topic, the names compared exactly: case-blind first (an index on the names serves it),
/// then as they are ([`Offsets::names`]'s parameters).
#[derive(Clone, Debug)]
struct Key {
    group: String,
    topic: String,
    partition: String,
    names: String,
}

impl Key {
    /// The key `(group, topic, partition)`: plain names (checked where they are chosen).
    fn of(group: &str, topic: &str, partition: &str) -> Key {
        let (group, topic) = (format!("`{group}`"), format!("`{topic}`"));
        Key {
            names: format!(
                "{group} = ? AND {topic} = ? AND {group} = ? COLLATE utf8mb4_bin \
                 AND {topic} = ? COLLATE utf8mb4_bin"
            ),
            partition: format!("`{partition}`"),
            group,
            topic,
        }
    }

    /// exactly's tables' key.
    fn exactly() -> Key {
        Key::of("group_id", "topic", "partition_id")
    }
}

/// The offsets table, for one group, as one owner.
#[derive(Clone, Debug)]
pub struct Offsets {
    layout: Layout,
    /// The recipes' table, with `Layout::KafkaOffset`.
    recipe: KafkaOffset,
    /// The offsets table's key, and the owners' (exactly's names).
    key: Key,
    own: Key,
    /// Names as given (for the catalog) and quoted (for statements).
    name: String,
    table: String,
    epochs_name: String,
    epochs: String,
    owners_name: String,
    owners: String,
    group: String,
    owner: String,
}

impl Offsets {
    /// The table `table` in `layout`, for `group`, as `owner`.
    pub fn new(table: &str, layout: Layout, group: &str, owner: &str) -> Result<Offsets, String> {
        let (epochs_name, owners_name) = (format!("{table}_epoch"), format!("{table}_owner"));
        let recipe = KafkaOffset::named(table);
        let key = match layout {
            Layout::Exactly => Key::exactly(),
            Layout::KafkaOffset => Key::of(&recipe.group, &recipe.topic, &recipe.partition),
        };
        Ok(Offsets {
            layout,
            recipe,
            key,
            own: Key::exactly(),
            table: identifier(table)?,
            name: table.to_string(),
            epochs: identifier(&epochs_name)?,
            epochs_name,
            owners: identifier(&owners_name)?,
            owners_name,
            group: group.to_string(),
            owner: owner.to_string(),
        })
    }

    /// Creates the tables that are missing (only those: a role that may not create tables can
    /// use ones made for it).
    pub fn create(&self, conn: &Conn) -> Result<(), Failure> {
        let names = "group_id VARCHAR(255) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL,
                     topic VARCHAR(255) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL,
                     partition_id INT NOT NULL";
        let owned = "owner_epoch BIGINT NOT NULL DEFAULT 0,
                     owner VARCHAR(255) NULL,
                     updated TIMESTAMP(6) NOT NULL DEFAULT CURRENT_TIMESTAMP(6)";
        let mut wanted = vec![(
            &self.epochs_name,
            format!(
                "CREATE TABLE IF NOT EXISTS {} (id TINYINT NOT NULL PRIMARY KEY, \
                 epoch BIGINT NOT NULL) ENGINE=InnoDB",
                self.epochs
            ),
        )];
        match self.layout {
            Layout::Exactly => wanted.push((
                &self.name,
                format!(
                    "CREATE TABLE IF NOT EXISTS {} ({names}, next_offset BIGINT NULL, {owned},
                     PRIMARY KEY (group_id, topic, partition_id)) ENGINE=InnoDB",
                    self.table
                ),
            )),
            Layout::KafkaOffset => {
                // The recipes' own table, as they create it.
                let (k, (from, until)) = (&self.key, self.offset_columns());
                wanted.push((
                    &self.name,
                    format!(
                        "CREATE TABLE IF NOT EXISTS {} ({g} VARCHAR(255) NOT NULL,
                         {t} VARCHAR(255) NOT NULL, {p} INT NOT NULL,
                         {from} BIGINT NOT NULL, {until} BIGINT NOT NULL,
                         PRIMARY KEY ({g}, {t}, {p})) ENGINE=InnoDB",
                        self.table,
                        g = k.group,
                        t = k.topic,
                        p = k.partition,
                    ),
                ));
                wanted.push((
                    &self.owners_name,
                    format!(
                        "CREATE TABLE IF NOT EXISTS {} ({names}, {owned},
                         PRIMARY KEY (group_id, topic, partition_id)) ENGINE=InnoDB",
                        self.owners
                    ),
                ));
            }
        }
        for (name, sql) in wanted {
            if !exists(conn, name)? {
                conn.batch(&sql)?;
            }
        }
        self.collisions(conn, &self.table, None)
    }

    /// The recipes' table's `fromOffset` and `untilOffset`, quoted.
    fn offset_columns(&self) -> (String, String) {
        let quoted = |c: &str| format!("`{c}`");
        (quoted(&self.recipe.from), quoted(&self.recipe.offset))
    }

    /// `WHERE` for this group's rows of `topic` among `partitions` in a table of `key`, and
    /// its parameters.
    fn rows_of(&self, key: &Key, topic: &str, partitions: &[i32]) -> (String, Vec<Value>) {
        let marks = vec!["?"; partitions.len()].join(", ");
        let mut params = self.names(topic).to_vec();
        params.extend(partitions.iter().map(|p| Value::from(*p)));
        (
            format!("{} AND {} IN ({marks})", key.names, key.partition),
            params,
        )
    }

    /// The parameters of [`Key::names`] for this group's rows of `topic`.
    fn names(&self, topic: &str) -> [Value; 4] {
        let (g, t) = (Value::from(&self.group), Value::from(topic));
        [g.clone(), t.clone(), g, t]
    }

    /// Refuses a table whose names collide with this group's or `topic` under their columns'
    /// collation (another group's rows would be taken for this one's; or rows could not be
    /// written, the key ignoring the difference).
    fn collisions(&self, conn: &Conn, table: &str, topic: Option<&str>) -> Result<(), Failure> {
        let (g, t) = (&self.key.group, &self.key.topic);
        let (column, sql, params) = match topic {
            None => (
                g,
                format!(
                    "SELECT DISTINCT {g} FROM {table} WHERE {g} = ? AND \
                     {g} <> ? COLLATE utf8mb4_bin LIMIT 1"
                ),
                vec![Value::from(&self.group), Value::from(&self.group)],
            ),
            Some(topic) => (
                t,
                format!(
                    "SELECT DISTINCT {t} FROM {table} WHERE {g} = ? COLLATE utf8mb4_bin \
                     AND {t} = ? AND {t} <> ? COLLATE utf8mb4_bin LIMIT 1"
                ),
                vec![
                    Value::from(&self.group),
                    Value::from(topic),
                    Value::from(topic),
                ],
            ),
        };
        let other: Option<String> = conn.call(async |c| c.exec_first(sql, params).await)?;
        let Some(other) = other else {
            return Ok(());
        };
        let ours = topic.unwrap_or(&self.group);
        Err(Failure::setup(format!(
            "{table}'s {column} ignores case or accents (its collation), and holds rows of \
             '{other}', which it cannot tell from '{ours}': they would share rows. Make the \
             names exact (ALTER TABLE {table} MODIFY {g} VARCHAR(255) CHARACTER SET \
             utf8mb4 COLLATE utf8mb4_bin NOT NULL, MODIFY {t} VARCHAR(255) CHARACTER SET \
             utf8mb4 COLLATE utf8mb4_bin NOT NULL), or choose another name"
        )))
    }

    /// Claims `partitions` of `topic`, each with its seed (the group's Kafka offset) for a row
    /// that is missing, in a transaction of its own: where each starts, and its new epoch.
    pub fn claim(
        &self,
        conn: &Conn,
        topic: &str,
        partitions: &[(i32, Option<i64>)],
    ) -> Result<Vec<Claimed>, Failure> {
        let partitions = in_claim_order(partitions);
        if partitions.is_empty() {
            return Ok(Vec::new());
        }
        let bump = format!(
            "INSERT INTO {} (id, epoch) VALUES (1, LAST_INSERT_ID(1))
             ON DUPLICATE KEY UPDATE epoch = LAST_INSERT_ID(epoch + 1)",
            self.epochs
        );
        self.collisions(conn, &self.table, Some(topic))?;
        conn.batch("START TRANSACTION")?;
        let claimed = self.claim_in_transaction(conn, &bump, topic, &partitions);
        let rows = match claimed {
            Ok(rows) => rows,
            Err(e) => {
                let _ = conn.batch("ROLLBACK");
                return Err(e);
            }
        };
        conn.batch("COMMIT")?;
        Ok(rows)
    }

    /// The claim's statements, in the open transaction: the epoch bumped, the rows missing
    /// seeded (kafka_offset: those with a seed only, its offsets are NOT NULL), every row's
    /// owner and epoch set, and read back.
    fn claim_in_transaction(
        &self,
        conn: &Conn,
        bump: &str,
        topic: &str,
        partitions: &[(i32, Option<i64>)],
    ) -> Result<Vec<Claimed>, Failure> {
        let epoch: Option<i64> = conn.call(async |c| {
            c.query_drop(bump).await?;
            c.query_first("SELECT LAST_INSERT_ID()").await
        })?;
        let epoch = epoch
            .filter(|e| *e > 0)
            .ok_or_else(|| Failure::client("the epoch table gave no epoch".into()))?;
        let owners = "ON DUPLICATE KEY UPDATE owner_epoch = VALUES(owner_epoch), \
                      owner = VALUES(owner), updated = CURRENT_TIMESTAMP(6)";
        let mut params = Vec::new();
        let sql = match self.layout {
            Layout::Exactly => {
                for (p, seed) in partitions {
                    params.extend([
                        Value::from(&self.group),
                        Value::from(topic),
                        Value::from(*p),
                        Value::from(*seed),
                        Value::from(epoch),
                        Value::from(&self.owner),
                    ]);
                }
                format!(
                    "INSERT INTO {} (group_id, topic, partition_id, next_offset, owner_epoch, owner)
                     VALUES {} {owners}",
                    self.table,
                    vec!["(?, ?, ?, ?, ?, ?)"; partitions.len()].join(", ")
                )
            }
            Layout::KafkaOffset => {
                self.seed_kafka_offset(conn, topic, partitions)?;
                for (p, _) in partitions {
                    params.extend([
                        Value::from(&self.group),
                        Value::from(topic),
                        Value::from(*p),
                        Value::from(epoch),
                        Value::from(&self.owner),
                    ]);
                }
                format!(
                    "INSERT INTO {} (group_id, topic, partition_id, owner_epoch, owner)
                     VALUES {} {owners}",
                    self.owners,
                    vec!["(?, ?, ?, ?, ?)"; partitions.len()].join(", ")
                )
            }
        };
        conn.call(async |c| c.exec_drop(sql, params).await)?;
        let ps: Vec<i32> = partitions.iter().map(|(p, _)| *p).collect();
        let rows = self.read(conn, topic, &ps)?;
        if rows.len() != ps.len() || rows.iter().any(|c| c.epoch != epoch) {
            return Err(Failure::client(format!(
                "claimed {ps:?} with epoch {epoch}, the table holds {rows:?}"
            )));
        }
        Ok(rows)
    }

    /// kafka_offset's rows missing, seeded (those with a seed only: its offsets are NOT
    /// NULL); a row there already stays as it is.
    fn seed_kafka_offset(
        &self,
        conn: &Conn,
        topic: &str,
        partitions: &[(i32, Option<i64>)],
    ) -> Result<(), Failure> {
        let seeds: Vec<(i32, i64)> = (partitions.iter())
            .filter_map(|(p, s)| Some((*p, (*s)?)))
            .collect();
        if !seeds.is_empty() {
            let mut params = Vec::new();
            for (p, seed) in &seeds {
                params.extend([
                    Value::from(&self.group),
                    Value::from(topic),
                    Value::from(*p),
                    Value::from(*seed),
                    Value::from(*seed),
                ]);
            }
            let (k, (from, until)) = (&self.key, self.offset_columns());
            let sql = format!(
                "INSERT INTO {} ({g}, {t}, {p}, {from}, {until})
                     VALUES {} ON DUPLICATE KEY UPDATE {p} = {p}",
                self.table,
                vec!["(?, ?, ?, ?, ?)"; seeds.len()].join(", "),
                g = k.group,
                t = k.topic,
                p = k.partition,
            );
            conn.call(async |c| c.exec_drop(sql, params).await)?;
        }
        Ok(())
    }

    /// Moves the offsets of `topic` in the open transaction, each by compare-and-set on its
    /// old offset and epoch: the partitions whose row did not move (another owner claimed
    /// them since, or another writer moved the offset). With any, the transaction must roll
    /// back. A partition twice is refused.
    pub fn advance(
        &self,
        conn: &Conn,
        topic: &str,
        moves: &[Advance],
    ) -> Result<Vec<i32>, Failure> {
        let ps = partitions_once(moves)?;
        let mut moves = moves.to_vec();
        // In one order: the rows' locks too.
        moves.sort_unstable_by_key(|m| m.partition);
        let mut all_moved = true;
        for chunk in moves.chunks(CHUNK) {
            all_moved &= match self.layout {
                Layout::Exactly => self.move_exactly(conn, topic, chunk)?,
                Layout::KafkaOffset => self.move_kafka_offset(conn, topic, chunk)?,
            };
        }
        if all_moved {
            return Ok(Vec::new());
        }
        // Which did not: read in the same transaction, our own moves visible.
        let rows = self.read(conn, topic, &ps)?;
        Ok(moves
            .iter()
            .filter(|m| {
                !rows.iter().any(|r| {
                    r.partition == m.partition && r.next == Some(m.to) && r.epoch == m.epoch
                })
            })
            .map(|m| m.partition)
            .collect())
    }

    /// exactly's layout: one `UPDATE` for `moves`; whether every row matched.
    fn move_exactly(&self, conn: &Conn, topic: &str, moves: &[Advance]) -> Result<bool, Failure> {
        let mut params = Vec::new();
        let cases = vec!["WHEN ? THEN ?"; moves.len()].join(" ");
        for m in moves {
            params.extend([Value::from(m.partition), Value::from(m.to)]);
        }
        params.extend(self.names(topic));
        let matches =
            vec!["(partition_id = ? AND next_offset <=> ? AND owner_epoch = ?)"; moves.len()]
                .join(" OR ");
        for m in moves {
            params.extend([
                Value::from(m.partition),
                Value::from(m.from),
                Value::from(m.epoch),
            ]);
        }
        let sql = format!(
            "UPDATE {} SET next_offset = CASE partition_id {cases} END,
               updated = CURRENT_TIMESTAMP(6)
             WHERE {} AND ({matches})",
            self.table, self.key.names
        );
        let matched = conn.call(async |c| {
            c.exec_drop(sql, params).await?;
            Ok(c.affected_rows())
        })?;
        Ok(matched == moves.len() as u64)
    }

    /// The recipes' layout: the owners' epochs checked (and their rows locked) first, then
    /// `untilOffset` moved by compare-and-set, or inserted where no row was; whether every
    /// row matched.
    fn move_kafka_offset(
        &self,
        conn: &Conn,
        topic: &str,
        moves: &[Advance],
    ) -> Result<bool, Failure> {
        let mut params = self.names(topic).to_vec();
        for m in moves {
            params.extend([Value::from(m.partition), Value::from(m.epoch)]);
        }
        let owned = vec!["(partition_id = ? AND owner_epoch = ?)"; moves.len()].join(" OR ");
        let sql = format!(
            "UPDATE {} SET updated = CURRENT_TIMESTAMP(6)
             WHERE {} AND ({owned})",
            self.owners, self.own.names
        );
        let matched = conn.call(async |c| {
            c.exec_drop(sql, params).await?;
            Ok(c.affected_rows())
        })?;
        if matched != moves.len() as u64 {
            return Ok(false);
        }
        let (moved, new): (Vec<&Advance>, Vec<&Advance>) =
            moves.iter().partition(|m| m.from.is_some());
        if !moved.is_empty() {
            let cases = vec!["WHEN ? THEN ?"; moved.len()].join(" ");
            let mut params = Vec::new();
            for column in [0, 1] {
                for m in &moved {
                    let value = if column == 0 { m.from } else { Some(m.to) };
                    params.extend([Value::from(m.partition), Value::from(value)]);
                }
            }
            params.extend(self.names(topic));
            for m in &moved {
                params.extend([Value::from(m.partition), Value::from(m.from)]);
            }
            let (k, (from, until)) = (&self.key, self.offset_columns());
            let p = &k.partition;
            let matches = vec![format!("({p} = ? AND {until} = ?)"); moved.len()].join(" OR ");
            let sql = format!(
                "UPDATE {} SET {from} = CASE {p} {cases} END,
                   {until} = CASE {p} {cases} END
                 WHERE {} AND ({matches})",
                self.table, k.names
            );
            let matched = conn.call(async |c| {
                c.exec_drop(sql, params).await?;
                Ok(c.affected_rows())
            })?;
            if matched != moved.len() as u64 {
                return Ok(false);
            }
        }
        self.insert_kafka_offset(conn, topic, &new)
    }

    /// The recipes' rows of `new` moves, where the claim saw none; whether every one went in
    /// (`false`: somebody wrote one since).
    fn insert_kafka_offset(
        &self,
        conn: &Conn,
        topic: &str,
        new: &[&Advance],
    ) -> Result<bool, Failure> {
        if new.is_empty() {
            return Ok(true);
        }
        let mut params = Vec::new();
        for m in new {
            params.extend([
                Value::from(&self.group),
                Value::from(topic),
                Value::from(m.partition),
                Value::from(m.to),
                Value::from(m.to),
            ]);
        }
        let (k, (from, until)) = (&self.key, self.offset_columns());
        let sql = format!(
            "INSERT INTO {} ({}, {}, {}, {from}, {until}) VALUES {}",
            self.table,
            k.group,
            k.topic,
            k.partition,
            vec!["(?, ?, ?, ?, ?)"; new.len()].join(", ")
        );
        match conn.call(async |c| c.exec_drop(sql, params).await) {
            Ok(()) => Ok(true),
            // Somebody wrote the row since the claim saw none.
            Err(e) if e.code.as_deref() == Some("1062") => Ok(false),
            Err(e) => Err(e),
        }
    }

    /// What the table holds for `partitions` of `topic`: (partition, next offset, epoch), for
    /// the rows there are. With the recipes' layout, a partition with an offset but no owner
    /// yet (the Spark job's) has epoch 0.
    pub fn read(
        &self,
        conn: &Conn,
        topic: &str,
        partitions: &[i32],
    ) -> Result<Vec<Claimed>, Failure> {
        if partitions.is_empty() {
            return Ok(Vec::new());
        }
        let (filter, params) = self.rows_of(&self.key, topic, partitions);
        let column = |rows: Vec<mysql_async::Row>, what: &str| {
            let mut out = std::collections::BTreeMap::new();
            for mut r in rows {
                let p = bigint(&mut r, 0, "partition_id")?;
                let v = bigint(&mut r, 1, what)?;
                let p = p.and_then(|p| i32::try_from(p).ok());
                let p = p.ok_or_else(|| Failure::client("partition_id: not a partition".into()))?;
                out.insert(p, v);
            }
            Ok::<_, Failure>(out)
        };
        let claimed = match self.layout {
            Layout::Exactly => {
                let sql = format!(
                    "SELECT partition_id, next_offset, owner_epoch FROM {} WHERE {filter}",
                    self.table
                );
                let rows: Vec<mysql_async::Row> = conn.call(async |c| c.exec(sql, params).await)?;
                let mut out = Vec::new();
                for mut r in rows {
                    let p = bigint(&mut r, 0, "partition_id")?.and_then(|p| i32::try_from(p).ok());
                    let next = bigint(&mut r, 1, "next_offset")?;
                    let epoch = bigint(&mut r, 2, "owner_epoch")?.unwrap_or_default();
                    let partition =
                        p.ok_or_else(|| Failure::client("partition_id: not a partition".into()))?;
                    out.push(Claimed {
                        partition,
                        next,
                        epoch,
                    });
                }
                out
            }
            Layout::KafkaOffset => {
                let (p, (_, until)) = (&self.key.partition, self.offset_columns());
                let offsets = format!("SELECT {p}, {until} FROM {} WHERE {filter}", self.table);
                let (own, p2) = self.rows_of(&self.own, topic, partitions);
                let epochs = format!(
                    "SELECT partition_id, owner_epoch FROM {} WHERE {own}",
                    self.owners
                );
                let rows: Vec<mysql_async::Row> =
                    conn.call(async |c| c.exec(offsets, params).await)?;
                let nexts = column(rows, &self.recipe.offset)?;
                let rows: Vec<mysql_async::Row> = conn.call(async |c| c.exec(epochs, p2).await)?;
                let epochs = column(rows, "owner_epoch")?;
                let mut ps: Vec<i32> = nexts.keys().chain(epochs.keys()).copied().collect();
                ps.sort_unstable();
                ps.dedup();
                ps.into_iter()
                    .map(|partition| Claimed {
                        partition,
                        next: nexts.get(&partition).copied().flatten(),
                        epoch: epochs.get(&partition).copied().flatten().unwrap_or(0),
                    })
                    .collect()
            }
        };
        let mut claimed = claimed;
        claimed.sort_by_key(|c| c.partition);
        Ok(claimed)
    }
}
