//! The database sink end to end, against a real PostgreSQL 15 and a real MariaDB
//! (`scripts/stores.sh`) and the real broker: the `exactly` binary writing rows and offsets in
//! one database transaction, killed with SIGKILL and restarted, a second instance fencing a
//! paused one, connections ended under it, the database gone and back. Every input's row must
//! be there exactly once: the tables are append-only (`--db-mode insert`, a key the server
//! makes), so a duplicate would be a second row, never an overwrite.

mod common;

use std::time::{Duration, Instant};

use common::*;
use exactly::db::Backend;

/// A pipeline into `table` (created here: a key the server makes, the input's `n`, its
/// lineage).
struct Pipeline {
    backend: Backend,
    topics: Topics,
    group: String,
    table: String,
    offsets: String,
    jq: String,
    url: String,
    /// The server itself (`url` may go through a proxy), and its password.
    server: String,
    password: String,
    /// More `--db-*` flags.
    db_args: Vec<String>,
}

/// The rows' table of most tests: a key the server makes, so a duplicate is a second row.
fn append_only(backend: Backend) -> &'static str {
    match backend {
        Backend::Postgres => {
            "id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
             n bigint NOT NULL, doubled bigint, lineage text"
        }
        Backend::Mysql => {
            "id BIGINT AUTO_INCREMENT PRIMARY KEY,
             n BIGINT NOT NULL, doubled BIGINT, lineage VARCHAR(255)"
        }
    }
}

impl Pipeline {
    fn new(backend: Backend, name: &str, partitions: i32) -> Pipeline {
        let columns = append_only(backend);
        Pipeline::with(backend, name, partitions, columns, "{n, doubled: (.n * 2)}")
    }

    /// A table of `columns`, written through `jq`.
    fn with(backend: Backend, name: &str, partitions: i32, columns: &str, jq: &str) -> Pipeline {
        Pipeline::on(
            backend,
            &db_url(backend),
            &db_password(),
            name,
            partitions,
            columns,
            jq,
        )
    }

    /// [`Pipeline::with`], on the server at `url`.
    fn on(
        backend: Backend,
        url: &str,
        password: &str,
        name: &str,
        partitions: i32,
        columns: &str,
        jq: &str,
    ) -> Pipeline {
        let topics = Topics::create(name, partitions, 1);
        let table = unique_table(name);
        let sql = Sql::connect_with(backend, url, password).unwrap();
        sql.batch(&format!("CREATE TABLE {} ({columns})", sql.quote(&table)));
        Pipeline {
            backend,
            topics,
            group: unique(&format!("{name}-g")),
            offsets: format!("{table}_offsets"),
            table,
            jq: jq.to_string(),
            url: url.to_string(),
            server: url.to_string(),
            password: password.to_string(),
            db_args: Vec::new(),
        }
    }

    fn sql(&self) -> Sql {
        Sql::connect_with(self.backend, &self.server, &self.password).unwrap()
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
        args.extend(self.db_args.iter().cloned());
        args
    }

    fn start(&self, instance: &str, extra: &[&str]) -> Exactly {
        let env = [("EXACTLY_TEST_STORE_PASSWORD", self.password.as_str())];
        Exactly::start_with_env(&self.args(instance, extra), &env)
    }

    /// Transactions with a row whose `n` is a multiple of `every` take `seconds` longer, so a
    /// kill finds exactly inside one: PostgreSQL's in its COMMIT (a deferred trigger sleeps
    /// there, and the server commits for a dead client), MariaDB's before it (a trigger sleeps
    /// in the INSERT: MariaDB has no deferred triggers).
    fn slow_transactions(&self, seconds: f64, every: i64) {
        let sql = self.sql();
        let t = &self.table;
        sql.batch(&match self.backend {
            Backend::Postgres => format!(
                "CREATE FUNCTION \"{t}_slow\"() RETURNS trigger LANGUAGE plpgsql AS
                   $$ BEGIN PERFORM pg_sleep({seconds}); RETURN NULL; END $$;
                 CREATE CONSTRAINT TRIGGER slow_commit AFTER INSERT ON \"{t}\"
                   DEFERRABLE INITIALLY DEFERRED FOR EACH ROW WHEN (NEW.n % {every} = 0)
                   EXECUTE FUNCTION \"{t}_slow\"()"
            ),
            Backend::Mysql => format!(
                "CREATE TRIGGER `{t}_slow` BEFORE INSERT ON `{t}` FOR EACH ROW
                   SET @{t}_slow = IF(NEW.n % {every} = 0, SLEEP({seconds}), 0)"
            ),
        });
    }

    /// The offsets table's next offsets, summed over the partitions (0 before exactly
    /// created the table).
    fn committed(&self, sql: &Sql) -> i64 {
        let rows = sql.try_rows(&format!(
            "SELECT COALESCE(SUM(next_offset), 0) FROM {} WHERE group_id = '{}'",
            sql.quote(&self.offsets),
            self.group
        ));
        let value = rows
            .ok()
            .and_then(|r| r.first()?.first().cloned().flatten());
        value.map_or(0, |v| v.parse().unwrap())
    }

    fn wait_committed(&self, n: i64, timeout: Duration, ex: &[&Exactly]) {
        let (sql, deadline) = (self.sql(), Instant::now() + timeout);
        while self.committed(&sql) < n {
            if Instant::now() > deadline {
                let logs: Vec<String> = ex.iter().map(|e| e.log_text()).collect();
                panic!(
                    "{:?}: {} of {n} committed after {timeout:?}; logs:\n{}",
                    self.backend,
                    self.committed(&sql),
                    logs.join("\n----\n")
                );
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// The Kafka group's copy holds the table's offsets (the lag tools read the group), and the
    /// audit finds the group at the end.
    fn assert_group_holds_the_table(&self) {
        let in_table = self.committed(&self.sql());
        let in_group = committed_total(&self.group, &self.topics.input);
        assert_eq!(in_group, in_table, "{:?}: the group's copy", self.backend);
        let (code, report) = self.audit();
        assert_eq!(code, 0, "{report:#}");
        assert_eq!(report["group_reached_end"], true, "{report:#}");
    }

    /// `exactly audit` over the table (the range: all of the input).
    fn audit(&self) -> (i32, serde_json::Value) {
        let b = bootstrap();
        let mut args = vec![
            "--bootstrap-servers",
            &b,
            "--input-topics",
            &self.topics.input,
            "--group-id",
            &self.group,
            "--db-url",
            &self.url,
            "--db-table",
            &self.table,
            "--db-lineage-column",
            "lineage",
            "--db-offsets-table",
            &self.offsets,
            "--db-password-env",
            "EXACTLY_TEST_STORE_PASSWORD",
            "--jq",
            &self.jq,
        ];
        // The run's layout of the offsets table.
        if let Some(at) = self.db_args.iter().position(|a| a == "--db-offsets-layout") {
            args.extend(["--db-offsets-layout", self.db_args[at + 1].as_str()]);
        }
        audit_json(&args)
    }

    /// Every n of 0..total exactly once, each doubled, each with its input's lineage.
    fn assert_exactly_once(&self, total: i64) {
        let sql = self.sql();
        let t = sql.quote(&self.table);
        let rows = sql.count(&format!("SELECT count(*) FROM {t}"));
        let distinct = sql.count(&format!("SELECT count(DISTINCT n) FROM {t}"));
        let doubled = sql.count(&format!(
            "SELECT count(*) FROM {t} WHERE doubled = n * 2 AND n >= 0 AND n < {total}"
        ));
        let lineages = sql.count(&format!(
            "SELECT count(DISTINCT lineage) FROM {t} WHERE lineage LIKE '{}/%/%/0'",
            self.topics.input
        ));
        assert_eq!(
            (rows, distinct, doubled, lineages),
            (total, total, total, total),
            "{:?}: rows, distinct inputs, correct rows, distinct lineages",
            self.backend
        );
    }
}

fn kill_9_and_a_crash_between_the_commit_and_the_groups_copy(backend: Backend) {
    let p = Pipeline::new(backend, "db-kill", 3);
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
        p.committed(&p.sql()),
        committed_total(&p.group, &p.topics.input),
    );
    assert!(in_table > in_group, "table {in_table}, group {in_group}");
    // The audit judges what the table says was processed, not the group's copy.
    let (code, report) = p.audit();
    assert_eq!(code, 0, "{report:#}");
    assert_eq!(report["pending"], 4000 - in_table, "{report:#}");
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
    // The audit over the table agrees; and sees a row lost, one twice and one changed.
    let (code, report) = p.audit();
    assert_eq!(code, 0, "{report:#}");
    assert_eq!(report["outputs"], total, "{report:#}");
    let sql = p.sql();
    let t = sql.quote(&p.table);
    sql.batch(&format!("DELETE FROM {t} WHERE n = 17"));
    sql.batch(&format!(
        "INSERT INTO {t} (n, doubled, lineage) SELECT n, doubled, lineage FROM {t} WHERE n = 18"
    ));
    sql.batch(&format!("UPDATE {t} SET doubled = 0 WHERE n = 19"));
    let (code, report) = p.audit();
    assert_eq!(code, 1, "{report:#}");
    let counts = ["lost", "duplicated", "unexpected"].map(|k| report[k].as_u64());
    assert_eq!(counts, [Some(1); 3], "{report:#}");
}

#[test]
fn postgres_rows_and_offsets_commit_together_across_kill_9_and_the_group_gets_a_copy() {
    kill_9_and_a_crash_between_the_commit_and_the_groups_copy(Backend::Postgres);
}

#[test]
fn mysql_rows_and_offsets_commit_together_across_kill_9_and_the_group_gets_a_copy() {
    kill_9_and_a_crash_between_the_commit_and_the_groups_copy(Backend::Mysql);
}

fn refused_rows_to_the_dead_letter_table(backend: Backend) {
    // n % 100 = 7 breaks a CHECK; a `d` that is no number is no bigint; n = 5 is no object;
    // n = 11's row is larger than the producer's message.max.bytes, which is Kafka's limit,
    // not the database's.
    let columns = append_only(backend).replace(
        "n bigint NOT NULL",
        "n bigint NOT NULL CHECK (n % 100 <> 7)",
    );
    let columns = columns.replace(
        "n BIGINT NOT NULL",
        "n BIGINT NOT NULL CHECK (n % 100 <> 7)",
    );
    let columns = columns
        .replace("lineage text", "note text, lineage text")
        .replace("lineage VARCHAR(255)", "note TEXT, lineage VARCHAR(255)");
    let jq = "if .n == 5 then .n else {n, doubled: .d, note} end";
    let long = "x".repeat(3000);
    let p = Pipeline::with(backend, "db-bad", 2, &columns, jq);
    let total = 300;
    let inputs: Vec<In> = (0..total)
        .map(|i| {
            let d = if i % 100 == 3 {
                serde_json::json!("zz")
            } else {
                serde_json::json!(i * 2)
            };
            let note = (i == 11).then_some(long.as_str());
            In::json(
                i as i32 % 2,
                &format!("k{i}"),
                serde_json::json!({"n": i, "d": d, "note": note}),
            )
        })
        .collect();
    produce(&p.topics.input, &inputs);
    let mut ex = p.start("a", &["--producer-config", "message.max.bytes=2000"]);
    p.wait_committed(total, Duration::from_secs(60), &[&ex]);
    ex.stop_cleanly();
    database_words(&ex, &p.table, backend);
    let sql = p.sql();
    let t = sql.quote(&p.table);
    let bad = [3, 5, 7, 103, 107, 203, 207];
    let rows = sql.count(&format!("SELECT count(*) FROM {t}"));
    let distinct = sql.count(&format!("SELECT count(DISTINCT n) FROM {t}"));
    assert_eq!((rows, distinct), (total - 7, total - 7), "{backend:?}");
    let listed = bad.map(|n| n.to_string()).join(",");
    let written_bad = sql.count(&format!("SELECT count(*) FROM {t} WHERE n IN ({listed})"));
    assert_eq!(written_bad, 0);
    let length = match backend {
        Backend::Postgres => "length(note)",
        Backend::Mysql => "CHAR_LENGTH(note)",
    };
    let long_row = sql.count(&format!("SELECT {length} FROM {t} WHERE n = 11"));
    assert_eq!(
        long_row, 3000,
        "a row longer than Kafka's limit is the database's to take"
    );
    // The audit judges rows as the database takes them: the long one is no missing dead letter.
    let (code, report) = p.audit();
    assert_eq!(code, 0, "{report:#}");
    // Each bad input's copy once, with why.
    let text = match backend {
        Backend::Postgres => "convert_from(value, 'UTF8'), reason, headers::text",
        Backend::Mysql => "CONVERT(value USING utf8mb4), reason, headers",
    };
    let dead = sql.rows(&format!(
        "SELECT {text} FROM {}",
        sql.quote(&format!("{}_dlq", p.table))
    ));
    let dead: Vec<(i64, Option<String>, Option<String>)> = dead
        .iter()
        .map(|r| {
            let value: serde_json::Value = serde_json::from_str(r[0].as_deref().unwrap()).unwrap();
            let n = value.get("n").unwrap_or(&value).as_i64().unwrap();
            let headers: Vec<(String, Option<String>)> =
                serde_json::from_str(r[2].as_deref().unwrap()).unwrap();
            let broker = (headers.iter())
                .find(|(k, _)| k == "exactly.error.database")
                .and_then(|(_, v)| v.clone());
            (n, r[1].clone(), broker)
        })
        .collect();
    let mut ns: Vec<i64> = dead.iter().map(|d| d.0).collect();
    ns.sort();
    assert_eq!(ns, bad, "{dead:?}");
    let broker = |n: i64| dead.iter().find(|d| d.0 == n).unwrap().2.clone();
    assert_eq!(broker(7).as_deref(), Some("CHECK_VIOLATION"), "{dead:?}");
    assert_eq!(
        broker(3).as_deref(),
        Some("INVALID_TEXT_REPRESENTATION"),
        "{dead:?}"
    );
    assert_eq!(broker(5).as_deref(), Some("NOT_A_JSON_OBJECT"), "{dead:?}");
    // The database refused them (the value that is no object too: no row of the table).
    let reasons = dead
        .iter()
        .filter(|d| d.1.as_deref() == Some("rejected_by_database"));
    assert_eq!(reasons.count(), bad.len(), "{dead:?}");
}

/// What the log says of rows the database refused: the database, the table, each row's
/// place among its unit's rows, and each record (its real partition and offset) whose
/// dead-letter copy goes to a table; never the broker, never a dead-letter topic.
fn database_words(ex: &Exactly, table: &str, backend: Backend) {
    let log = ex.log_text();
    for said in [
        "the broker rejected a record; its replay sends the dead-letter copy",
        "the broker rejected records together; their replay sends each alone to find which \
         one is at fault",
        "record to the dead-letter topic",
    ] {
        assert!(ex.events(said).is_empty(), "{backend:?}: {said}\n{log}");
    }
    let rows = ex.events("the database refused a row");
    assert!(!rows.is_empty(), "{backend:?}: {log}");
    for r in &rows {
        assert_eq!(r["table"], table, "{r}");
        assert!(r["position"].as_u64() < r["rows"].as_u64(), "{r}");
    }
    // The bad inputs are odd: partition 1, offset (n - 1) / 2.
    let records =
        ex.events("the database refused a record's row; its replay sends the dead-letter copy");
    let named: std::collections::BTreeSet<(i64, i64)> = (records.iter())
        .filter_map(|r| Some((r["partition"].as_i64()?, r["offset"].as_i64()?)))
        .collect();
    let bad = [3, 5, 7, 103, 107, 203, 207].map(|n| (1, (n - 1) / 2));
    assert_eq!(named, bad.into_iter().collect(), "{records:?}");
    assert!(
        !ex.events("record to the dead-letter table").is_empty(),
        "{log}"
    );
}

#[test]
fn postgres_rows_the_database_refuses_and_values_that_are_no_rows_go_to_the_dead_letter_table_once()
{
    refused_rows_to_the_dead_letter_table(Backend::Postgres);
}

#[test]
fn mysql_rows_the_database_refuses_and_values_that_are_no_rows_go_to_the_dead_letter_table_once() {
    refused_rows_to_the_dead_letter_table(Backend::Mysql);
}

/// MySQL bounds an idle session, not an idle transaction: exactly's sessions set
/// `wait_timeout` to --db-statement-timeout (MariaDB's too), so a zombie's connection closes
/// and its transaction rolls back. Its own connection, idle far longer between units, is kept
/// alive: the next unit commits on it, with no abort and no reconnect.
#[test]
fn mysql_an_idle_connection_outlives_the_servers_idle_bound_and_nothing_aborts() {
    let p = Pipeline::new(Backend::Mysql, "db-idle", 1);
    let inputs = numbered(200, 1);
    let mut a = p.start("a", &["--db-statement-timeout", "2s"]);
    produce(&p.topics.input, &inputs[..100]);
    p.wait_committed(100, Duration::from_secs(60), &[&a]);
    // Three times the server's bound on an idle session.
    std::thread::sleep(Duration::from_secs(6));
    produce(&p.topics.input, &inputs[100..]);
    p.wait_committed(200, Duration::from_secs(60), &[&a]);
    for said in [
        "transaction aborted",
        "database connection replaced",
        "the database connection was lost; connecting again",
        "the database connection did not answer while idle",
    ] {
        assert!(a.events(said).is_empty(), "{said}:\n{}", a.log_text());
    }
    a.stop_cleanly();
    p.assert_exactly_once(200);
}

/// A unit open longer than the server's bound on an idle session (nothing goes to the
/// database before its commit): the connection, closed by the server meanwhile, is opened
/// again before the unit's transaction begins, and the unit commits; no replay, no livelock.
#[test]
fn mysql_a_unit_open_longer_than_the_idle_bound_commits() {
    let p = Pipeline::new(Backend::Mysql, "db-long-unit", 1);
    let inputs = numbered(200, 1);
    produce(&p.topics.input, &inputs);
    let args = ["--db-statement-timeout", "1s", "--commit-interval", "4s"];
    let mut a = p.start("a", &args);
    p.wait_committed(200, Duration::from_secs(30), &[&a]);
    assert!(
        a.events("transaction aborted").is_empty(),
        "{}",
        a.log_text()
    );
    a.stop_cleanly();
    p.assert_exactly_once(200);
}

fn a_paused_instance_is_fenced(backend: Backend) {
    use nix::sys::signal::Signal;

    let p = Pipeline::new(backend, "db-zombie", 2);
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
    let (_, text) = get(&http_addr(&a), "/metrics").unwrap();
    let fenced = metric(&text, "exactly_database_fenced_partitions_total", &[]);
    assert!(fenced >= 1.0, "{text}");
    produce(&p.topics.input, &inputs[3000..]);
    p.wait_committed(total as i64, Duration::from_secs(90), &[&a, &b]);
    a.stop_cleanly();
    b.stop_cleanly();
    p.assert_exactly_once(total as i64);
    p.assert_group_holds_the_table();
    let fenced = a.events("transaction aborted");
    assert!(
        fenced.iter().any(|ev| ev["reason"] == "partition_claimed"),
        "A's stale unit was never refused: {}",
        a.log_text()
    );
}

#[test]
fn postgres_a_paused_instance_whose_partitions_moved_is_fenced_by_the_table_and_writes_nothing() {
    a_paused_instance_is_fenced(Backend::Postgres);
}

#[test]
fn mysql_a_paused_instance_whose_partitions_moved_is_fenced_by_the_table_and_writes_nothing() {
    a_paused_instance_is_fenced(Backend::Mysql);
}

#[test]
fn postgres_connections_terminated_or_answers_lost_during_commit_lose_and_double_nothing() {
    // Every COMMIT takes a moment (a deferred trigger sleeps in it), so the killer below finds
    // exactly's connection inside one.
    let mut p = Pipeline::new(Backend::Postgres, "db-term", 2);
    let app = unique("exactly-term");
    p.slow_transactions(0.2, 500);
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
    let killer = p.sql();
    let kill = format!(
        "SELECT count(pg_terminate_backend(pid))::bigint FROM pg_stat_activity
         WHERE application_name = '{app}' AND state = 'active' AND query = 'COMMIT'"
    );
    let mut terminated = 0;
    for chunk in inputs.chunks(500) {
        produce(&p.topics.input, chunk);
        let until = Instant::now() + Duration::from_secs(2);
        while Instant::now() < until {
            terminated += killer.count(&kill);
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
    let lost = (ex.events("the database connection was lost; connecting again"))
        .iter()
        .filter(|e| e["doing"] == "committing")
        .count();
    assert!(lost >= 3, "{lost} terminated COMMITs: {log}");
    assert_lost_answers_resolved(&ex);
}

/// Every COMMIT answer `--test-lose-db-commit-answers` lost was resolved by the offsets table
/// as a commit.
fn assert_lost_answers_resolved(ex: &Exactly) {
    let log = ex.log_text();
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
fn mysql_connections_killed_in_a_transaction_or_answers_lost_after_commit_lose_and_double_nothing()
{
    // Every transaction with a multiple of 250 takes a moment (a trigger sleeps in its
    // INSERT), so the killer finds exactly's connection inside one, by the trigger's statement
    // (what the process list shows while it sleeps), which names this test's table.
    let p = Pipeline::new(Backend::Mysql, "db-term", 2);
    p.slow_transactions(0.2, 250);
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
    let killer = p.sql();
    let ours = format!(
        "SELECT ID FROM information_schema.PROCESSLIST
         WHERE ID <> CONNECTION_ID() AND INFO LIKE 'SET @{}_slow =%'",
        p.table
    );
    let mut killed = 0;
    for chunk in inputs.chunks(500) {
        produce(&p.topics.input, chunk);
        // Until one connection of this chunk's is killed (a loaded machine may take a while to
        // get there), bounded.
        let (until, before) = (Instant::now() + Duration::from_secs(8), killed);
        while Instant::now() < until && killed == before {
            for id in killer.rows(&ours) {
                let id = id[0].clone().unwrap();
                if killer.try_batch(&format!("KILL CONNECTION {id}")).is_ok() {
                    killed += 1;
                }
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }
    p.wait_committed(total as i64, Duration::from_secs(120), &[&ex]);
    ex.stop_cleanly();
    p.assert_exactly_once(total as i64);
    assert!(
        killed >= 3,
        "only {killed} connections killed in a transaction"
    );
    assert_lost_answers_resolved(&ex);
}

fn the_database_goes_away_under_load(backend: Backend) {
    // Through a proxy of its own, so the outage is this test's only.
    let mut p = Pipeline::new(backend, "db-outage", 2);
    let proxy = Proxy::start(&p.url);
    p.url = with_port(&p.url, proxy.port);
    let total = 4000;
    let inputs = numbered(total, 2);
    produce(&p.topics.input, &inputs[..1000]);
    let mut ex = p.start("a", &["--db-statement-timeout", "2s"]);
    let addr = http_addr(&ex);
    p.wait_committed(1000, Duration::from_secs(90), &[&ex]);
    // The outage: the open connections cut, new ones refused, while records keep coming.
    proxy.cut();
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
    proxy.restore();
    produce(&p.topics.input, &inputs[3000..]);
    p.wait_committed(total as i64, Duration::from_secs(90), &[&ex]);
    let deadline = Instant::now() + Duration::from_secs(30);
    while get(&addr, "/readyz").map(|(s, _)| s) != Some(200) {
        assert!(
            Instant::now() < deadline,
            "/readyz not 200 again after the outage"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    // The sink's own metrics saw it: connections not made, and rows written in transactions
    // that took time.
    let (_, text) = get(&addr, "/metrics").unwrap();
    let failures = |kind| metric(&text, "exactly_database_failures_total", &[("kind", kind)]);
    assert!(failures("unreachable") > 0.0, "{text}");
    let written = metric(
        &text,
        "exactly_database_rows_total",
        &[("outcome", "written")],
    );
    let transactions = metric(
        &text,
        "exactly_database_transaction_duration_seconds_count",
        &[],
    );
    assert!(written > 0.0 && transactions > 0.0, "{text}");
    ex.stop_cleanly();
    p.assert_exactly_once(total as i64);
}

#[test]
fn postgres_a_database_that_goes_away_under_load_stalls_exactly_not_ready_and_nothing_is_lost_or_doubled()
 {
    the_database_goes_away_under_load(Backend::Postgres);
}

#[test]
fn mysql_a_database_that_goes_away_under_load_stalls_exactly_not_ready_and_nothing_is_lost_or_doubled()
 {
    the_database_goes_away_under_load(Backend::Mysql);
}

fn two_pipelines_upsert_one_table(backend: Backend) {
    // Both write the same keys, in opposite orders of arrival: rows sorted by key in every
    // transaction take their locks in one order, and a deadlock, should one happen, aborts
    // and replays one side.
    let columns = match backend {
        Backend::Postgres => "n bigint PRIMARY KEY, doubled bigint, lineage text",
        Backend::Mysql => "n BIGINT PRIMARY KEY, doubled BIGINT, lineage VARCHAR(255)",
    };
    let jq = "{n, doubled: (.n * 2)}";
    let first = Pipeline::with(backend, "db-two-a", 2, columns, jq);
    let mut second = Pipeline::with(backend, "db-two-b", 2, columns, jq);
    let sql = first.sql();
    sql.batch(&format!("DROP TABLE {}", sql.quote(&second.table)));
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
    let rows = sql.count(&format!(
        "SELECT count(*) FROM {} WHERE doubled = n * 2",
        sql.quote(&first.table)
    ));
    assert_eq!(rows, total as i64, "{backend:?}");
    // Each pipeline's audit: its rows as the replay has them, the others overwritten by the
    // other pipeline's (the order of two sources is not defined).
    for p in [&first, &second] {
        let (code, report) = p.audit();
        assert_eq!(code, 0, "{report:#}");
        let (outputs, overwritten) = (report["outputs"].as_u64(), report["overwritten"].as_u64());
        let sum = outputs.unwrap_or(0) + overwritten.unwrap_or(0);
        assert_eq!(sum, total as u64, "{report:#}");
    }
}

#[test]
fn postgres_two_pipelines_upserting_one_table_both_finish_and_the_table_holds_every_key() {
    two_pipelines_upsert_one_table(Backend::Postgres);
}

#[test]
fn mysql_two_pipelines_upserting_one_table_both_finish_and_the_table_holds_every_key() {
    two_pipelines_upsert_one_table(Backend::Mysql);
}

fn killed_at_random_moments(backend: Backend) {
    // Kill -9 wherever it lands: inside a transaction's statements, inside COMMIT, between
    // the COMMIT and the group's copy, in a rebalance's claim. Bounded: 8 kills.
    let p = Pipeline::new(backend, "db-kills", 3);
    // Most of the time is spent inside a transaction (PostgreSQL: its COMMIT, which the
    // server goes on with for the dead process, and only the table knows).
    p.slow_transactions(0.05, 100);
    let total = 16_000;
    let inputs = numbered(total, 3);
    let args = ["--commit-interval", "30ms", "--max-records-per-txn", "300"];
    let mut delays = [350u64, 120, 800, 60, 500, 230, 900, 40].into_iter();
    let mut ex = p.start("a", &args);
    let sql = p.sql();
    for chunk in inputs.chunks(total / 8) {
        let before = p.committed(&sql);
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

#[test]
fn postgres_killed_at_random_moments_under_load_every_input_is_one_row() {
    killed_at_random_moments(Backend::Postgres);
}

#[test]
fn mysql_killed_at_random_moments_under_load_every_input_is_one_row() {
    killed_at_random_moments(Backend::Mysql);
}

#[test]
fn mysql_a_spark_job_keeping_offsets_in_kafka_offset_hands_over_without_replay() {
    // The Spark recipe: rows and `kafka_offset` written by the job; it stopped after
    // untilOffset 500 of each partition. exactly takes the same table as its offsets table.
    let mut p = Pipeline::new(Backend::Mysql, "db-spark", 2);
    let sql = p.sql();
    let kafka_offset = unique_table("kafka_offset");
    sql.batch(&format!(
        "CREATE TABLE `{kafka_offset}` (group_id VARCHAR(255) NOT NULL, topic VARCHAR(255) NOT NULL,
           partition_id INT NOT NULL, fromOffset BIGINT NOT NULL, untilOffset BIGINT NOT NULL,
           PRIMARY KEY (group_id, topic, partition_id))"
    ));
    let total = 4000;
    let inputs = numbered(total, 2);
    produce(&p.topics.input, &inputs);
    // Partition p's offset k holds n = 2k + p: the job wrote n < 1000.
    let values: Vec<String> = (0..1000).map(|n| format!("({n}, {})", n * 2)).collect();
    sql.batch(&format!(
        "INSERT INTO `{}` (n, doubled) VALUES {}",
        p.table,
        values.join(", ")
    ));
    sql.batch(&format!(
        "REPLACE INTO `{kafka_offset}` VALUES ('{g}', '{t}', 0, 400, 500), ('{g}', '{t}', 1, 400, 500)",
        g = p.group,
        t = p.topics.input
    ));
    p.offsets = kafka_offset.clone();
    p.db_args = ["--db-offsets-layout", "kafka-offset"]
        .map(String::from)
        .to_vec();
    let until = |sql: &Sql| {
        sql.count(&format!(
            "SELECT COALESCE(SUM(untilOffset), 0) FROM `{kafka_offset}` WHERE group_id = '{}'",
            p.group
        ))
    };
    let wait = |n: i64, ex: &Exactly| {
        let deadline = Instant::now() + Duration::from_secs(60);
        while until(&sql) < n {
            assert!(Instant::now() < deadline, "{}", ex.log_text());
            std::thread::sleep(Duration::from_millis(100));
        }
    };
    let args = ["--commit-interval", "50ms", "--max-records-per-txn", "200"];
    let mut ex = p.start("a", &args);
    wait(2000, &ex);
    ex.kill9();
    let mut ex = p.start("a", &args);
    wait(total as i64, &ex);
    ex.stop_cleanly();
    let t = format!("`{}`", p.table);
    let rows = sql.count(&format!("SELECT count(*) FROM {t}"));
    let distinct = sql.count(&format!("SELECT count(DISTINCT n) FROM {t}"));
    let doubled = sql.count(&format!("SELECT count(*) FROM {t} WHERE doubled = n * 2"));
    assert_eq!((rows, distinct, doubled), (4000, 4000, 4000));
    // exactly wrote none of the job's (no lineage on them), all of the rest.
    let ours = sql.count(&format!(
        "SELECT count(*) FROM {t} WHERE lineage IS NOT NULL AND n >= 1000"
    ));
    assert_eq!(ours, 3000);
    // The recipe's columns as the job would read them: untilOffset the next to read,
    // fromOffset the commit's start.
    let ranges = sql.rows(&format!(
        "SELECT partition_id, fromOffset, untilOffset FROM `{kafka_offset}` ORDER BY partition_id"
    ));
    for r in &ranges {
        let (from, until): (i64, i64) = (
            r[1].as_deref().unwrap().parse().unwrap(),
            r[2].as_deref().unwrap().parse().unwrap(),
        );
        assert!(until == 2000 && from < until && from >= 500, "{ranges:?}");
    }
    let owners = sql.count(&format!(
        "SELECT count(*) FROM `{kafka_offset}_owner` WHERE owner_epoch > 0"
    ));
    assert_eq!(owners, 2);
}

fn envelopes_into_two_tables(backend: Backend) {
    // Each input upserts its account (key n % 50: one partition's keys only) and appends an
    // event; every tenth deletes its account instead; input 13 names no table of the run.
    let accounts = match backend {
        Backend::Postgres => "id bigint PRIMARY KEY, balance bigint, lineage text",
        Backend::Mysql => "id BIGINT PRIMARY KEY, balance BIGINT, lineage VARCHAR(255)",
    };
    let jq = r#"if .n == 13 then {table: "nope", row: {}}
                elif .n % 10 == 9 then {table: "ACCOUNTS", op: "delete", row: {id: (.n % 50)}}
                else {table: "ACCOUNTS", row: {id: (.n % 50), balance: .n}},
                     {table: "EVENTS", op: "insert", row: {n: .n}} end"#;
    let mut p = Pipeline::with(backend, "db-env", 2, accounts, jq);
    let events = format!("{}_events", p.table);
    let sql = p.sql();
    sql.batch(&format!(
        "CREATE TABLE {} ({})",
        sql.quote(&events),
        append_only(backend)
    ));
    p.jq = jq.replace("ACCOUNTS", &p.table).replace("EVENTS", &events);
    let accounts_table = p.table.clone();
    p.table = format!("{accounts_table},{events}");
    p.db_args = [
        "--db-envelope",
        "--db-dlq-table",
        &format!("{accounts_table}_dlq"),
    ]
    .map(String::from)
    .to_vec();
    let total = 3000;
    let inputs = numbered(total, 2);
    let args = ["--commit-interval", "30ms", "--max-records-per-txn", "200"];
    // --db-mode insert in the base arguments: upserts are the envelopes' default here.
    let start = |p: &Pipeline| {
        let mut a = p.args("a", &args);
        let at = a.iter().position(|a| a == "insert").unwrap();
        a[at] = "upsert".into();
        let env = [("EXACTLY_TEST_STORE_PASSWORD", p.password.as_str())];
        Exactly::start_with_env(&a, &env)
    };
    produce(&p.topics.input, &inputs[..1000]);
    let mut ex = start(&p);
    p.wait_committed(300, Duration::from_secs(60), &[&ex]);
    ex.kill9();
    produce(&p.topics.input, &inputs[1000..]);
    let mut ex = start(&p);
    p.wait_committed(1500, Duration::from_secs(60), &[&ex]);
    ex.kill9();
    let mut ex = start(&p);
    p.wait_committed(total as i64, Duration::from_secs(90), &[&ex]);
    ex.stop_cleanly();
    // What the inputs make of the tables, worked out apart from exactly.
    let mut balances = std::collections::BTreeMap::new();
    let mut appended = 0;
    for n in 0..total as i64 {
        match n {
            13 => {}
            _ if n % 10 == 9 => {
                balances.remove(&(n % 50));
            }
            _ => {
                balances.insert(n % 50, n);
                appended += 1;
            }
        }
    }
    let got: std::collections::BTreeMap<i64, i64> = sql
        .rows(&format!(
            "SELECT id, balance FROM {}",
            sql.quote(&accounts_table)
        ))
        .iter()
        .map(|r| {
            let n = |i: usize| r[i].as_deref().unwrap().parse::<i64>().unwrap();
            (n(0), n(1))
        })
        .collect();
    assert_eq!(got, balances, "{backend:?}");
    let e = sql.quote(&events);
    let (rows, distinct) = (
        sql.count(&format!("SELECT count(*) FROM {e}")),
        sql.count(&format!("SELECT count(DISTINCT n) FROM {e}")),
    );
    assert_eq!((rows, distinct), (appended, appended), "{backend:?}");
    let dead = sql.rows(&format!(
        "SELECT reason, lineage FROM {}",
        sql.quote(&format!("{accounts_table}_dlq"))
    ));
    assert_eq!(dead.len(), 1, "{dead:?}");
    assert_eq!(dead[0][0].as_deref(), Some("rejected_by_database"));
}

#[test]
fn postgres_envelopes_upsert_insert_and_delete_across_two_tables_exactly_once() {
    envelopes_into_two_tables(Backend::Postgres);
}

#[test]
fn mysql_envelopes_upsert_insert_and_delete_across_two_tables_exactly_once() {
    envelopes_into_two_tables(Backend::Mysql);
}

fn the_database_restarted_under_load(backend: Backend) {
    // A server of its own, so the restarts are this test's only.
    let servers = OwnServers::start();
    let url = servers.url(backend);
    let columns = append_only(backend);
    let jq = "{n, doubled: (.n * 2)}";
    let p = Pipeline::on(
        backend,
        &url,
        &servers.password(),
        "db-restart",
        2,
        columns,
        jq,
    );
    let total = 6000;
    let inputs = numbered(total, 2);
    produce(&p.topics.input, &inputs[..1500]);
    let args = [
        "--db-statement-timeout",
        "2s",
        "--max-records-per-txn",
        "200",
    ];
    let mut ex = p.start("a", &args);
    p.wait_committed(500, Duration::from_secs(60), &[&ex]);
    // Restarted while it writes, three times, down for a second and a half each time, records
    // coming all along.
    let rest = numbered(total, 2).split_off(1500);
    let topic = p.topics.input.clone();
    let producer = std::thread::spawn(move || {
        for chunk in rest.chunks(500) {
            produce(&topic, chunk);
            std::thread::sleep(Duration::from_millis(300));
        }
    });
    for _ in 0..3 {
        servers.restart(Duration::from_millis(1500));
        std::thread::sleep(Duration::from_millis(1500));
    }
    producer.join().unwrap();
    p.wait_committed(total as i64, Duration::from_secs(120), &[&ex]);
    ex.stop_cleanly();
    p.assert_exactly_once(total as i64);
    let lost = ex.events("the database connection was lost; connecting again");
    assert!(
        !lost.is_empty(),
        "never saw the restarts: {}",
        ex.log_text()
    );
}

#[test]
fn postgres_the_database_restarted_under_load_loses_and_doubles_nothing() {
    the_database_restarted_under_load(Backend::Postgres);
}

#[test]
fn mysql_the_database_restarted_under_load_loses_and_doubles_nothing() {
    the_database_restarted_under_load(Backend::Mysql);
}
