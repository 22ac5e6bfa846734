//! Offsets in Redis (`redis://host:port/db`), as the Spark Streaming recipes keep them: one hash
//! per topic and group, `--redis-key` (`offset:{topic}:{group}` by default; `{topic}` alone is
//! the other common layout), whose fields are partition ids and values the next offset to read
//! (`HSET` / `HGETALL`). A password comes from `--password-env` or `--password-file` (AUTH).

use std::collections::HashMap;
use std::time::Duration;

use super::{OffsetStore, Offsets, StoreOptions, bad_value, no_password_in, redact};
use crate::error::Error;

/// A Redis server holding offset hashes.
pub struct RedisStore {
    client: redis::Client,
    url: String,
    key: String,
    timeout: Duration,
}

impl RedisStore {
    /// The store at a `redis://` URL.
    pub fn new(url: &str, options: &StoreOptions) -> Result<RedisStore, Error> {
        no_password_in(url, "the redis URL")?;
        if !options.redis_key.contains("{topic}") {
            return Err(Error::Config(format!(
                "--redis-key: '{}' has no {{topic}}: every topic would share one hash",
                options.redis_key
            )));
        }
        use redis::IntoConnectionInfo;
        let bad = |e: redis::RedisError| Error::Config(format!("'{url}' is not a Redis URL: {e}"));
        let mut info = url.into_connection_info().map_err(bad)?;
        // The password goes into the connection itself: the client authenticates (with the
        // URL's user, if any) before it selects the URL's database.
        if let Some(pw) = &options.password {
            let settings = info.redis_settings().clone().set_password(pw.expose());
            info = info.set_redis_settings(settings);
        }
        let client = redis::Client::open(info).map_err(bad)?;
        Ok(RedisStore {
            client,
            url: url.to_string(),
            key: options.redis_key.clone(),
            timeout: options.timeout,
        })
    }

    fn key(&self, topic: &str, group: &str) -> String {
        self.key.replace("{topic}", topic).replace("{group}", group)
    }

    fn connect(&self) -> Result<redis::Connection, Error> {
        let failed = |e: redis::RedisError| Error::Store(format!("{}: {e}", redact(&self.url)));
        let con = self
            .client
            .get_connection_with_timeout(self.timeout)
            .map_err(failed)?;
        con.set_read_timeout(Some(self.timeout)).map_err(failed)?;
        con.set_write_timeout(Some(self.timeout)).map_err(failed)?;
        Ok(con)
    }
}

impl OffsetStore for RedisStore {
    fn read(&self, group: &str, partitions: &[(String, i32)]) -> Result<Offsets, Error> {
        let mut con = self.connect()?;
        let mut out = Offsets::new();
        let mut topics: Vec<&String> = partitions.iter().map(|(t, _)| t).collect();
        topics.sort();
        topics.dedup();
        for topic in topics {
            let key = self.key(topic, group);
            let hash: HashMap<String, String> = redis::cmd("HGETALL")
                .arg(&key)
                .query(&mut con)
                .map_err(|e| Error::Store(format!("{}: HGETALL {key}: {e}", redact(&self.url))))?;
            for (field, value) in hash {
                let store = format!("redis {key}");
                // "00" is not partition 0: two fields for one partition would be a guess.
                let partition: i32 = field
                    .parse()
                    .ok()
                    .filter(|p: &i32| p.to_string() == field)
                    .ok_or_else(|| bad_value(&store, "a field (partition)", &field))?;
                let offset: i64 = value.parse().map_err(|_| {
                    bad_value(&store, &format!("partition {partition}'s offset"), &value)
                })?;
                if partitions
                    .iter()
                    .any(|(t, p)| t == topic && *p == partition)
                {
                    out.insert((topic.clone(), partition), offset);
                }
            }
        }
        Ok(out)
    }

    fn write(&self, group: &str, offsets: &Offsets) -> Result<(), Error> {
        let mut con = self.connect()?;
        let mut by_topic: HashMap<&str, Vec<(i32, i64)>> = HashMap::new();
        for ((t, p), o) in offsets {
            by_topic.entry(t).or_default().push((*p, *o));
        }
        // All topics in one MULTI/EXEC: an export is written whole or not at all.
        let mut pipe = redis::pipe();
        pipe.atomic();
        for (topic, fields) in by_topic {
            let cmd = pipe.cmd("HSET").arg(self.key(topic, group));
            for (p, o) in fields {
                cmd.arg(p).arg(o);
            }
        }
        pipe.query::<()>(&mut con)
            .map_err(|e| Error::Store(format!("{}: HSET: {e}", redact(&self.url))))
    }
}
