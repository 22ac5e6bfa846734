//! Helpers for the integration tests: the real broker, topics, test data, the `exactly`
//! process, and an exactly-once checker that reads outputs the way a downstream consumer does.
//!
//! Every test makes its own topics, group and transactional ids ([`unique`]), so tests run in
//! any order and in parallel against one broker.
//!
//! - `broker`: talking to the test broker: its address, unique names, topics, retries, and
//!   admin and offset reads (watermarks, committed offsets, transaction stability).
//! - `data`: test records in and out: inputs and their producers, outputs read back, the
//!   outputs a test expects, and the product's header names.
//! - `process`: running the `exactly` binary (start, signals, log, HTTP address, `audit`),
//!   logged partition assignments, and the external checkers the tests call.
//! - `app`: the call-out's application process (Python), with switches to misbehave.
//! - `http`: a running exactly's endpoints: GET, and metric samples out of `/metrics`.
//! - `checks`: assertions and waits: committed offsets, settled transactions, the exactly-once
//!   check, and the metric families exactly exports.
//! - `cluster`: the three-broker cluster of the cluster fault scenarios: leaders,
//!   coordinators, replication, broker faults (`scripts/cluster.sh`).
//! - `sql`: the test databases (PostgreSQL and MariaDB) reached one way, for the database
//!   sink's tests.
//!
//! Everything is re-exported here, so tests use `common::name` whichever file holds it.

#![allow(dead_code)]

mod app;
mod broker;
mod checks;
mod cluster;
mod data;
mod http;
mod process;
mod sql;

// Each test crate uses only some of the helpers: a re-export it does not use is no warning.
#[allow(unused_imports)]
pub use app::*;
#[allow(unused_imports)]
pub use broker::*;
#[allow(unused_imports)]
pub use checks::*;
#[allow(unused_imports)]
pub use cluster::*;
#[allow(unused_imports)]
pub use data::*;
#[allow(unused_imports)]
pub use http::*;
#[allow(unused_imports)]
pub use process::*;
#[allow(unused_imports)]
pub use sql::*;
