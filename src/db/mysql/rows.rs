//! Rows into a MySQL or MariaDB table, in the open transaction: the database sink's outputs,
//! and the dead-letter copies (docs/database.md).
//!
//! A batch is one statement per chunk under `max_allowed_packet`: `INSERT INTO t (…) SELECT …
//! FROM JSON_TABLE(?, '$[*]' COLUMNS(…)) ORDER BY <typed key>, <ordinality> ON DUPLICATE KEY
//! UPDATE c = VALUES(c)`. `JSON_TABLE` runs with strict mode off (MariaDB), so its columns are
//! text (a number's text as written: no digit lost) and the strict `INSERT` types them:
//! `"asd"` for an `INT` is an error, never a 0. Text columns take a JSON string unquoted and
//! any other value as its JSON text (as PostgreSQL's `json_populate_recordset` does);
//! `BOOLEAN` (`tinyint(1)`) columns take `true` and `false`; JSON columns the value itself.
//! Rows go in by key and, within a key, in the order they came, so the last of a key wins
//! and writers of one table take its row locks in one order. A batch refused for its data is
//! written again in halves under savepoints, down to the rows at fault.

use mysql_async::Value;
use mysql_async::prelude::Queryable;

use super::{Conn, column, identifier, schema_and_table, text};
use crate::db::{
    DeadLetter, DeadLetterRead, Described, Failure, Kind, Savepoint, Unwritten, Write, write_all,
};

/// How a column takes its field's JSON value.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Shape {
    /// The value's text (numbers as written, a string unquoted), typed by the column.
    Plain,
    /// Text: a string unquoted, anything else as its JSON text.
    Text,
    /// A JSON column: the value as it is.
    Json,
    /// `tinyint(1)`: `true` and `false` as 1 and 0.
    Bool,
}

/// How a key column is ordered: by its typed value, so that rows of one key (`1`, `"1"`)
/// are neighbours and every writer orders them alike.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Sort {
    Signed,
    Unsigned,
    Decimal,
    /// By the column's collation (`abc` and `ABC` one key under a case-blind one).
    Collated {
        charset: String,
        collation: String,
    },
    AsIs,
}

#[derive(Clone, Debug, PartialEq, Eq)]
struct Column {
    name: String,
    shape: Shape,
    sort: Sort,
    /// AUTO_INCREMENT: a row without a value for it takes the server's.
    generated_when_null: bool,
}

/// A table as the catalog describes it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Table {
    name: String,
    columns: Vec<Column>,
    /// Indexes into `columns`, in the primary key's order (empty: no key rows set).
    key: Vec<usize>,
    /// A unique index besides the primary key, if any (an upsert would fire on it too).
    other_unique: Option<String>,
}

/// A catalog row's text, refused when it is not text.
fn field(row: &mut mysql_async::Row, i: usize, what: &str) -> Result<String, Failure> {
    Ok(text(row, i, what)?.unwrap_or_default())
}

/// A catalog row of `information_schema.COLUMNS` as a column a row can set, or the name of a
/// generated one (`Err`); `checks`: the table's CHECK clauses (MariaDB's JSON is LONGTEXT with
/// a json_valid CHECK).
fn catalogued(
    r: &mut mysql_async::Row,
    checks: &[String],
) -> Result<Result<Column, String>, Failure> {
    let name = field(r, 0, "COLUMN_NAME")?;
    let data_type = field(r, 1, "DATA_TYPE")?.to_ascii_lowercase();
    let column_type = field(r, 2, "COLUMN_TYPE")?.to_ascii_lowercase();
    let extra = field(r, 3, "EXTRA")?.to_ascii_lowercase();
    let charset = field(r, 4, "CHARACTER_SET_NAME")?;
    let collation = field(r, 5, "COLLATION_NAME")?;
    if ["virtual", "stored", "persistent"]
        .iter()
        .any(|g| extra.contains(g))
    {
        return Ok(Err(name));
    }
    let json_check = format!("json_valid(`{name}`)");
    let shape = match data_type.as_str() {
        "json" => Shape::Json,
        _ if checks.iter().any(|c| c.eq_ignore_ascii_case(&json_check)) => Shape::Json,
        _ if column_type.starts_with("tinyint(1)") => Shape::Bool,
        "char" | "varchar" | "tinytext" | "text" | "mediumtext" | "longtext" | "enum" | "set" => {
            Shape::Text
        }
        _ => Shape::Plain,
    };
    let sort = match data_type.as_str() {
        "tinyint" | "smallint" | "mediumint" | "int" | "integer" | "bigint"
            if column_type.contains("unsigned") =>
        {
            Sort::Unsigned
        }
        "tinyint" | "smallint" | "mediumint" | "int" | "integer" | "bigint" => Sort::Signed,
        "decimal" | "float" | "double" => Sort::Decimal,
        _ if !charset.is_empty() && !collation.is_empty() && shape == Shape::Text => {
            Sort::Collated { charset, collation }
        }
        _ => Sort::AsIs,
    };
    let generated_when_null = extra.contains("auto_increment");
    Ok(Ok(Column {
        name,
        shape,
        sort,
        generated_when_null,
    }))
}

/// The primary key (its columns' places in `columns`; none when the server makes it) and
/// the first other unique index, from the catalog rows of `information_schema.STATISTICS`.
fn keys(
    indexes: Vec<mysql_async::Row>,
    columns: &[Column],
) -> Result<(Vec<usize>, Option<String>), Failure> {
    let (mut key, mut other_unique, mut generated_key) = (Vec::new(), None, false);
    for mut r in indexes {
        let index = field(&mut r, 0, "INDEX_NAME")?;
        let name = field(&mut r, 1, "COLUMN_NAME")?;
        let non_unique = super::bigint(&mut r, 2, "NON_UNIQUE")?.unwrap_or(1);
        if index == "PRIMARY" {
            match columns.iter().position(|c| c.name == name) {
                Some(at) => key.push(at),
                None => generated_key = true,
            }
        } else if non_unique == 0 && other_unique.is_none() {
            other_unique = Some(index);
        }
    }
    if generated_key {
        // The server makes the key: no row names one.
        key.clear();
    }
    Ok((key, other_unique))
}

impl Table {
    /// `name`'s columns (those a row can set: not generated ones), primary key and unique
    /// indexes, from the catalog. A table that is missing, or not InnoDB (a failed statement
    /// would not roll back), is refused, saying so.
    pub fn describe(conn: &Conn, name: &str) -> Result<Table, Failure> {
        let setup = Failure::setup;
        let quoted = identifier(name).map_err(setup)?;
        let (schema, table) = schema_and_table(name).map_err(setup)?;
        let whose = "TABLE_SCHEMA = COALESCE(?, DATABASE()) AND TABLE_NAME = ?";
        let params = || (schema.clone(), table.clone());
        let engine: Option<Option<String>> = conn.call(async |c| {
            c.exec_first(
                format!("SELECT ENGINE FROM information_schema.TABLES WHERE {whose}"),
                params(),
            )
            .await
        })?;
        match engine {
            None => return Err(setup(format!("table {name} does not exist"))),
            Some(Some(e)) if e.eq_ignore_ascii_case("InnoDB") => {}
            Some(e) => {
                return Err(setup(format!(
                    "table {name} is {}, not InnoDB: a statement that fails would not roll back",
                    e.unwrap_or_default()
                )));
            }
        }
        let rows: Vec<mysql_async::Row> = conn.call(async |c| {
            c.exec(
                format!(
                    "SELECT COLUMN_NAME, DATA_TYPE, COLUMN_TYPE, EXTRA, CHARACTER_SET_NAME,
                            COLLATION_NAME
                     FROM information_schema.COLUMNS WHERE {whose} ORDER BY ORDINAL_POSITION"
                ),
                params(),
            )
            .await
        })?;
        let indexes: Vec<mysql_async::Row> = conn.call(async |c| {
            c.exec(
                format!(
                    "SELECT INDEX_NAME, COLUMN_NAME, NON_UNIQUE FROM information_schema.STATISTICS
                     WHERE {whose} ORDER BY INDEX_NAME, SEQ_IN_INDEX"
                ),
                params(),
            )
            .await
        })?;
        // MariaDB's JSON is LONGTEXT with a json_valid CHECK.
        let checks: Vec<String> = if conn.mariadb() {
            conn.call(async |c| {
                c.exec(
                    "SELECT CHECK_CLAUSE FROM information_schema.CHECK_CONSTRAINTS
                     WHERE CONSTRAINT_SCHEMA = COALESCE(?, DATABASE()) AND TABLE_NAME = ?",
                    params(),
                )
                .await
            })?
        } else {
            Vec::new()
        };
        let (mut columns, mut generated) = (Vec::new(), Vec::new());
        for mut r in rows {
            match catalogued(&mut r, &checks)? {
                Ok(c) => columns.push(c),
                Err(name) => generated.push(name),
            }
        }
        if columns.is_empty() && generated.is_empty() {
            return Err(setup(format!("table {name} has no columns")));
        }
        let (key, other_unique) = keys(indexes, &columns)?;
        Ok(Table {
            name: quoted,
            columns,
            key,
            other_unique,
        })
    }

    /// The columns and key, as the sink checks them.
    pub fn described(&self) -> Described {
        Described {
            columns: self.columns.iter().map(|c| c.name.clone()).collect(),
            key: self
                .key
                .iter()
                .map(|i| self.columns[*i].name.clone())
                .collect(),
        }
    }

    /// A unique index besides the primary key, if the table has one.
    pub fn other_unique(&self) -> Option<&str> {
        self.other_unique.as_deref()
    }

    /// Writes `rows` (each a JSON object's text) in the open transaction, each with its index
    /// in the batch. A batch refused for its data is written again in halves down to the rows
    /// at fault.
    pub fn write(
        &self,
        conn: &Conn,
        rows: &[(usize, String)],
        how: Write,
    ) -> Result<(), Unwritten> {
        if how != Write::Insert && self.key.is_empty() {
            return Err(Unwritten::Batch(Failure::client(format!(
                "table {} has no key to upsert by",
                self.name
            ))));
        }
        let sql = self.statement(how);
        let savepoint = |s: Savepoint| {
            conn.call(async |c| match s {
                Savepoint::Set => c.query_drop("SAVEPOINT exactly_rows").await,
                Savepoint::Release => c.query_drop("RELEASE SAVEPOINT exactly_rows").await,
                Savepoint::Undo => {
                    c.query_drop("ROLLBACK TO SAVEPOINT exactly_rows").await?;
                    c.query_drop("RELEASE SAVEPOINT exactly_rows").await
                }
            })
        };
        let budget = budget(conn.max_packet());
        write_all(
            rows,
            &|some| write_chunks(conn, &sql, some, budget),
            &savepoint,
        )
    }

    /// The rows of one JSON array parameter, as `FROM JSON_TABLE(?, …) AS r`, and each
    /// column's value typed from it, in the table's order.
    fn source(&self) -> (String, Vec<String>) {
        let mut defs = vec![format!("{ORDINALITY} FOR ORDINALITY")];
        let mut values = Vec::new();
        for c in &self.columns {
            let (name, r) = (column(&c.name), format!("r.{}", column(&c.name)));
            defs.push(match c.shape {
                Shape::Plain => format!(
                    "{name} LONGTEXT CHARACTER SET utf8mb4 PATH '{}' ERROR ON ERROR",
                    path(&c.name)
                ),
                _ => format!("{name} JSON PATH '{}'", path(&c.name)),
            });
            values.push(expression(&c.shape, &r));
        }
        let from = format!(
            "FROM JSON_TABLE(?, '$[*]' COLUMNS({})) AS r",
            defs.join(", ")
        );
        (from, values)
    }

    /// The statement that writes one JSON array of rows.
    fn statement(&self, how: Write) -> String {
        let (from, values) = self.source();
        if how == Write::Delete {
            let keys: Vec<String> = (self.key.iter().enumerate())
                .map(|(n, i)| format!("{} AS k{n}", values[*i]))
                .collect();
            let on: Vec<String> = (self.key.iter().enumerate())
                .map(|(n, i)| format!("t.{} = e.k{n}", column(&self.columns[*i].name)))
                .collect();
            return format!(
                "DELETE t FROM {tbl} AS t JOIN (SELECT {keys} {from}) AS e ON {on}",
                tbl = self.name,
                keys = keys.join(", "),
                on = on.join(" AND "),
            );
        }
        let names: Vec<String> = self.columns.iter().map(|c| column(&c.name)).collect();
        let mut order: Vec<String> = (self.key.iter())
            .map(|i| sort(&self.columns[*i].sort, &values[*i]))
            .collect();
        order.push(format!("r.{ORDINALITY}"));
        let upsert = match how {
            Write::Insert | Write::Delete => String::new(),
            Write::Upsert => {
                let update: Vec<String> = (self.columns.iter().enumerate())
                    .filter(|(i, _)| !self.key.contains(i))
                    .map(|(_, c)| format!("{0} = VALUES({0})", column(&c.name)))
                    .collect();
                match update.is_empty() {
                    // Every column is the key: the row is there already.
                    true => format!("ON DUPLICATE KEY UPDATE {0} = {0}", names[self.key[0]]),
                    false => format!("ON DUPLICATE KEY UPDATE {}", update.join(", ")),
                }
            }
        };
        format!(
            "INSERT INTO {t} ({names}) SELECT {values} {from} ORDER BY {order} {upsert}",
            t = self.name,
            names = names.join(", "),
            values = values.join(", "),
            order = order.join(", "),
        )
    }

    /// The lineage of every row, and how many rows have none.
    pub fn lineages(&self, conn: &Conn, lineage: &str) -> Result<(Vec<String>, usize), Failure> {
        let sql = format!("SELECT {} FROM {}", column(lineage), self.name);
        let rows: Vec<mysql_async::Row> = conn.call(async |c| c.query(sql).await)?;
        let (mut lineages, mut without) = (Vec::with_capacity(rows.len()), 0);
        for mut r in rows {
            match text(&mut r, 0, lineage)? {
                Some(l) => lineages.push(l),
                None => without += 1,
            }
        }
        Ok((lineages, without))
    }

    /// The expected `rows` (JSON objects with their lineage in `lineage`) whose row of that
    /// lineage differs, and in which columns: each expected value typed as a write types it,
    /// compared as the server compares it with the column (`<=>`).
    pub fn differing(
        &self,
        conn: &Conn,
        rows: &[(usize, String)],
        lineage: &str,
    ) -> Result<Vec<(usize, Vec<String>)>, Failure> {
        let (from, values) = self.source();
        let at = |name: &str| self.columns.iter().position(|c| c.name == name);
        let l = at(lineage).ok_or_else(|| Failure::client(format!("no column {lineage}")))?;
        let differs: Vec<(String, String)> = (self.columns.iter().enumerate())
            .filter(|(i, _)| *i != l)
            .map(|(i, c)| {
                let name = column(&c.name);
                let same = match c.generated_when_null {
                    // The server's value stands where the row has none.
                    true => format!("{0} IS NULL OR {0} <=> t.{name}", values[i]),
                    false => format!("{} <=> t.{name}", values[i]),
                };
                (c.name.clone(), format!("NOT ({same})"))
            })
            .collect();
        if differs.is_empty() {
            return Ok(Vec::new());
        }
        let names: Vec<String> = (differs.iter())
            .map(|(n, d)| format!("IF({d}, {}, NULL)", literal(n)))
            .collect();
        let any: Vec<&str> = differs.iter().map(|(_, d)| d.as_str()).collect();
        let sql = format!(
            "SELECT r.{ORDINALITY}, CONCAT_WS(CHAR(31), {names}) {from}
             JOIN {t} AS t ON t.{lc} = {le} WHERE {any}",
            t = self.name,
            names = names.join(", "),
            lc = column(lineage),
            le = values[l],
            any = any.join(" OR "),
        );
        self.compare(conn, rows, &sql, |r| {
            let names = text(r, 1, "columns")?.unwrap_or_default();
            Ok(names.split('\u{1f}').map(str::to_string).collect())
        })
    }

    /// For each expected row, the lineage of the row at its key (`None`: none there, or no
    /// key rows set).
    pub fn holders(
        &self,
        conn: &Conn,
        rows: &[(usize, String)],
        lineage: &str,
    ) -> Result<Vec<(usize, Option<String>)>, Failure> {
        if self.key.is_empty() {
            return Ok(rows.iter().map(|(i, _)| (*i, None)).collect());
        }
        let (from, values) = self.source();
        let on: Vec<String> = (self.key.iter())
            .map(|i| format!("t.{} = {}", column(&self.columns[*i].name), values[*i]))
            .collect();
        let sql = format!(
            "SELECT r.{ORDINALITY}, t.{l} {from} LEFT JOIN {t} AS t ON {on}",
            t = self.name,
            l = column(lineage),
            on = on.join(" AND "),
        );
        self.compare(conn, rows, &sql, |r| text(r, 1, lineage))
    }

    /// Runs `sql` (over one JSON array of rows; its first column the row's ordinality in it)
    /// on `rows` in batches: each answer with its row's index.
    fn compare<T>(
        &self,
        conn: &Conn,
        rows: &[(usize, String)],
        sql: &str,
        take: impl Fn(&mut mysql_async::Row) -> Result<T, Failure>,
    ) -> Result<Vec<(usize, T)>, Failure> {
        crate::db::compare(rows, |json| {
            let got: Vec<mysql_async::Row> = conn.call(async |c| c.exec(sql, (json,)).await)?;
            (got.into_iter())
                .map(|mut r| {
                    let ordinality = super::bigint(&mut r, 0, "ordinality")?.unwrap_or_default();
                    Ok((ordinality, take(&mut r)?))
                })
                .collect()
        })
    }
}

/// The ordinality column of a batch's `JSON_TABLE`.
const ORDINALITY: &str = "`exactly ordinality`";

/// A text as an SQL literal (the session's sql_mode has backslash escapes).
fn literal(s: &str) -> String {
    format!("'{}'", s.replace('\\', "\\\\").replace('\'', "''"))
}

/// The JSON path of field `name`, as an SQL string literal's contents: `$."name"`.
fn path(name: &str) -> String {
    let json = name.replace('\\', "\\\\").replace('"', "\\\"");
    format!("$.\"{json}\"")
        .replace('\\', "\\\\")
        .replace('\'', "''")
}

/// The value `r` (a `JSON_TABLE` column) becomes for a column of `shape`.
fn expression(shape: &Shape, r: &str) -> String {
    let text = format!("CAST({r} AS CHAR CHARACTER SET utf8mb4)");
    match shape {
        Shape::Plain => r.to_string(),
        Shape::Text => format!(
            "CASE JSON_TYPE({r}) WHEN 'STRING' THEN CONVERT(JSON_UNQUOTE({r}) USING utf8mb4) \
             WHEN 'NULL' THEN NULL ELSE {text} END"
        ),
        Shape::Json => format!("CASE JSON_TYPE({r}) WHEN 'NULL' THEN NULL ELSE {r} END"),
        Shape::Bool => format!(
            "CASE JSON_TYPE({r}) WHEN 'NULL' THEN NULL WHEN 'BOOLEAN' THEN {text} = 'true' \
             WHEN 'STRING' THEN JSON_UNQUOTE({r}) ELSE {text} END"
        ),
    }
}

/// How `value` (a column's expression) is ordered as a key.
fn sort(sort: &Sort, value: &str) -> String {
    match sort {
        Sort::Signed => format!("CAST({value} AS SIGNED)"),
        Sort::Unsigned => format!("CAST({value} AS UNSIGNED)"),
        Sort::Decimal => format!("CAST({value} AS DECIMAL(65, 30))"),
        Sort::Collated { charset, collation } => {
            let plain = |s: &str| s.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
            if plain(charset) && plain(collation) {
                format!("CONVERT({value} USING {charset}) COLLATE {collation}")
            } else {
                value.to_string()
            }
        }
        Sort::AsIs => value.to_string(),
    }
}

/// Bytes of rows per statement: under the server's `max_allowed_packet` (with room for the
/// statement), and at most 16 MiB.
fn budget(max_packet: usize) -> usize {
    max_packet
        .saturating_sub(64 << 10)
        .clamp(64 << 10, 16 << 20)
}

/// Writes `rows` with `sql`, as many statements as the budget needs. A row alone over the
/// budget is the row's fault.
fn write_chunks(
    conn: &Conn,
    sql: &str,
    rows: &[&(usize, String)],
    budget: usize,
) -> Result<(), Failure> {
    let mut start = 0;
    while start < rows.len() {
        let (mut end, mut bytes) = (start, 2);
        while end < rows.len() && (end == start || bytes + rows[end].1.len() < budget) {
            bytes += rows[end].1.len() + 1;
            end += 1;
        }
        if bytes > budget {
            return Err(Failure {
                kind: Kind::Data("ROW_TOO_LARGE"),
                ..Failure::client(format!(
                    "a row of {bytes} bytes, over max_allowed_packet's room of {budget}"
                ))
            });
        }
        let mut json = String::with_capacity(bytes);
        json.push('[');
        for (i, (_, row)) in rows[start..end].iter().copied().enumerate() {
            if i > 0 {
                json.push(',');
            }
            json.push_str(row);
        }
        json.push(']');
        conn.call(async |c| c.exec_drop(sql, (json,)).await)?;
        start = end;
    }
    Ok(())
}

/// The dead-letter table: a copy of each record that could not be a row, written in the
/// transaction that moves its offset, so a crash neither loses nor doubles it.
#[derive(Clone, Debug)]
pub struct DeadLetters {
    name: String,
    quoted: String,
}

impl DeadLetters {
    /// The table `name`.
    pub fn new(name: &str) -> Result<DeadLetters, String> {
        Ok(DeadLetters {
            quoted: identifier(name)?,
            name: name.to_string(),
        })
    }

    /// Creates the table if it is missing (only then: a role that may not create tables can
    /// use one made for it).
    pub fn create(&self, conn: &Conn) -> Result<(), Failure> {
        if super::exists(conn, &self.name)? {
            return Ok(());
        }
        conn.batch(&format!(
            "CREATE TABLE IF NOT EXISTS {} (
               id BIGINT NOT NULL AUTO_INCREMENT PRIMARY KEY,
               reason TEXT, lineage TEXT, `key` LONGBLOB, value LONGBLOB,
               headers JSON NOT NULL,
               written TIMESTAMP(6) NOT NULL DEFAULT CURRENT_TIMESTAMP(6))
             ENGINE=InnoDB DEFAULT CHARSET=utf8mb4",
            self.quoted
        ))
    }

    /// Every copy's lineage and reason.
    pub fn read(&self, conn: &Conn) -> Result<Vec<DeadLetterRead>, Failure> {
        let sql = format!("SELECT lineage, reason FROM {}", self.quoted);
        let rows: Vec<mysql_async::Row> = conn.call(async |c| c.query(sql).await)?;
        let mut out = Vec::with_capacity(rows.len());
        for mut r in rows {
            out.push(DeadLetterRead {
                lineage: text(&mut r, 0, "lineage")?,
                reason: text(&mut r, 1, "reason")?,
            });
        }
        Ok(out)
    }

    /// Writes `copies` in the open transaction, in statements under the packet budget.
    pub fn write(&self, conn: &Conn, copies: &[DeadLetter]) -> Result<(), Failure> {
        let budget = budget(conn.max_packet());
        let size = |c: &DeadLetter| {
            let len = |b: &Option<Vec<u8>>| b.as_ref().map_or(0, Vec::len);
            len(&c.key) + len(&c.value) + c.headers.len() + 256
        };
        let mut start = 0;
        while start < copies.len() {
            let (mut end, mut bytes) = (start, 0);
            while end < copies.len()
                && end - start < 500
                && (end == start || bytes + size(&copies[end]) < budget)
            {
                bytes += size(&copies[end]);
                end += 1;
            }
            let chunk = &copies[start..end];
            let mut params: Vec<Value> = Vec::with_capacity(chunk.len() * 5);
            for c in chunk {
                params.extend([
                    Value::from(c.reason.as_deref()),
                    Value::from(c.lineage.as_deref()),
                    Value::from(c.key.clone()),
                    Value::from(c.value.clone()),
                    Value::from(c.headers.as_str()),
                ]);
            }
            let sql = format!(
                "INSERT INTO {} (reason, lineage, `key`, value, headers) VALUES {}",
                self.quoted,
                vec!["(?, ?, ?, ?, ?)"; chunk.len()].join(", ")
            );
            conn.call(async |c| c.exec_drop(sql, params).await)?;
            start = end;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn field_paths_are_quoted_for_json_and_for_sql() {
        assert_eq!(path("amount"), "$.\"amount\"");
        // A quote and a backslash in a name: escaped for the JSON path, then for SQL.
        assert_eq!(path("it's \"x\""), "$.\"it''s \\\\\"x\\\\\"\"");
    }

    #[test]
    fn statements_sort_by_the_typed_key_and_update_the_other_columns() {
        let table = Table {
            name: "`t`".into(),
            columns: vec![
                Column {
                    name: "id".into(),
                    shape: Shape::Plain,
                    sort: Sort::Signed,
                    generated_when_null: false,
                },
                Column {
                    name: "name".into(),
                    shape: Shape::Text,
                    sort: Sort::Collated {
                        charset: "utf8mb4".into(),
                        collation: "utf8mb4_general_ci".into(),
                    },
                    generated_when_null: false,
                },
            ],
            key: vec![0],
            other_unique: None,
        };
        let upsert = table.statement(Write::Upsert);
        assert!(
            upsert.contains("ORDER BY CAST(r.`id` AS SIGNED), r.`exactly ordinality`"),
            "{upsert}"
        );
        assert!(
            upsert.contains("ON DUPLICATE KEY UPDATE `name` = VALUES(`name`)"),
            "{upsert}"
        );
        assert!(
            upsert.contains("`id` LONGTEXT CHARACTER SET utf8mb4 PATH '$.\"id\"' ERROR ON ERROR")
        );
        let insert = table.statement(Write::Insert);
        assert!(!insert.contains("ON DUPLICATE"), "{insert}");
    }

    #[test]
    fn chunks_stay_under_the_packet_budget() {
        assert_eq!(budget(4 << 20), (4 << 20) - (64 << 10));
        assert_eq!(budget(1 << 30), 16 << 20);
        assert_eq!(budget(1000), 64 << 10);
    }
}
