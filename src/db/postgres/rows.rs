//! Rows into a table, in the open transaction: the database sink's outputs (docs/database.md).
//!
//! A batch is one statement: `INSERT … SELECT DISTINCT ON (key) … FROM
//! json_populate_recordset(null::table, $1) WITH ORDINALITY … ON CONFLICT (key) DO UPDATE`,
//! so the server types every value by its column's input function, keeps the last row of each
//! key (one statement may not update a row twice; `1` and `"1"` are one key once typed) and
//! sorts by the typed key, so two pipelines writing one table take its row locks in one order
//! and cannot deadlock on each other. A batch the server refuses for its data (classes 22, 23
//! and 54) is written again in halves under savepoints, down to the rows at fault; the others
//! are written.

use super::{Db, identifier};
use crate::db::{
    DeadLetter, DeadLetterRead, Described, Failure, Savepoint, Unwritten, Write, write_all,
};

/// A table as the catalog describes it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Table {
    name: String,
    columns: Vec<String>,
    key: Vec<String>,
}

impl Table {
    /// `name`'s columns and primary key, from the catalog (the columns a row can set: not
    /// generated ones). A table that is missing is refused, saying so.
    pub fn describe(db: &Db, name: &str) -> Result<Table, Failure> {
        let setup = Failure::setup;
        let quoted = identifier(name).map_err(setup)?;
        let sql = "SELECT a.attname::text, coalesce(a.attnum = ANY(i.indkey), false),
                          a.attgenerated = '' AND a.attidentity <> 'a'
                   FROM pg_attribute a
                   LEFT JOIN pg_index i ON i.indrelid = a.attrelid AND i.indisprimary
                   WHERE a.attrelid = $1::text::regclass AND a.attnum > 0 AND NOT a.attisdropped
                   ORDER BY a.attnum";
        let asked = quoted.clone();
        let rows = db
            .call(|c| async move { c.query(sql, &[&asked]).await })
            .map_err(|e| Failure {
                message: format!("table {name}: {e}"),
                ..e
            })?;
        let (mut columns, mut key, mut generated_key) = (Vec::new(), Vec::new(), false);
        for r in &rows {
            let failed = |e: tokio_postgres::Error| Failure::from(e);
            let column: String = r.try_get(0).map_err(failed)?;
            let in_key: bool = r.try_get(1).map_err(failed)?;
            let writable: bool = r.try_get(2).map_err(failed)?;
            match (in_key, writable) {
                (true, true) => key.push(column.clone()),
                (true, false) => generated_key = true,
                _ => {}
            }
            if writable {
                columns.push(column);
            }
        }
        if generated_key {
            // The server makes the key: no row names one.
            key.clear();
        }
        Ok(Table {
            name: quoted,
            columns,
            key,
        })
    }

    /// The columns and key, as the sink checks them.
    pub fn described(&self) -> Described {
        Described {
            columns: self.columns.clone(),
            key: self.key.clone(),
        }
    }

    /// Writes `rows` (each a JSON object's text: field → column, typed by the server from the
    /// text as written, so no number loses a digit; a field missing is NULL, one without a
    /// column ignored) in the open transaction, each with its index in the batch. A batch
    /// refused for its data is written again in halves down to the rows at fault.
    pub fn write(&self, db: &Db, rows: &[(usize, String)], how: Write) -> Result<(), Unwritten> {
        if how != Write::Insert && self.key.is_empty() {
            return Err(Unwritten::Batch(Failure::client(format!(
                "table {} has no key to upsert by",
                self.name
            ))));
        }
        let savepoint = |s: Savepoint| {
            db.batch(match s {
                Savepoint::Set => "SAVEPOINT exactly_rows",
                Savepoint::Release => "RELEASE SAVEPOINT exactly_rows",
                Savepoint::Undo => {
                    "ROLLBACK TO SAVEPOINT exactly_rows; RELEASE SAVEPOINT exactly_rows"
                }
            })
        };
        write_all(rows, &|some| self.statement(db, some, how), &savepoint)
    }

    /// The lineage of every row, and how many rows have none.
    pub fn lineages(&self, db: &Db, column: &str) -> Result<(Vec<String>, usize), Failure> {
        let sql = format!("SELECT {} FROM {}", quote(column), self.name);
        let rows = db.call(|c| async move { c.query(&sql, &[]).await })?;
        let (mut lineages, mut without) = (Vec::with_capacity(rows.len()), 0);
        for r in &rows {
            match r.try_get::<_, Option<String>>(0)? {
                Some(l) => lineages.push(l),
                None => without += 1,
            }
        }
        Ok((lineages, without))
    }

    /// The expected `rows` (JSON objects with their lineage in `column`) whose row of that
    /// lineage differs, and in which columns; both sides typed by the columns (`to_jsonb`:
    /// every type compares, json too).
    pub fn differing(
        &self,
        db: &Db,
        rows: &[(usize, String)],
        column: &str,
    ) -> Result<Vec<(usize, Vec<String>)>, Failure> {
        let compared: Vec<&String> = self.columns.iter().filter(|c| *c != column).collect();
        let differs =
            |c: &String| format!("to_jsonb(e.{0}) IS DISTINCT FROM to_jsonb(t.{0})", quote(c));
        let names: Vec<String> = (compared.iter())
            .map(|c| format!("CASE WHEN {} THEN {} END", differs(c), literal(c)))
            .collect();
        let any: Vec<String> = compared.iter().map(|c| differs(c)).collect();
        if any.is_empty() {
            return Ok(Vec::new());
        }
        let sql = format!(
            "SELECT e.ordinality::bigint, array_remove(ARRAY[{names}]::text[], NULL)
             FROM json_populate_recordset(null::{t}, $1::text::json) WITH ORDINALITY AS e
             JOIN {t} AS t ON t.{l} = e.{l}
             WHERE {any}",
            t = self.name,
            l = quote(column),
            names = names.join(", "),
            any = any.join(" OR "),
        );
        self.compare(db, rows, &sql, |r| Ok(r.try_get::<_, Vec<String>>(1)?))
    }

    /// For each expected row, the lineage of the row at its key (`None`: none there, or no
    /// key rows set).
    pub fn holders(
        &self,
        db: &Db,
        rows: &[(usize, String)],
        column: &str,
    ) -> Result<Vec<(usize, Option<String>)>, Failure> {
        if self.key.is_empty() {
            return Ok(rows.iter().map(|(i, _)| (*i, None)).collect());
        }
        let on: Vec<String> = (self.key.iter())
            .map(|k| format!("t.{0} = e.{0}", quote(k)))
            .collect();
        let sql = format!(
            "SELECT e.ordinality::bigint, t.{l}
             FROM json_populate_recordset(null::{t}, $1::text::json) WITH ORDINALITY AS e
             LEFT JOIN {t} AS t ON {on}",
            t = self.name,
            l = quote(column),
            on = on.join(" AND "),
        );
        self.compare(db, rows, &sql, |r| Ok(r.try_get::<_, Option<String>>(1)?))
    }

    /// Runs `sql` (over `$1`, a JSON array of rows; its first column the row's ordinality
    /// in it) on `rows` in batches: each answer with its row's index.
    fn compare<T>(
        &self,
        db: &Db,
        rows: &[(usize, String)],
        sql: &str,
        take: impl Fn(&tokio_postgres::Row) -> Result<T, Failure>,
    ) -> Result<Vec<(usize, T)>, Failure> {
        crate::db::compare(rows, |json| {
            let got = db.call(|c| async move { c.query(sql, &[&json]).await })?;
            (got.iter())
                .map(|r| Ok((r.try_get::<_, i64>(0)?, take(r)?)))
                .collect()
        })
    }

    /// One statement writing `rows`.
    fn statement(&self, db: &Db, rows: &[&(usize, String)], how: Write) -> Result<(), Failure> {
        let mut json = String::with_capacity(rows.iter().map(|r| r.1.len() + 1).sum::<usize>() + 2);
        json.push('[');
        for (i, (_, row)) in rows.iter().copied().enumerate() {
            if i > 0 {
                json.push(',');
            }
            json.push_str(row);
        }
        json.push(']');
        let quote = |c: &String| format!("\"{}\"", c.replace('"', "\"\""));
        let columns: Vec<String> = self.columns.iter().map(quote).collect();
        let key: Vec<String> = self.key.iter().map(quote).collect();
        if how == Write::Delete {
            let on: Vec<String> = key.iter().map(|k| format!("t.{k} = r.{k}")).collect();
            let sql = format!(
                "DELETE FROM {t} AS t
                 USING json_populate_recordset(null::{t}, $1::text::json) AS r
                 WHERE {on}",
                t = self.name,
                on = on.join(" AND "),
            );
            return db
                .call(|c| async move { c.execute(&sql, &[&json]).await })
                .map(|_| ());
        }
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
        let (distinct, on_conflict) = match how {
            Write::Upsert => (
                format!("DISTINCT ON ({})", of_r(&key).join(", ")),
                on_conflict,
            ),
            // Every row, so a key twice in the batch is refused as one in the table is.
            Write::Insert | Write::Delete => (String::new(), String::new()),
        };
        let on_conflict = if on_conflict.is_empty() {
            String::new()
        } else {
            format!("ON CONFLICT ({}) {on_conflict}", key.join(", "))
        };
        // By the typed key (the last of a key first, for DISTINCT ON), so that writers of
        // one table lock its rows in one order; without a key, as they came.
        let order = match how {
            _ if key.is_empty() => "r.ordinality".to_string(),
            Write::Upsert => format!("{}, r.ordinality DESC", of_r(&key).join(", ")),
            Write::Insert | Write::Delete => format!("{}, r.ordinality", of_r(&key).join(", ")),
        };
        let sql = format!(
            "INSERT INTO {t} ({cols})
             SELECT {distinct} {r_cols}
             FROM json_populate_recordset(null::{t}, $1::text::json) WITH ORDINALITY AS r
             ORDER BY {order}
             {on_conflict}",
            t = self.name,
            cols = columns.join(", "),
            r_cols = of_r(&columns).join(", "),
        );
        db.call(|c| async move { c.execute(&sql, &[&json]).await })
            .map(|_| ())
    }
}

/// A column name quoted.
fn quote(c: &str) -> String {
    format!("\"{}\"", c.replace('"', "\"\""))
}

/// A text as an SQL literal.
fn literal(c: &str) -> String {
    format!("'{}'", c.replace('\'', "''"))
}

/// The dead-letter table: a copy of each record that could not be a row, written in the
/// transaction that moves its offset, so a crash neither loses nor doubles it.
#[derive(Clone, Debug)]
pub struct DeadLetters {
    name: String,
}

impl DeadLetters {
    /// The table `name`.
    pub fn new(name: &str) -> Result<DeadLetters, String> {
        Ok(DeadLetters {
            name: identifier(name)?,
        })
    }

    /// Creates the table if it is missing (only then: a role that may not create tables can
    /// use one made for it).
    pub fn create(&self, db: &Db) -> Result<(), Failure> {
        if super::exists(db, &self.name)? {
            return Ok(());
        }
        db.batch(&format!(
            "CREATE TABLE IF NOT EXISTS {} (
               id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
               reason text,
               lineage text,
               key bytea,
               value bytea,
               headers jsonb NOT NULL,
               written timestamptz NOT NULL DEFAULT now())",
            self.name
        ))
    }

    /// Every copy's lineage and reason.
    pub fn read(&self, db: &Db) -> Result<Vec<DeadLetterRead>, Failure> {
        let sql = format!("SELECT lineage, reason FROM {}", self.name);
        let rows = db.call(|c| async move { c.query(&sql, &[]).await })?;
        let read = |r: &tokio_postgres::Row| {
            Ok::<_, Failure>(DeadLetterRead {
                lineage: r.try_get(0)?,
                reason: r.try_get(1)?,
            })
        };
        rows.iter().map(read).collect()
    }

    /// Writes `copies` in the open transaction.
    pub fn write(&self, db: &Db, copies: &[DeadLetter]) -> Result<(), Failure> {
        if copies.is_empty() {
            return Ok(());
        }
        let reasons: Vec<Option<&str>> = copies.iter().map(|c| c.reason.as_deref()).collect();
        let lineages: Vec<Option<&str>> = copies.iter().map(|c| c.lineage.as_deref()).collect();
        let keys: Vec<Option<&[u8]>> = copies.iter().map(|c| c.key.as_deref()).collect();
        let values: Vec<Option<&[u8]>> = copies.iter().map(|c| c.value.as_deref()).collect();
        let headers: Vec<&str> = copies.iter().map(|c| c.headers.as_str()).collect();
        let sql = format!(
            "INSERT INTO {} (reason, lineage, key, value, headers)
             SELECT r, l, k, v, h::jsonb
             FROM unnest($1::text[], $2::text[], $3::bytea[], $4::bytea[], $5::text[])
               AS d(r, l, k, v, h)",
            self.name
        );
        let params = (&reasons, &lineages, &keys, &values, &headers);
        db.call(|c| async move {
            let (r, l, k, v, h) = params;
            c.execute(&sql, &[r, l, k, v, h]).await
        })
        .map(|_| ())
    }
}
