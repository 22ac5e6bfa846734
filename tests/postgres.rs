//! What only PostgreSQL's side of the database sink does, against a real PostgreSQL 15
//! (`scripts/stores.sh`, docs/database.md): bounded calls cancelled on the server, and failures
//! that carry the server's SQLSTATE. The contract both databases keep is in
//! `tests/databases.rs`.

use std::time::Duration;

use exactly::db::Bounds;
use exactly::db::postgres::Db;

fn connect(statement: Duration) -> Db {
    let url = std::env::var("EXACTLY_TEST_POSTGRES_URL")
        .expect("EXACTLY_TEST_POSTGRES_URL: run the tests through scripts/test.sh");
    let password = std::env::var("EXACTLY_TEST_STORE_PASSWORD").unwrap();
    let bounds = Bounds {
        statement,
        idle_in_transaction: Duration::from_secs(30),
        idle_session: None,
    };
    Db::connect(&url, Some(&password), bounds).expect("connected")
}

fn db() -> Db {
    connect(Duration::from_secs(10))
}

/// A table name of its own for each test run.
fn unique(prefix: &str) -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos();
    format!("{prefix}_{}_{nanos}", std::process::id())
}

#[test]
fn a_call_past_its_bound_is_cancelled_on_the_server_and_its_connection_not_used_again() {
    let db = connect(Duration::from_millis(500));
    // The server's own bound: statement_timeout, set at connect from the same bound.
    let e = db.batch("SELECT pg_sleep(2)").unwrap_err();
    assert_eq!(e.code.as_deref(), Some("57014"), "{e:?}");
    assert!(!e.closed, "the connection goes on");
    db.batch("SELECT 1").unwrap();
    // The server would wait 20 s: the client's bound ends it.
    let slow = "SET statement_timeout = '20s'; SET application_name = 'bounded'";
    db.batch(slow).unwrap();
    let started = std::time::Instant::now();
    let e = db.batch("SELECT pg_sleep(10)").unwrap_err();
    assert!(
        e.message.contains("no answer within") && e.message.contains("cancelled"),
        "{e:?}"
    );
    assert!(e.closed, "not to be trusted any more: {e:?}");
    let took = started.elapsed();
    assert!(took < Duration::from_secs(5), "{took:?}");
    // It is not used again; and the cancel reached the server: nothing of it runs there.
    assert!(db.batch("SELECT 1").unwrap_err().closed);
    let other = connect(Duration::from_secs(5));
    let sql = "SELECT count(*) FROM pg_stat_activity
               WHERE application_name = 'bounded' AND state = 'active'";
    let running = other.call(|c| async move { c.query_one(sql, &[]).await });
    let running: i64 = running.unwrap().get(0);
    assert_eq!(running, 0);
}

#[test]
fn failures_carry_the_servers_sqlstate_and_say_whose_they_are() {
    let db = db();
    let table = unique("rows");
    db.batch(&format!(
        "CREATE TABLE \"{table}\" (id int PRIMARY KEY, n int NOT NULL)"
    ))
    .unwrap();
    db.batch(&format!("INSERT INTO \"{table}\" VALUES (1, 1)"))
        .unwrap();
    let duplicate = db
        .batch(&format!("INSERT INTO \"{table}\" VALUES (1, 2)"))
        .unwrap_err();
    assert_eq!(duplicate.code.as_deref(), Some("23505"));
    assert!(duplicate.is_data() && !duplicate.is_retryable());
    assert!(duplicate.message.contains("duplicate key"), "{duplicate:?}");
    let not_a_number = (db.batch(&format!("INSERT INTO \"{table}\" VALUES (2, 'x')"))).unwrap_err();
    assert_eq!(not_a_number.code.as_deref(), Some("22P02"));
    let missing = db.batch("SELECT * FROM no_such_table").unwrap_err();
    assert_eq!(missing.code.as_deref(), Some("42P01"));
    assert!(!missing.is_data());
    db.batch(&format!("DROP TABLE \"{table}\"")).unwrap();
}

#[test]
fn a_wrong_password_or_a_closed_port_fails_to_connect_saying_why() {
    let url = std::env::var("EXACTLY_TEST_POSTGRES_URL").expect("EXACTLY_TEST_POSTGRES_URL");
    let bounds = Bounds {
        statement: Duration::from_secs(5),
        idle_in_transaction: Duration::from_secs(5),
        idle_session: None,
    };
    let e = Db::connect(&url, Some("wrong"), bounds)
        .err()
        .expect("refused");
    assert_eq!(e.code.as_deref(), Some("28P01"), "{e:?}");
    let closed = Db::connect("postgres://exactly@127.0.0.1:1/postgres", None, bounds)
        .err()
        .expect("nobody listens on port 1");
    assert!(closed.code.is_none(), "{closed:?}");
}
