//! Offsets in Redis (`redis://host:port/db`), as the Spark Streaming recipes keep them: a hash
//! per topic (`--redis-key`, `offset:{topic}:{group}` by default, or `{topic}` alone), a field
//! per partition (`--redis-field`, the partition id by default, or `{group}|{partition}` in a
//! hash several groups share), the next offset to read as the value (`HSET` / `HGETALL`). Only
//! this group's fields are read and written: another group's are left as they are. A password
//! comes from `--password-env` or `--password-file` (AUTH).

use std::collections::HashMap;
use std::time::Duration;

use super::{OffsetStore, Offsets, StoreOptions, bad_value, no_password_in, redact};
use crate::error::Error;

/// A Redis server holding offset hashes.
pub struct RedisStore {
    client: redis::Client,
    url: String,
    key: String,
    field: Field,
    timeout: Duration,
}

/// A field pattern: the text before and after `{partition}`, `{group}` not yet filled in.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Field {
    before: String,
    after: String,
}

impl Field {
    fn parse(pattern: &str) -> Result<Field, Error> {
        let Some((before, after)) = pattern.split_once("{partition}") else {
            return Err(Error::Config(format!(
                "--redis-field: '{pattern}' has no {{partition}}"
            )));
        };
        if after.contains("{partition}") {
            return Err(Error::Config(format!(
                "--redis-field: '{pattern}' has {{partition}} twice"
            )));
        }
        Ok(Field {
            before: before.to_string(),
            after: after.to_string(),
        })
    }

    fn has_group(&self) -> bool {
        self.before.contains("{group}") || self.after.contains("{group}")
    }

    /// The field of `partition` for `group`.
    fn of(&self, group: &str, partition: i32) -> String {
        let fill = |s: &str| s.replace("{group}", group);
        format!("{}{partition}{}", fill(&self.before), fill(&self.after))
    }

    /// Which partition `field` is `group`'s field of: `Ok(None)` for a field of another group
    /// (it is not ours to read), an error for one that should be ours and is not.
    fn partition(&self, group: &str, field: &str, store: &str) -> Result<Option<i32>, Error> {
        let (before, after) = (
            self.before.replace("{group}", group),
            self.after.replace("{group}", group),
        );
        let middle = field
            .strip_prefix(before.as_str())
            .and_then(|f| f.strip_suffix(after.as_str()));
        let Some(middle) = middle else {
            if self.has_group() {
                return Ok(None);
            }
            return Err(Error::Config(format!(
                "{store}: the field '{field}' is not of --redis-field's layout"
            )));
        };
        // "00" is not partition 0: two fields for one partition would be a guess.
        let partition = middle
            .parse()
            .ok()
            .filter(|p: &i32| p.to_string() == middle);
        match partition {
            Some(p) => Ok(Some(p)),
            None if !self.has_group() && middle.contains('|') => Err(Error::Config(format!(
                "{store}: the field '{field}' is no partition id: a hash shared by groups? \
                 --redis-field '{{group}}|{{partition}}'"
            ))),
            None => Err(bad_value(store, "a field's partition", middle)),
        }
    }
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
        let field = Field::parse(&options.redis_field)?;
        Ok(RedisStore {
            client,
            url: url.to_string(),
            key: options.redis_key.clone(),
            field,
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
                let Some(partition) = self.field.partition(group, &field, &store)? else {
                    continue;
                };
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
                cmd.arg(self.field.of(group, p)).arg(o);
            }
        }
        pipe.query::<()>(&mut con)
            .map_err(|e| Error::Store(format!("{}: HSET: {e}", redact(&self.url))))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fields_of_this_group_are_read_and_others_left() {
        let shared = Field::parse("{group}|{partition}").unwrap();
        assert_eq!(shared.of("g", 2), "g|2");
        let at = |f: &str| shared.partition("g", f, "redis t");
        assert_eq!(at("g|2").unwrap(), Some(2));
        assert_eq!(at("other|2").unwrap(), None);
        assert_eq!(at("gg|2").unwrap(), None);
        assert!(at("g|02").is_err() && at("g|x").is_err());
        let plain = Field::parse("{partition}").unwrap();
        assert_eq!(plain.of("g", 7), "7");
        assert_eq!(plain.partition("g", "7", "s").unwrap(), Some(7));
        let e = plain
            .partition("g", "g|2", "redis t")
            .unwrap_err()
            .to_string();
        assert!(e.contains("--redis-field '{group}|{partition}'"), "{e}");
        assert!(Field::parse("p").is_err());
        assert!(Field::parse("{partition}{partition}").is_err());
    }
}
