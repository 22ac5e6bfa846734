//! Reading a partition's changelog back: the restore on assign.
//!
//! A `read_committed` consumer in no group reads the partition from its beginning until its
//! position reaches the end taken with `read_uncommitted`, the high watermark. Not the last
//! stable offset: the broker confirms a commit before it writes the markers, so the LSO can
//! stop short of the previous owner's last commit (KAFKA-10167; Kafka Streams'
//! `StoreChangelogReader` does the same). librdkafka moves the position past transaction
//! markers and aborted records, so a tail of them ends the read too. A previous owner that
//! died inside a transaction holds the end back until the broker aborts it (its transaction
//! timeout): the read is bounded, and the caller tries again.

use std::time::{Duration, Instant};

use tokio_util::sync::CancellationToken;

use crate::kafka::admin::Admin;
use crate::kafka::ends::Ends;
use crate::kafka::reader::Reader;
use crate::kafka::{Isolation, NotCreated, Role, Settings};

/// What a read hands each record to: its offset, key and value.
pub type Each<'e> = dyn FnMut(i64, Option<&[u8]>, Option<&[u8]>) + 'e;

/// What a read got to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Read {
    /// Records handed out.
    pub records: u64,
    /// The offset it read to (the high watermark when it began): the next read starts here.
    pub end: i64,
    /// When the last record it read was written (ms since the epoch), if it read one: how old
    /// the state it read back is.
    pub written: Option<i64>,
}

/// Why a read did not get to the end.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Unread {
    /// The offset asked for is not in the partition (deleted by retention, or the topic is
    /// another one of that name): read it from the beginning instead.
    OutOfRange(String),
    /// Not now (the cluster, a previous owner's open transaction): try again later.
    Failed(String),
    /// The changelog has no such partition (the input grew since it was made): grow it.
    Missing(String),
}

impl std::fmt::Display for Unread {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Unread::OutOfRange(s) | Unread::Failed(s) | Unread::Missing(s) => f.write_str(s),
        }
    }
}

/// Where a partition's committed changes are read back from.
pub trait Changelog: Send {
    /// Hands every committed record of changelog partition `partition` to `each` (its key and
    /// value), from offset `from` (`None`: the beginning) to the end.
    fn read(
        &mut self,
        partition: i32,
        from: Option<i64>,
        each: &mut Each<'_>,
    ) -> Result<Read, Unread>;
    /// The partition's end now (its high watermark): everything committed is below it.
    fn end(&mut self, partition: i32) -> Result<i64, String>;
    /// Grows the changelog to `partitions` (the input grew); an error says why it could not.
    fn grow(&mut self, partitions: usize) -> Result<(), String> {
        Err(format!(
            "this changelog cannot grow to {partitions} partitions"
        ))
    }
}

/// A changelog with nothing in it: state that starts from nothing (the audit's replay).
pub struct Empty;

impl Changelog for Empty {
    fn read(&mut self, _: i32, _: Option<i64>, _: &mut Each<'_>) -> Result<Read, Unread> {
        Ok(Read {
            records: 0,
            end: 0,
            written: None,
        })
    }

    fn end(&mut self, _: i32) -> Result<i64, String> {
        Ok(0)
    }
}

/// A changelog topic on the cluster.
pub struct KafkaChangelog {
    topic: String,
    reader: Reader,
    /// Asks for high watermarks (`read_uncommitted`).
    meter: Ends,
    /// The longest one read may take.
    bound: Duration,
    shutdown: CancellationToken,
    /// Grows the topic: an admin client, and the runtime its calls run on.
    grower: Option<(Admin, tokio::runtime::Handle)>,
}

impl KafkaChangelog {
    /// Reads `topic` with `kafka`'s settings; one read takes at most `bound`, and stops when
    /// `shutdown` is cancelled.
    pub fn new(
        kafka: &Settings,
        topic: &str,
        bound: Duration,
        shutdown: CancellationToken,
    ) -> Result<KafkaChangelog, NotCreated> {
        let meter = Role::EndOffsets {
            isolation: Isolation::ReadUncommitted,
        };
        Ok(KafkaChangelog {
            topic: topic.to_string(),
            reader: Reader::create(&kafka.client(Role::Restore))?,
            meter: Ends::create(&kafka.client(meter))?,
            bound,
            shutdown,
            grower: None,
        })
    }

    /// It grows through `admin`, whose calls run on `runtime` (the loop's thread is none of
    /// its).
    pub fn growing(mut self, admin: Admin, runtime: tokio::runtime::Handle) -> KafkaChangelog {
        self.grower = Some((admin, runtime));
        self
    }

    fn position(&self, partition: i32) -> Option<i64> {
        self.reader.position(&self.topic, partition)
    }
}

impl Changelog for KafkaChangelog {
    fn read(
        &mut self,
        partition: i32,
        from: Option<i64>,
        each: &mut Each<'_>,
    ) -> Result<Read, Unread> {
        let started = Instant::now();
        let deadline = started + self.bound;
        let at = |what: &str| format!("changelog {}[{partition}]: {what}", self.topic);
        let failed = |what: &str| Unread::Failed(at(what));
        let (low, high) = self
            .meter
            .watermarks(&self.topic, partition, self.bound)
            .map_err(|e| match e.unknown_partition() {
                true => Unread::Missing(at("no such partition (the input grew since it was made)")),
                false => failed(&format!("its end offsets: {e}")),
            })?;
        let done = |records, written| Read {
            records,
            end: high,
            written,
        };
        let offset = match from {
            // Past the end: not the changelog the store was written from (recreated).
            Some(o) if o > high => {
                return Err(Unread::OutOfRange(at(&format!(
                    "offset {o} is past its end {high}"
                ))));
            }
            // Before its start: retention deleted what is older (keys of windows long closed,
            // which the store may hold and drop): read what is left.
            Some(o) if o < low => None,
            Some(o) if o == high => return Ok(done(0, None)),
            Some(o) => Some(o),
            None if high <= low => return Ok(done(0, None)),
            None => None,
        };
        self.reader
            .assign(&self.topic, partition, offset)
            .map_err(|e| failed(&format!("assign: {e}")))?;
        let (mut read, mut written) = (0u64, None);
        let result = loop {
            if self.shutdown.is_cancelled() {
                break Err(failed("shutdown began"));
            }
            if Instant::now() >= deadline {
                break Err(failed(&format!(
                    "not read to offset {high} within {:?} (at {:?}): a previous owner's \
                     transaction may still be open",
                    self.bound,
                    self.position(partition)
                )));
            }
            // Short: at the tail only markers are left, and the position check below ends it.
            match self.reader.poll(Duration::from_millis(10)) {
                Some(Ok(m)) => {
                    each(m.offset(), m.key(), m.value());
                    read += 1;
                    written = m.timestamp().or(written);
                    if m.offset() + 1 >= high {
                        break Ok(done(read, written));
                    }
                }
                Some(Err(e)) => break Err(failed(&e.to_string())),
                None => {
                    // Markers and aborted records at the tail move the position only.
                    if self.position(partition).is_some_and(|p| p >= high) {
                        break Ok(done(read, written));
                    }
                }
            }
        };
        self.reader.unassign();
        result
    }

    fn end(&mut self, partition: i32) -> Result<i64, String> {
        let (_, high) = self
            .meter
            .watermarks(&self.topic, partition, self.bound)
            .map_err(|e| format!("changelog {}[{partition}]: its end: {e}", self.topic))?;
        Ok(high)
    }

    fn grow(&mut self, partitions: usize) -> Result<(), String> {
        let Some((admin, runtime)) = &self.grower else {
            return Err(format!(
                "changelog {}: no admin client to grow it",
                self.topic
            ));
        };
        let grown = super::topic::grow(admin, &self.topic, partitions, self.bound);
        runtime.block_on(grown)
    }
}
