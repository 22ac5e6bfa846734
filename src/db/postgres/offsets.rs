//! The offsets table of the database sink: one row per (group, topic, partition) with the
//! partition's next offset and its owner's epoch.
//!
//! An instance assigned a partition *claims* it: the row is created when missing (seeded from
//! the group's Kafka offset, so a Kafka→Kafka group moves over without replay) and its epoch
//! goes up by one, in one committed transaction. From then on the instance moves the offset
//! only by compare-and-set on (the offset it last wrote, its epoch), inside the transaction
//! that writes the rows: another instance that claimed the partition since has a higher
//! epoch, so the stale one's set changes no row, and its transaction must roll back
//! ([`Offsets::advance`] names the partitions so fenced).

use super::{Db, identifier};
use crate::db::{Advance, Claimed, Failure, in_claim_order, partitions_once};

/// The offsets table, for one group, as one owner.
#[derive(Clone, Debug)]
pub struct Offsets {
    table: String,
    /// Where epochs come from: a sequence, so an epoch never repeats, even for a row deleted
    /// and seeded again (a stale owner's epoch must never be current again).
    epochs: String,
    group: String,
    owner: String,
}

impl Offsets {
    /// The table `table` (`schema.table` or `table`), for `group`, as `owner` (the instance's
    /// name, for people reading the table).
    pub fn new(table: &str, group: &str, owner: &str) -> Result<Offsets, String> {
        Ok(Offsets {
            table: identifier(table)?,
            epochs: identifier(&format!("{table}_epoch"))?,
            group: group.to_string(),
            owner: owner.to_string(),
        })
    }

    /// Creates the table and its epochs' sequence if they are missing (only then: a role
    /// that may not create tables can use ones made for it).
    pub fn create(&self, db: &Db) -> Result<(), Failure> {
        if !super::exists(db, &self.epochs)? {
            db.batch(&format!("CREATE SEQUENCE IF NOT EXISTS {}", self.epochs))?;
        }
        if super::exists(db, &self.table)? {
            return Ok(());
        }
        db.batch(&format!(
            "CREATE TABLE IF NOT EXISTS {} (
               group_id text NOT NULL,
               topic text NOT NULL,
               partition integer NOT NULL,
               next_offset bigint,
               owner_epoch bigint NOT NULL DEFAULT 0,
               owner text,
               updated timestamptz NOT NULL DEFAULT now(),
               PRIMARY KEY (group_id, topic, partition))",
            self.table
        ))
    }

    /// Claims `partitions` of `topic`, each with its seed (the group's Kafka offset) for a row
    /// that is missing, in a transaction of its own: where each starts, and its new epoch.
    pub fn claim(
        &self,
        db: &Db,
        topic: &str,
        partitions: &[(i32, Option<i64>)],
    ) -> Result<Vec<Claimed>, Failure> {
        let partitions = in_claim_order(partitions);
        let (ps, seeds): (Vec<i32>, Vec<Option<i64>>) = partitions.into_iter().unzip();
        let seed = format!(
            "INSERT INTO {} (group_id, topic, partition, next_offset)
             SELECT $1, $2, p, o FROM unnest($3::integer[], $4::bigint[]) AS s(p, o)
             ON CONFLICT DO NOTHING",
            self.table
        );
        let claim = format!(
            "UPDATE {} SET owner_epoch = nextval('{}'), owner = $4, updated = now()
             WHERE group_id = $1 AND topic = $2 AND partition = ANY($3)
             RETURNING partition, next_offset, owner_epoch",
            self.table,
            self.epochs.replace('\'', "''"),
        );
        db.batch("BEGIN")?;
        let done = db.call(|c| async move {
            c.execute(&seed, &[&self.group, &topic, &ps, &seeds])
                .await?;
            c.query(&claim, &[&self.group, &topic, &ps, &self.owner])
                .await
        });
        let rows = match done {
            Ok(rows) => rows,
            Err(e) => {
                let _ = db.batch("ROLLBACK");
                return Err(e);
            }
        };
        db.batch("COMMIT")?;
        let mut claimed = rows.iter().map(claimed).collect::<Result<Vec<_>, _>>()?;
        claimed.sort_by_key(|c| c.partition);
        Ok(claimed)
    }

    /// Moves the offsets of `topic` in the open transaction, each by compare-and-set on its
    /// old offset and epoch: the partitions whose row did not move (another owner claimed
    /// them since). With any, the transaction must roll back. A partition twice is refused.
    pub fn advance(&self, db: &Db, topic: &str, moves: &[Advance]) -> Result<Vec<i32>, Failure> {
        let ps = partitions_once(moves)?;
        let from: Vec<Option<i64>> = moves.iter().map(|m| m.from).collect();
        let to: Vec<i64> = moves.iter().map(|m| m.to).collect();
        let epochs: Vec<i64> = moves.iter().map(|m| m.epoch).collect();
        let sql = format!(
            "UPDATE {t} SET next_offset = m.next, updated = now()
             FROM unnest($3::integer[], $4::bigint[], $5::bigint[], $6::bigint[])
               AS m(p, prev, next, epoch)
             WHERE {t}.group_id = $1 AND {t}.topic = $2 AND {t}.partition = m.p
               AND {t}.next_offset IS NOT DISTINCT FROM m.prev AND {t}.owner_epoch = m.epoch
             RETURNING {t}.partition",
            t = self.table
        );
        let partitions = &ps;
        let rows = db.call(|c| async move {
            c.query(
                &sql,
                &[&self.group, &topic, partitions, &from, &to, &epochs],
            )
            .await
        })?;
        let moved = (rows.iter())
            .map(|r| r.try_get(0))
            .collect::<Result<std::collections::BTreeSet<i32>, _>>()?;
        Ok(ps.into_iter().filter(|p| !moved.contains(p)).collect())
    }

    /// What the table holds for `partitions` of `topic`: (partition, next offset, epoch),
    /// for the rows there are.
    pub fn read(&self, db: &Db, topic: &str, partitions: &[i32]) -> Result<Vec<Claimed>, Failure> {
        let sql = format!(
            "SELECT partition, next_offset, owner_epoch FROM {}
             WHERE group_id = $1 AND topic = $2 AND partition = ANY($3) ORDER BY partition",
            self.table
        );
        let rows =
            db.call(|c| async move { c.query(&sql, &[&self.group, &topic, &partitions]).await })?;
        Ok(rows.iter().map(claimed).collect::<Result<Vec<_>, _>>()?)
    }
}

/// A row of (partition, next offset, epoch).
fn claimed(r: &tokio_postgres::Row) -> Result<Claimed, tokio_postgres::Error> {
    Ok(Claimed {
        partition: r.try_get(0)?,
        next: r.try_get(1)?,
        epoch: r.try_get(2)?,
    })
}
