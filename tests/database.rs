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
    jq: String,
    url: String,
}

/// The rows' table of most tests: an identity key, so a duplicate is a second row.
const APPEND_ONLY: &str = "id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
                           n bigint NOT NULL, doubled bigint, lineage text";

impl Pipeline {
    fn new(name: &str, partitions: i32) -> Pipeline {
        Pipeline::with(name, partitions, APPEND_ONLY, "{n, doubled: (.n * 2)}")
    }

    /// A table of `columns`, written through `jq`.
    fn with(name: &str, partitions: i32, columns: &str, jq: &str) -> Pipeline {
        let topics = Topics::create(name, partitions, 1);
        let table = unique(name).replace('-', "_");
        db().batch(&format!("CREATE TABLE \"{table}\" ({columns})"))
            .unwrap();
        Pipeline {
            topics,
            group: unique(&format!("{name}-g")),
            offsets: format!("{table}_offsets"),
            table,
            jq: jq.to_string(),
            url: std::env::var("EXACTLY_TEST_POSTGRES_URL").unwrap(),
        }
    }

    fn args(&self, instance: &str, extra: &[&str]) -> Vec<String> {
        let mut args = base_args(&self.topics, &self.group, instance);
        // Outputs are rows: no output topic.
        let at = args.iter().position(|a| a == "--output-topic").unwrap();
        args.drain(at..at + 2);
        let table = [
            "--db-url",
            &self.url,
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
            &self.jq,
        ];
        args.extend(table.iter().chain(extra).map(|s| s.to_string()));
        args
    }

    fn start(&self, instance: &str, extra: &[&str]) -> Exactly {
        Exactly::start(&self.args(instance, extra))
    }

    /// Every COMMIT of a transaction with a row whose `n` is a multiple of `every` takes
    /// `seconds` (a deferred trigger sleeps in it), so a kill or a terminate finds it there.
    fn slow_commits(&self, seconds: f64, every: i64) {
        db().batch(&format!(
            "CREATE FUNCTION \"{t}_slow\"() RETURNS trigger LANGUAGE plpgsql AS
               $$ BEGIN PERFORM pg_sleep({seconds}); RETURN NULL; END $$;
             CREATE CONSTRAINT TRIGGER slow_commit AFTER INSERT ON \"{t}\"
               DEFERRABLE INITIALLY DEFERRED FOR EACH ROW WHEN (NEW.n % {every} = 0)
               EXECUTE FUNCTION \"{t}_slow\"()",
            t = self.table
        ))
        .unwrap();
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

#[test]
fn rows_the_database_refuses_and_values_that_are_no_rows_go_to_the_dead_letter_table_once() {
    // n % 100 = 7 breaks a CHECK; a `d` that is no number is no bigint; n = 5 is no object.
    let columns = "id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
                   n bigint NOT NULL CHECK (n % 100 <> 7), doubled bigint, lineage text";
    let jq = "if .n == 5 then .n else {n, doubled: .d} end";
    let p = Pipeline::with("db-bad", 2, columns, jq);
    let total = 300;
    let inputs: Vec<In> = (0..total)
        .map(|i| {
            let d = if i % 100 == 3 {
                serde_json::json!("zz")
            } else {
                serde_json::json!(i * 2)
            };
            In::json(
                i as i32 % 2,
                &format!("k{i}"),
                serde_json::json!({"n": i, "d": d}),
            )
        })
        .collect();
    produce(&p.topics.input, &inputs);
    let mut ex = p.start("a", &[]);
    p.wait_committed(total, Duration::from_secs(60), &[&ex]);
    ex.stop_cleanly();
    let db = db();
    let t = &p.table;
    let bad = [3, 5, 7, 103, 107, 203, 207];
    let rows = count(&db, &format!("SELECT count(*) FROM \"{t}\""));
    let distinct = count(&db, &format!("SELECT count(DISTINCT n) FROM \"{t}\""));
    assert_eq!((rows, distinct), (total - 7, total - 7));
    let listed = bad.map(|n| n.to_string()).join(",");
    let written_bad = count(
        &db,
        &format!("SELECT count(*) FROM \"{t}\" WHERE n IN ({listed})"),
    );
    assert_eq!(written_bad, 0);
    // Each bad input's copy once, with why.
    let sql = format!(
        "SELECT convert_from(value, 'UTF8')::json->>'n', reason,
           (SELECT h->>1 FROM jsonb_array_elements(headers) h
            WHERE h->>0 = 'exactly.error.broker')
         FROM \"{t}_dlq\" ORDER BY 1::text"
    );
    let dead = db
        .call(|c| async move { c.query(&sql, &[]).await })
        .unwrap();
    let dead: Vec<(Option<String>, Option<String>, Option<String>)> = dead
        .iter()
        .map(|r| (r.get(0), r.get(1), r.get(2)))
        .collect();
    let mut ns: Vec<i64> = dead
        .iter()
        .map(|d| d.0.as_deref().unwrap().parse().unwrap())
        .collect();
    ns.sort();
    assert_eq!(ns, bad, "{dead:?}");
    let broker = |n: &str| {
        dead.iter()
            .find(|d| d.0.as_deref() == Some(n))
            .unwrap()
            .2
            .clone()
    };
    assert_eq!(broker("7").as_deref(), Some("CHECK_VIOLATION"), "{dead:?}");
    assert_eq!(
        broker("3").as_deref(),
        Some("INVALID_TEXT_REPRESENTATION"),
        "{dead:?}"
    );
    assert_eq!(
        broker("5").as_deref(),
        Some("NOT_A_JSON_OBJECT"),
        "{dead:?}"
    );
    assert!(dead.iter().all(|d| d.1.is_some()), "{dead:?}");
}

#[test]
fn a_paused_instance_whose_partitions_moved_is_fenced_by_the_table_and_writes_nothing() {
    use nix::sys::signal::Signal;

    let p = Pipeline::new("db-zombie", 2);
    let total = 4000;
    let inputs = numbered(total, 2);
    // A commits rarely, so it holds an open unit when it stops.
    let mut a = p.start("a", &["--commit-interval", "3s"]);
    produce(&p.topics.input, &inputs[..1000]);
    p.wait_committed(1000, Duration::from_secs(60), &[&a]);
    produce(&p.topics.input, &inputs[1000..1500]);
    std::thread::sleep(Duration::from_millis(500));
    a.signal(Signal::SIGSTOP);
    // B takes both partitions once A's session times out, claiming them.
    let mut b = p.start("b", &["--commit-interval", "100ms"]);
    produce(&p.topics.input, &inputs[1500..3000]);
    p.wait_committed(3000, Duration::from_secs(90), &[&a, &b]);
    a.signal(Signal::SIGCONT);
    // A's open unit is stale: its compare-and-set changes no row, so nothing of it commits.
    std::thread::sleep(Duration::from_secs(3));
    produce(&p.topics.input, &inputs[3000..]);
    p.wait_committed(total as i64, Duration::from_secs(90), &[&a, &b]);
    a.stop_cleanly();
    b.stop_cleanly();
    p.assert_exactly_once(total as i64);
    let fenced = a.events("transaction aborted");
    assert!(
        fenced.iter().any(|ev| ev["reason"] == "partition_claimed"),
        "A's stale unit was never refused: {}",
        a.log_text()
    );
}

#[test]
fn connections_terminated_or_answers_lost_during_commit_lose_and_double_nothing() {
    // Every COMMIT takes a moment (a deferred trigger sleeps in it), so the killer below finds
    // exactly's connection inside one.
    let mut p = Pipeline::new("db-term", 2);
    let app = unique("exactly-term");
    p.slow_commits(0.2, 500);
    p.url = format!("{}?application_name={app}", p.url);
    let total = 5000;
    let inputs = numbered(total, 2);
    // And every 4th commit's answer is lost after the COMMIT went through.
    let args = [
        "--max-records-per-txn",
        "500",
        "--test-lose-db-commit-answers",
        "4",
    ];
    let mut ex = p.start("a", &args);
    let killer = db();
    let kill = format!(
        "SELECT count(pg_terminate_backend(pid))::bigint FROM pg_stat_activity
         WHERE application_name = '{app}' AND state = 'active' AND query = 'COMMIT'"
    );
    let mut terminated = 0;
    for chunk in inputs.chunks(500) {
        produce(&p.topics.input, chunk);
        let until = Instant::now() + Duration::from_secs(2);
        while Instant::now() < until {
            terminated += count(&killer, &kill);
            std::thread::sleep(Duration::from_millis(20));
        }
    }
    p.wait_committed(total as i64, Duration::from_secs(120), &[&ex]);
    ex.stop_cleanly();
    p.assert_exactly_once(total as i64);
    assert!(
        terminated >= 3,
        "only {terminated} connections terminated in a COMMIT"
    );
    let log = ex.log_text();
    let lost = log.matches("the connection was lost during COMMIT").count();
    assert!(lost >= 3, "{lost} terminated COMMITs: {log}");
    let answers = log.matches("the COMMIT's answer is lost").count();
    let resolved = ex
        .events("a commit whose outcome was unknown had committed")
        .len();
    assert!(
        answers >= 2 && resolved >= answers,
        "{answers} answers lost, {resolved} resolved: {log}"
    );
}

#[test]
fn a_database_that_goes_away_under_load_stalls_exactly_not_ready_and_nothing_is_lost_or_doubled() {
    // A database of its own, so its outage is this test's only.
    let name = unique("db_outage").replace('-', "_");
    let admin = db();
    admin.batch(&format!("CREATE DATABASE \"{name}\"")).unwrap();
    let url = std::env::var("EXACTLY_TEST_POSTGRES_URL").unwrap();
    let url = format!("{}/{name}", url.rsplit_once('/').unwrap().0);
    let mut p = Pipeline::new("db-outage", 2);
    p.url = url.clone();
    let password = std::env::var("EXACTLY_TEST_STORE_PASSWORD").unwrap();
    let bounds = Bounds {
        statement: Duration::from_secs(10),
        idle_in_transaction: Duration::from_secs(30),
    };
    let own = Db::connect(&url, Some(&password), bounds).unwrap();
    own.batch(&format!("CREATE TABLE \"{}\" ({APPEND_ONLY})", p.table))
        .unwrap();
    drop(own);
    let total = 4000;
    let inputs = numbered(total, 2);
    produce(&p.topics.input, &inputs[..1000]);
    let mut ex = p.start("a", &["--db-statement-timeout", "2s"]);
    let addr = http_addr(&ex);
    let committed = |db: &Db| {
        let sql = format!(
            "SELECT coalesce(sum(next_offset), 0)::bigint FROM \"{}\"",
            p.offsets
        );
        db.call(|c| async move { c.query_one(&sql, &[]).await })
            .map_or(0, |r| r.get(0))
    };
    let wait = |n: i64| {
        let deadline = Instant::now() + Duration::from_secs(90);
        loop {
            let db = Db::connect(&url, Some(&password), bounds);
            if db.is_ok_and(|db| committed(&db) >= n) {
                return;
            }
            assert!(Instant::now() < deadline, "{}", ex.log_text());
            std::thread::sleep(Duration::from_millis(200));
        }
    };
    wait(1000);
    // The outage: no connections, the open ones ended, while records keep coming.
    admin
        .batch(&format!(
            "ALTER DATABASE \"{name}\" WITH ALLOW_CONNECTIONS false;
             SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = '{name}'"
        ))
        .unwrap();
    produce(&p.topics.input, &inputs[1000..3000]);
    let deadline = Instant::now() + Duration::from_secs(30);
    while get(&addr, "/readyz").map(|(s, _)| s) != Some(503) {
        assert!(
            Instant::now() < deadline,
            "/readyz never 503 while the database was down"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    std::thread::sleep(Duration::from_secs(5));
    // Alive all along: waiting out an outage is not a stuck loop.
    assert_eq!(get(&addr, "/livez").map(|(s, _)| s), Some(200));
    admin
        .batch(&format!(
            "ALTER DATABASE \"{name}\" WITH ALLOW_CONNECTIONS true"
        ))
        .unwrap();
    produce(&p.topics.input, &inputs[3000..]);
    wait(total as i64);
    let deadline = Instant::now() + Duration::from_secs(30);
    while get(&addr, "/readyz").map(|(s, _)| s) != Some(200) {
        assert!(
            Instant::now() < deadline,
            "/readyz not 200 again after the outage"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    ex.stop_cleanly();
    let own = Db::connect(&url, Some(&password), bounds).unwrap();
    let t = &p.table;
    let rows = count(&own, &format!("SELECT count(*) FROM \"{t}\""));
    let distinct = count(&own, &format!("SELECT count(DISTINCT n) FROM \"{t}\""));
    assert_eq!((rows, distinct), (total as i64, total as i64));
}

#[test]
fn two_pipelines_upserting_one_table_both_finish_and_the_table_holds_every_key() {
    // Both write the same keys, in opposite orders of arrival: rows sorted by key in every
    // transaction take their locks in one order, and a deadlock, should one happen, aborts
    // and replays one side.
    let columns = "n bigint PRIMARY KEY, doubled bigint, lineage text";
    let first = Pipeline::with("db-two-a", 2, columns, "{n, doubled: (.n * 2)}");
    let mut second = Pipeline::with("db-two-b", 2, columns, "{n, doubled: (.n * 2)}");
    db().batch(&format!("DROP TABLE \"{}\"", second.table))
        .unwrap();
    second.table = first.table.clone();
    let total = 3000;
    let mut inputs = numbered(total, 2);
    produce(&first.topics.input, &inputs);
    inputs.reverse();
    produce(&second.topics.input, &inputs);
    let upsert = ["--db-mode", "upsert", "--max-records-per-txn", "200"];
    let start = |p: &Pipeline, name: &str| {
        let mut args = p.args(name, &upsert);
        // The second's offsets live in its own table; both write the one rows table.
        let at = args.iter().position(|a| a == "insert").unwrap();
        args.remove(at);
        args.remove(at - 1);
        Exactly::start(&args)
    };
    let (mut a, mut b) = (start(&first, "a"), start(&second, "b"));
    first.wait_committed(total as i64, Duration::from_secs(90), &[&a, &b]);
    second.wait_committed(total as i64, Duration::from_secs(90), &[&a, &b]);
    a.stop_cleanly();
    b.stop_cleanly();
    let db = db();
    let t = &first.table;
    let rows = count(
        &db,
        &format!("SELECT count(*) FROM \"{t}\" WHERE doubled = n * 2"),
    );
    assert_eq!(rows, total as i64);
}

#[test]
fn killed_at_random_moments_under_load_every_input_is_one_row() {
    // Kill -9 wherever it lands: inside a transaction's statements, inside COMMIT, between
    // the COMMIT and the group's copy, in a rebalance's claim. Bounded: 8 kills.
    let p = Pipeline::new("db-kills", 3);
    // Most of the time is spent inside COMMIT (a deferred trigger sleeps there), so most
    // kills land in one: the server goes on and commits for the dead process, and only the
    // table knows.
    p.slow_commits(0.05, 100);
    let total = 16_000;
    let inputs = numbered(total, 3);
    let args = ["--commit-interval", "30ms", "--max-records-per-txn", "300"];
    let mut delays = [350u64, 120, 800, 60, 500, 230, 900, 40].into_iter();
    let mut ex = p.start("a", &args);
    for chunk in inputs.chunks(total / 8) {
        let before = p.committed(&db());
        produce(&p.topics.input, chunk);
        let Some(delay) = delays.next() else { break };
        // Once it has started on the chunk, so the kill finds it at work.
        p.wait_committed(before + 1, Duration::from_secs(60), &[&ex]);
        std::thread::sleep(Duration::from_millis(delay));
        ex.kill9();
        ex = p.start("a", &args);
    }
    p.wait_committed(total as i64, Duration::from_secs(120), &[&ex]);
    ex.stop_cleanly();
    p.assert_exactly_once(total as i64);
}
