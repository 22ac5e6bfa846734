//! The database sink end to end: the real broker, a real PostgreSQL 15 (`scripts/stores.sh`),
//! the `exactly` binary writing rows and offsets in one database transaction, killed with
//! SIGKILL and restarted, and a second instance fencing a paused one. Every input's row must
//! be there exactly once: the tables are append-only (`--db-mode insert`, an identity key),
//! so a duplicate would be a second row, never an overwrite.

mod common;

use std::time::{Duration, Instant};

use common::*;
use exactly::db::{Bounds, Db};

fn db() -> Db {
    let url = std::env::var("EXACTLY_TEST_POSTGRES_URL")
        .expect("EXACTLY_TEST_POSTGRES_URL: run the tests through scripts/test.sh");
    let password = std::env::var("EXACTLY_TEST_STORE_PASSWORD").unwrap();
    let bounds = Bounds {
        statement: Duration::from_secs(10),
        idle_in_transaction: Duration::from_secs(30),
    };
    Db::connect(&url, Some(&password), bounds).expect("connected")
}

fn count(db: &Db, sql: &str) -> i64 {
    let row = db.call(|c| async move { c.query_one(sql, &[]).await });
    row.unwrap().get(0)
}

/// A pipeline into `table` (created here: an identity key, the input's `n`, its lineage).
struct Pipeline {
    topics: Topics,
    group: String,
    table: String,
    offsets: String,
}

impl Pipeline {
    fn new(name: &str, partitions: i32) -> Pipeline {
        let topics = Topics::create(name, partitions, 1);
        let table = unique(name).replace('-', "_");
        db().batch(&format!(
            "CREATE TABLE \"{table}\" (
               id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
               n bigint NOT NULL,
               doubled bigint,
               lineage text)"
        ))
        .unwrap();
        Pipeline {
            topics,
            group: unique(&format!("{name}-g")),
            offsets: format!("{table}_offsets"),
            table,
        }
    }

    fn args(&self, instance: &str, extra: &[&str]) -> Vec<String> {
        let mut args = base_args(&self.topics, &self.group, instance);
        // Outputs are rows: no output topic.
        let at = args.iter().position(|a| a == "--output-topic").unwrap();
        args.drain(at..at + 2);
        let url = std::env::var("EXACTLY_TEST_POSTGRES_URL").unwrap();
        let table = [
            "--db-url",
            &url,
            "--db-table",
            &self.table,
            "--db-mode",
            "insert",
            "--db-offsets-table",
            &self.offsets,
            "--db-lineage-column",
            "lineage",
            "--db-password-env",
            "EXACTLY_TEST_STORE_PASSWORD",
            "--jq",
            "{n, doubled: (.n * 2)}",
        ];
        args.extend(table.iter().chain(extra).map(|s| s.to_string()));
        args
    }

    fn start(&self, instance: &str, extra: &[&str]) -> Exactly {
        Exactly::start(&self.args(instance, extra))
    }

    /// The offsets table's next offsets, summed over the partitions (0 before exactly
    /// created the table).
    fn committed(&self, db: &Db) -> i64 {
        let sql = format!(
            "SELECT coalesce(sum(next_offset), 0)::bigint FROM \"{}\" WHERE group_id = '{}'",
            self.offsets, self.group
        );
        let row = db.call(|c| async move { c.query_one(&sql, &[]).await });
        row.map_or(0, |r| r.get(0))
    }

    fn wait_committed(&self, n: i64, timeout: Duration, ex: &[&Exactly]) {
        let (db, deadline) = (db(), Instant::now() + timeout);
        while self.committed(&db) < n {
            if Instant::now() > deadline {
                let logs: Vec<String> = ex.iter().map(|e| e.log_text()).collect();
                panic!(
                    "{} of {n} committed after {timeout:?}; logs:\n{}",
                    self.committed(&db),
                    logs.join("\n----\n")
                );
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// Every n of 0..total exactly once, each doubled, each with its input's lineage.
    fn assert_exactly_once(&self, total: i64) {
        let db = db();
        let t = &self.table;
        let rows = count(&db, &format!("SELECT count(*) FROM \"{t}\""));
        let distinct = count(&db, &format!("SELECT count(DISTINCT n) FROM \"{t}\""));
        let doubled = count(
            &db,
            &format!(
                "SELECT count(*) FROM \"{t}\" WHERE doubled = n * 2 AND n >= 0 AND n < {total}"
            ),
        );
        let lineages = count(
            &db,
            &format!(
                "SELECT count(DISTINCT lineage) FROM \"{t}\" WHERE lineage LIKE '{}/%/%/0'",
                self.topics.input
            ),
        );
        assert_eq!(
            (rows, distinct, doubled, lineages),
            (total, total, total, total),
            "rows, distinct inputs, correct rows, distinct lineages"
        );
    }
}

#[test]
fn rows_and_offsets_commit_together_across_kill_9_and_the_group_gets_a_copy() {
    let p = Pipeline::new("db-kill", 3);
    let total = 6000;
    let inputs = numbered(total, 3);
    produce(&p.topics.input, &inputs[..2000]);
    let mut ex = p.start("a", &["--commit-interval", "50ms"]);
    p.wait_committed(500, Duration::from_secs(60), &[&ex]);
    ex.kill9();
    produce(&p.topics.input, &inputs[2000..4000]);
    // Killed between a database commit and the group's copy of it: the table is ahead of
    // the group, and the next start must take the table's offsets.
    let crash = [
        "--max-records-per-txn",
        "100",
        "--test-crash-after-db-commit",
        "5",
    ];
    let mut ex = p.start("a", &crash);
    let status = ex.wait(Duration::from_secs(60));
    assert!(!status.success(), "{}", ex.log_text());
    let (in_table, in_group) = (
        p.committed(&db()),
        committed_total(&p.group, &p.topics.input),
    );
    assert!(in_table > in_group, "table {in_table}, group {in_group}");
    let mut ex = p.start("a", &["--commit-interval", "50ms"]);
    p.wait_committed(2500, Duration::from_secs(60), &[&ex]);
    ex.kill9();
    produce(&p.topics.input, &inputs[4000..]);
    let mut ex = p.start("a", &["--commit-interval", "50ms"]);
    p.wait_committed(total as i64, Duration::from_secs(60), &[&ex]);
    p.assert_exactly_once(total as i64);
    // The Kafka group holds a copy, for the lag tools.
    let deadline = Instant::now() + Duration::from_secs(30);
    while committed_total(&p.group, &p.topics.input) < total as i64 {
        assert!(Instant::now() < deadline, "the group never got the copy");
        std::thread::sleep(Duration::from_millis(200));
    }
    ex.stop_cleanly();
    p.assert_exactly_once(total as i64);
}
