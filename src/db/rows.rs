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

use super::{Db, Failure, identifier};

/// A table as the catalog describes it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Table {
    name: String,
    columns: Vec<String>,
    key: Vec<String>,
}

/// How a batch meets the rows already there.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Write {
    Upsert,
    Insert,
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
    /// `name`'s columns and primary key, from the catalog (the columns a row can set: not
    /// generated ones). A table that is missing is refused, saying so.
    pub fn describe(db: &Db, name: &str) -> Result<Table, String> {
        let quoted = identifier(name)?;
        let sql = "SELECT a.attname::text, coalesce(a.attnum = ANY(i.indkey), false),
                          a.attgenerated = '' AND a.attidentity <> 'a'
                   FROM pg_attribute a
                   LEFT JOIN pg_index i ON i.indrelid = a.attrelid AND i.indisprimary
                   WHERE a.attrelid = $1::text::regclass AND a.attnum > 0 AND NOT a.attisdropped
                   ORDER BY a.attnum";
        let rows = db
            .call(|c| async move { c.query(sql, &[&quoted]).await })
            .map_err(|e| format!("table {name}: {e}"))?;
        let (mut columns, mut key, mut generated_key) = (Vec::new(), Vec::new(), false);
        for r in &rows {
            let failed = |e: tokio_postgres::Error| format!("table {name}: {}", Failure::from(e));
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
            name: identifier(name)?,
            columns,
            key,
        })
    }

    /// Whether rows can be upserted: the table has a primary key that rows set.
    pub fn upsertable(&self) -> Result<(), String> {
        if self.key.is_empty() {
            return Err(format!(
                "table {} has no primary key that rows set (none, or one the server \
                 generates): rows are upserted by it (or choose --db-mode insert)",
                self.name
            ));
        }
        Ok(())
    }

    /// The columns, in the table's order.
    pub fn columns(&self) -> &[String] {
        &self.columns
    }

    /// Writes `rows` (each a JSON object's text: field → column, typed by the server from the
    /// text as written, so no number loses a digit; a field missing is NULL, one without a
    /// column ignored) in the open transaction, each with its index in the batch: a row
    /// replaces the one of its key.
    pub fn upsert(&self, db: &Db, rows: &[(usize, String)]) -> Result<(), Unwritten> {
        self.upsertable()
            .map_err(|e| Unwritten::Batch(Failure::client(e)))?;
        self.write_all(db, rows, Write::Upsert)
    }

    /// [`Table::upsert`], but a row whose key is taken (in the table or earlier in the
    /// batch) is refused (`23505`), as the row's fault.
    pub fn insert(&self, db: &Db, rows: &[(usize, String)]) -> Result<(), Unwritten> {
        self.write_all(db, rows, Write::Insert)
    }

    fn write_all(&self, db: &Db, rows: &[(usize, String)], how: Write) -> Result<(), Unwritten> {
        if rows.is_empty() {
            return Ok(());
        }
        let all: Vec<&(usize, String)> = rows.iter().collect();
        let mut refused = Vec::new();
        (self.bisect(db, &all, how, &mut refused)).map_err(Unwritten::Batch)?;
        if refused.is_empty() {
            return Ok(());
        }
        Err(Unwritten::Rows(refused))
    }

    /// Writes `rows` under a savepoint. Refused for their data, each half is written again the
    /// same way, down to the rows at fault, which go to `refused`: a few statements per bad
    /// row (about 2 log n), not one per row of the batch. Halves go in order, so the last of a
    /// key still wins.
    fn bisect(
        &self,
        db: &Db,
        rows: &[&(usize, String)],
        how: Write,
        refused: &mut Vec<(usize, Failure)>,
    ) -> Result<(), Failure> {
        db.batch("SAVEPOINT exactly_rows")?;
        match self.write(db, rows, how) {
            Ok(()) => db.batch("RELEASE SAVEPOINT exactly_rows"),
            Err(e) if !e.is_data() => Err(e),
            Err(e) => {
                db.batch("ROLLBACK TO SAVEPOINT exactly_rows; RELEASE SAVEPOINT exactly_rows")?;
                if let [row] = rows {
                    refused.push((row.0, e));
                    return Ok(());
                }
                let (first, second) = rows.split_at(rows.len() / 2);
                self.bisect(db, first, how, refused)?;
                self.bisect(db, second, how, refused)
            }
        }
    }

    fn write(&self, db: &Db, rows: &[&(usize, String)], how: Write) -> Result<(), Failure> {
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
            Write::Insert => (String::new(), String::new()),
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
            Write::Insert => format!("{}, r.ordinality", of_r(&key).join(", ")),
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

/// The dead-letter table: a copy of each record that could not be a row, written in the
/// transaction that moves its offset, so a crash neither loses nor doubles it.
#[derive(Clone, Debug)]
pub struct DeadLetters {
    name: String,
}

/// One dead-letter copy.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct DeadLetter {
    /// Why (a reason name), from the copy's headers.
    pub reason: Option<String>,
    /// The lineage of its input.
    pub lineage: Option<String>,
    /// Key bytes.
    pub key: Option<Vec<u8>>,
    /// Value bytes.
    pub value: Option<Vec<u8>>,
    /// The headers, a JSON array of `[name, value]` text pairs in order.
    pub headers: String,
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
