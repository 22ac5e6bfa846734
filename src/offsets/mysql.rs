//! Offsets in MySQL or MariaDB (`mysql://user@host:port/db`), as the Spark Streaming recipes
//! keep them: a table `kafka_offset(group_id, topic, partition_id, fromOffset, untilOffset)`
//! written with `REPLACE INTO`, the job resuming from `untilOffset`. Table and column names are
//! options, over the one description of that table the database sink shares
//! (`db::kafka_offset`); the password comes from `--password-env` or `--password-file`.
//!
//! mysql_async runs on a runtime of this store's own: the offset commands are synchronous.

use mysql_async::prelude::Queryable;

use super::{OffsetStore, Offsets, StoreOptions, bad_value, no_password_in, redact};
use crate::config::offsets::Layout;
use crate::error::Error;

/// A MySQL or MariaDB database holding an offset table.
pub struct MysqlStore {
    opts: mysql_async::Opts,
    url: String,
    layout: Layout,
    timeout: std::time::Duration,
}

impl MysqlStore {
    /// The store at a `mysql://` URL.
    pub fn new(url: &str, options: &StoreOptions) -> Result<MysqlStore, Error> {
        no_password_in(url, "the mysql URL")?;
        crate::config::offsets::check_layout(&options.mysql)?;
        // The database sink's check: a MySQL URL naming its database, without TLS (this
        // build's client has none).
        let refused = |why: String| Error::Config(format!("'{}': {why}", redact(url)));
        crate::db::mysql::check_url(url).map_err(refused)?;
        // Its message would quote the URL, query parameters and all: not printed.
        let parsed = mysql_async::Opts::from_url(url).map_err(|_| refused("not a URL".into()))?;
        let opts = mysql_async::OptsBuilder::from_opts(parsed)
            .pass(options.password.as_ref().map(|p| p.expose().to_string()))
            .into();
        Ok(MysqlStore {
            opts,
            url: url.to_string(),
            layout: options.mysql.clone(),
            timeout: options.timeout,
        })
    }

    /// Runs `work` on a connection, bounded by the timeout.
    fn with_conn<T>(
        &self,
        work: impl AsyncFnOnce(&mut mysql_async::Conn) -> Result<T, mysql_async::Error>,
    ) -> Result<T, Error> {
        let failed = |e: String| Error::Store(format!("{}: {e}", redact(&self.url)));
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|e| failed(e.to_string()))?;
        runtime.block_on(async {
            let job = async {
                let mut conn = mysql_async::Conn::new(self.opts.clone()).await?;
                let out = work(&mut conn).await;
                let _ = conn.disconnect().await;
                out
            };
            match tokio::time::timeout(self.timeout, job).await {
                Ok(r) => r.map_err(|e| failed(e.to_string())),
                Err(_) => Err(failed(format!("no answer within {:?}", self.timeout))),
            }
        })
    }
}

impl OffsetStore for MysqlStore {
    fn read(&self, group: &str, partitions: &[(String, i32)]) -> Result<Offsets, Error> {
        let l = &self.layout;
        // The recipes keep a row per partition; where a table kept history, the furthest wins.
        let sql = format!(
            // BINARY: names compare byte for byte, not by the column's (case-blind) collation.
            "SELECT `{p}`, MAX(`{o}`) FROM `{t}` WHERE BINARY `{g}` = ? AND BINARY `{tp}` = ? \
             GROUP BY `{p}`",
            p = l.partition,
            o = l.offset,
            t = l.table,
            g = l.group,
            tp = l.topic
        );
        let mut topics: Vec<&String> = partitions.iter().map(|(t, _)| t).collect();
        topics.sort();
        topics.dedup();
        let rows = self.with_conn(async |conn| {
            let mut rows = Vec::new();
            for topic in &topics {
                // Rows, not typed tuples: a typed read panics on a value that does not convert.
                let got: Vec<mysql_async::Row> =
                    conn.exec(sql.as_str(), (group, topic.as_str())).await?;
                rows.extend(got.into_iter().map(|r| ((*topic).clone(), r)));
            }
            Ok(rows)
        })?;
        let mut out = Offsets::new();
        let l = &self.layout;
        let store = format!("mysql {}", l.table);
        for (topic, mut row) in rows {
            let mut number = |i: usize, what: &str| -> Result<i64, Error> {
                match row.take_opt::<Option<i64>, _>(i) {
                    Some(Ok(Some(n))) => Ok(n),
                    Some(Ok(None)) => Err(bad_value(&store, what, "NULL")),
                    _ => Err(bad_value(&store, what, "not a 64-bit integer")),
                }
            };
            let partition = number(0, &format!("`{}` of topic {topic}", l.partition))?;
            let offset = number(1, &format!("`{}` of {topic}[{partition}]", l.offset))?;
            let partition = i32::try_from(partition)
                .map_err(|_| bad_value(&store, "a partition", &partition.to_string()))?;
            if partitions.contains(&(topic.clone(), partition)) {
                out.insert((topic, partition), offset);
            }
        }
        Ok(out)
    }

    fn write(&self, group: &str, offsets: &Offsets) -> Result<(), Error> {
        let l = &self.layout;
        let (from_col, from_val) = match l.from.as_str() {
            "" => (String::new(), ""),
            f => (format!(", `{f}`"), ", ?"),
        };
        let sql = format!(
            "REPLACE INTO `{t}` (`{g}`, `{tp}`, `{p}`, `{o}`{from_col}) VALUES (?, ?, ?, ?{from_val})",
            t = l.table,
            g = l.group,
            tp = l.topic,
            p = l.partition,
            o = l.offset,
        );
        let with_from = !l.from.is_empty();
        self.with_conn(async |conn| {
            let mut tx = conn.start_transaction(Default::default()).await?;
            for ((topic, partition), offset) in offsets {
                let (t, p, o) = (topic.as_str(), *partition, *offset);
                if with_from {
                    tx.exec_drop(sql.as_str(), (group, t, p, o, o)).await?;
                } else {
                    tx.exec_drop(sql.as_str(), (group, t, p, o)).await?;
                }
            }
            tx.commit().await
        })
    }
}
