//! State kept exactly once: the dedup transform's keys seen per window (issue 24).
//!
//! The design Kafka Streams, Quix and Materialize share. Every state change is also a record
//! in a changelog topic (one partition per input partition), written by the same
//! transactional producer in the same transaction as the outputs and the offsets, so the
//! state, the outputs and the input position move together or not at all. The state in memory
//! is a cache of the changelog: the open unit's changes are a layer of their own until its
//! commit returns OK, and are dropped on an abort or an outcome not known to be a commit
//! ([`seen::Seen`]); a partition assigned to this instance is restored from its changelog
//! before its records are decided.
//!
//! - [`window`]: which window an event time falls in (local days in a time zone, or a fixed
//!   length), and when it closes.
//! - [`seen`]: the keys seen per window, per partition, in the two layers; the verdict for a
//!   record (first, duplicate, late); closed windows dropped in bulk.
//! - [`changelog`]: a change as a Kafka record and back.
//! - [`keeper`]: each owned partition's state, where it comes from and where it goes: read back
//!   at the partition's first record (the store, then the changelog from its mark), the open
//!   unit's changes as changelog records, the store written once a unit commits, its marks
//!   moved up at each checkpoint.
//! - [`restore`]: a partition's changelog read back, to its end (the high watermark).
//! - [`store`]: the local store (`--state-dir`, redb): the committed keys on disk with how far
//!   into the changelog they are, so a restart reads only what came after.
//! - [`topic`]: the changelog topic, created or checked at start.

pub mod changelog;
pub mod keeper;
pub mod restore;
pub mod seen;
pub mod store;
pub mod topic;
pub mod window;
