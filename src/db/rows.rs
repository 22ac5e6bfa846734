//! Rows into a table, in the open transaction: the database sink's outputs (docs/database.md).
//!
//! A batch is one statement: `INSERT … SELECT DISTINCT ON (key) … FROM
//! json_populate_recordset(null::table, $1) WITH ORDINALITY … ON CONFLICT (key) DO UPDATE`,
//! so the server types every value by its column's input function, keeps the last row of each
//! key (one statement may not update a row twice; `1` and `"1"` are one key once typed) and
//! sorts by the typed key, so two pipelines writing one table take its row locks in one order
//! and cannot deadlock on each other. A batch the server refuses for its data (classes 22 and
//! 23) is written again row by row, each under a savepoint, to find the rows at fault; the
//! others are written.

use super::{Db, Failure, identifier};

/// A table as the catalog describes it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Table {
    name: String,
    columns: Vec<String>,
    key: Vec<String>,
}

/// What `upsert` could not write.
#[derive(Debug)]
pub enum Unwritten {
    /// These rows (their indexes in the batch) are refused for what they hold; the others are
    /// written.
    Rows(Vec<(usize, Failure)>),
    /// The batch is not written (the database's failure, not a row's).
    Batch(Failure),
}

impl Table {
    /// `name`'s columns and primary key, from the catalog. A table that is missing, or has no
    /// primary key, is refused, saying so.
    pub fn describe(db: &Db, name: &str) -> Result<Table, String> {
        let quoted = identifier(name)?;
        let sql = "SELECT a.attname::text, coalesce(a.attnum = ANY(i.indkey), false)
                   FROM pg_attribute a
                   LEFT JOIN pg_index i ON i.indrelid = a.attrelid AND i.indisprimary
                   WHERE a.attrelid = $1::text::regclass AND a.attnum > 0 AND NOT a.attisdropped
                     AND a.attgenerated = '' AND a.attidentity <> 'a'
                   ORDER BY a.attnum";
        let rows = db
            .call(|c| async move { c.query(sql, &[&quoted]).await })
            .map_err(|e| format!("table {name}: {e}"))?;
        let (mut columns, mut key) = (Vec::new(), Vec::new());
        for r in &rows {
            let failed = |e: tokio_postgres::Error| format!("table {name}: {}", Failure::from(e));
            let column: String = r.try_get(0).map_err(failed)?;
            let in_key: bool = r.try_get(1).map_err(failed)?;
            if in_key {
                key.push(column.clone());
            }
            columns.push(column);
        }
        if key.is_empty() {
            return Err(format!(
                "table {name} has no primary key: rows are upserted by it"
            ));
        }
        Ok(Table {
            name: identifier(name)?,
            columns,
            key,
        })
    }

    /// The columns, in the table's order.
    pub fn columns(&self) -> &[String] {
        &self.columns
    }

    /// Writes `rows` (JSON objects: field → column; a field missing is NULL) in the open
    /// transaction, each with its index in the batch.
    pub fn upsert(&self, db: &Db, rows: &[(usize, serde_json::Value)]) -> Result<(), Unwritten> {
        if rows.is_empty() {
            return Ok(());
        }
        let all: Vec<&(usize, serde_json::Value)> = rows.iter().collect();
        db.batch("SAVEPOINT exactly_rows")
            .map_err(Unwritten::Batch)?;
        match self.write(db, &all) {
            Ok(()) => {
                return (db.batch("RELEASE SAVEPOINT exactly_rows")).map_err(Unwritten::Batch);
            }
            Err(e) if !e.is_data() => return Err(Unwritten::Batch(e)),
            Err(_) => {}
        }
        // One row or more at fault: each again on its own, under a savepoint, in order (the
        // last of a key still wins).
        db.batch("ROLLBACK TO SAVEPOINT exactly_rows; RELEASE SAVEPOINT exactly_rows")
            .map_err(Unwritten::Batch)?;
        let mut refused = Vec::new();
        for row in all {
            db.batch("SAVEPOINT exactly_row")
                .map_err(Unwritten::Batch)?;
            match self.write(db, &[row]) {
                Ok(()) => db.batch("RELEASE SAVEPOINT exactly_row"),
                Err(e) if e.is_data() => {
                    refused.push((row.0, e));
                    db.batch("ROLLBACK TO SAVEPOINT exactly_row; RELEASE SAVEPOINT exactly_row")
                }
                Err(e) => return Err(Unwritten::Batch(e)),
            }
            .map_err(Unwritten::Batch)?;
        }
        if refused.is_empty() {
            return Ok(());
        }
        Err(Unwritten::Rows(refused))
    }

    fn write(&self, db: &Db, rows: &[&(usize, serde_json::Value)]) -> Result<(), Failure> {
        let json = serde_json::Value::Array(rows.iter().map(|r| r.1.clone()).collect()).to_string();
        let quote = |c: &String| format!("\"{}\"", c.replace('"', "\"\""));
        let columns: Vec<String> = self.columns.iter().map(quote).collect();
        let key: Vec<String> = self.key.iter().map(quote).collect();
        let update: Vec<String> = (self.columns.iter())
            .filter(|c| !self.key.contains(c))
            .map(|c| format!("{0} = EXCLUDED.{0}", quote(c)))
            .collect();
        let on_conflict = if update.is_empty() {
            "DO NOTHING".to_string()
        } else {
            format!("DO UPDATE SET {}", update.join(", "))
        };
        let of_r = |cs: &[String]| cs.iter().map(|c| format!("r.{c}")).collect::<Vec<_>>();
        let sql = format!(
            "INSERT INTO {t} ({cols})
             SELECT DISTINCT ON ({r_key}) {r_cols}
             FROM json_populate_recordset(null::{t}, $1::text::json) WITH ORDINALITY AS r
             ORDER BY {r_key}, r.ordinality DESC
             ON CONFLICT ({key}) {on_conflict}",
            t = self.name,
            cols = columns.join(", "),
            r_cols = of_r(&columns).join(", "),
            r_key = of_r(&key).join(", "),
            key = key.join(", "),
        );
        db.call(|c| async move { c.execute(&sql, &[&json]).await })
            .map(|_| ())
    }
}
