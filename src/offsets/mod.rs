//! Where a consumer group's offsets are kept: an [`OffsetStore`].
//!
//! The pipeline itself keeps its offsets in the group, inside each transaction (the sink's
//! business). Stores are for the tools around it: the audit reads the group's committed
//! offsets to tell judged inputs from pending ones, and `exactly offsets import|export` moves a
//! position between the group and the stores other jobs kept by hand. One file per store;
//! [`open`] is where a store is registered; [`migrate`] is the commands.
//!
//! - [`group`]: the Kafka consumer group (`kafka:`).
//! - [`redis`]: a hash per topic, fields partition → next offset (`redis://host:port/db`).
//! - [`mysql`]: the `kafka_offset` table of the Spark recipes (`mysql://user@host:port/db`).
//! - [`file`]: JSON or CSV of topic, partition, offset (`file://PATH`; a directory: its last
//!   file by name).

pub mod file;
pub mod group;
pub mod migrate;
pub mod mysql;
pub mod redis;

use std::collections::BTreeMap;

pub use crate::config::offsets::StoreOptions;
use crate::error::Error;

/// The next offset to read, per (topic, partition).
pub type Offsets = BTreeMap<(String, i32), i64>;

/// A place that holds the offsets of consumer groups.
pub trait OffsetStore {
    /// What the store holds for `group` in `partitions` (those with no offset are left out).
    fn read(&self, group: &str, partitions: &[(String, i32)]) -> Result<Offsets, Error>;

    /// Keeps `offsets` for `group`, replacing what the store held for those partitions.
    fn write(&self, group: &str, offsets: &Offsets) -> Result<(), Error>;

    /// Where exactly the offsets are read from, when the URL alone does not say (the file a
    /// directory's offsets are in), for the plan.
    fn describe(&self) -> Option<String> {
        None
    }
}

/// `exactly offsets`: 0 done, 2 bad options or a validation error, 3 could not complete.
pub fn command(args: crate::config::offsets::OffsetsArgs) -> u8 {
    use crate::config::offsets::OffsetsCommand;
    crate::telemetry::init(crate::config::LogFormat::Text, "warn");
    let result = (|| match args.command {
        OffsetsCommand::Show(a) => migrate::show(&a.group.target()?),
        OffsetsCommand::Import(a) => {
            let target = a.group.target()?;
            let store = open(&a.from, &a.store.options(&target)?)?;
            migrate::import(&target, store.as_ref(), a.missing, a.clamp, a.dry_run)
        }
        OffsetsCommand::Export(a) => {
            let target = a.group.target()?;
            let store = open(&a.to, &a.store.options(&target)?)?;
            migrate::export(&target, store.as_ref(), a.dry_run)
        }
    })();
    report(result)
}

/// A tool's outcome: its text on stdout and 0, or the error on stderr and 2 (bad options) or 3
/// (could not complete). `exactly offsets` and `exactly state` answer this way.
pub fn report(result: Result<String, Error>) -> u8 {
    match result {
        Ok(text) => {
            print!("{text}");
            0
        }
        Err(e) => {
            eprintln!("error: {e}");
            if matches!(e, Error::Config(_)) { 2 } else { 3 }
        }
    }
}

/// The store at `url`: one arm per kind of store.
pub fn open(url: &str, options: &StoreOptions) -> Result<Box<dyn OffsetStore>, Error> {
    let scheme = url.split_once(':').map(|(scheme, _)| scheme);
    Ok(match scheme {
        Some("kafka") => Box::new(group::GroupStore::new(
            options.kafka.clone(),
            options.timeout,
        )),
        Some("redis") => Box::new(redis::RedisStore::new(url, options)?),
        Some("mysql") => Box::new(mysql::MysqlStore::new(url, options)?),
        Some("file") => Box::new(file::FileStore::new(url, options.file.as_deref())?),
        _ => {
            return Err(Error::Config(format!(
                "'{}' is not an offset store this build knows \
                 (redis://, mysql://, file://, kafka:)",
                redact(url)
            )));
        }
    })
}

/// A URL for the command line or a log: any password in it (user info, or a `password`/`pass`
/// query parameter) replaced.
pub fn redact(url: &str) -> String {
    let (base, query) = match url.split_once('?') {
        Some((b, q)) => (b, Some(q)),
        None => (url, None),
    };
    let mut out = match (base.split_once("://"), base.rfind('@')) {
        (Some((scheme, rest)), Some(at)) if at > scheme.len() => {
            let userinfo = &rest[..at - scheme.len() - 3];
            match userinfo.split_once(':') {
                Some((user, _)) => format!("{scheme}://{user}:***{}", &base[at..]),
                None => base.to_string(),
            }
        }
        _ => base.to_string(),
    };
    if let Some(q) = query {
        let params: Vec<String> = q
            .split('&')
            .map(|kv| match kv.split_once('=') {
                Some((k, _))
                    if k.eq_ignore_ascii_case("password") || k.eq_ignore_ascii_case("pass") =>
                {
                    format!("{k}=***")
                }
                _ => kv.to_string(),
            })
            .collect();
        out.push('?');
        out.push_str(&params.join("&"));
    }
    out
}

/// Refuses a password written into the URL: it would show in `ps`, shell history and logs.
fn no_password_in(url: &str, flag: &str) -> Result<(), Error> {
    if redact(url) != url {
        return Err(Error::Config(format!(
            "{flag}: '{}' has a password in it; give it with --password-env or --password-file",
            redact(url)
        )));
    }
    Ok(())
}

/// A store's answer that is not a number where an offset or partition should be: bad input,
/// like a bad line in a file.
fn bad_value(store: &str, what: &str, value: &str) -> Error {
    Error::Config(format!("{store}: {what} is '{value}', not a number"))
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::kafka::Settings;

    #[test]
    fn passwords_are_redacted_and_refused() {
        assert_eq!(
            redact("mysql://app:s3cret@db:3306/x"),
            "mysql://app:***@db:3306/x"
        );
        assert_eq!(
            redact("redis://:s3cret@127.0.0.1:6379/0"),
            "redis://:***@127.0.0.1:6379/0"
        );
        assert_eq!(redact("mysql://app@db:3306/x"), "mysql://app@db:3306/x");
        assert_eq!(redact("file:///tmp/a@b.json"), "file:///tmp/a@b.json");
        assert_eq!(
            redact("mysql://app@db/x?password=s3cret&ssl=1"),
            "mysql://app@db/x?password=***&ssl=1"
        );
        let o = StoreOptions::kafka(&kafka(), Duration::from_secs(1));
        let e = open("rediss://:s3cret@h/0", &o).err().unwrap().to_string();
        assert!(!e.contains("s3cret"), "{e}");
        let e = no_password_in("mysql://app:s3cret@db/x", "--from").unwrap_err();
        assert!(!e.to_string().contains("s3cret"), "{e}");
        assert!(e.to_string().contains("--password-env"), "{e}");
    }

    fn kafka() -> Settings {
        Settings {
            bootstrap_servers: "127.0.0.1:9".into(),
            client_id: "t".into(),
            common: Default::default(),
            consumer: Vec::new(),
            producer: Vec::new(),
        }
    }

    #[test]
    fn a_mysql_url_asking_for_tls_is_refused_at_start_not_at_connect() {
        let o = StoreOptions::kafka(&kafka(), Duration::from_secs(1));
        let url = "mysql://spark@127.0.0.1:3306/jobs?require_ssl=true";
        let e = open(url, &o).err().unwrap().to_string();
        assert!(e.contains("TLS"), "{e}");
        assert!(open("mysql://spark@127.0.0.1:3306/jobs", &o).is_ok());
    }

    #[test]
    fn unknown_schemes_are_refused_by_name() {
        let o = StoreOptions::kafka(&kafka(), Duration::from_secs(1));
        let e = open("ftp://x", &o).err().unwrap().to_string();
        assert!(e.contains("ftp://x") && e.contains("redis://"), "{e}");
    }
}
