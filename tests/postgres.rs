//! The database sink's pieces against a real PostgreSQL 15 (`scripts/stores.sh`, docs/database.md):
//! the offsets table's claims, compare-and-set and fencing, bounded calls, and failures that
//! carry the server's SQLSTATE.

use std::time::Duration;

use exactly::db::offsets::{Advance, Claimed, Offsets};
use exactly::db::{Bounds, Db};

fn connect(statement: Duration) -> Db {
    let url = std::env::var("EXACTLY_TEST_POSTGRES_URL")
        .expect("EXACTLY_TEST_POSTGRES_URL: run the tests through scripts/test.sh");
    let password = std::env::var("EXACTLY_TEST_STORE_PASSWORD").unwrap();
    let bounds = Bounds {
        statement,
        idle_in_transaction: Duration::from_secs(30),
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

fn claimed(partition: i32, next: Option<i64>, epoch: i64) -> Claimed {
    Claimed {
        partition,
        next,
        epoch,
    }
}

fn advance(partition: i32, from: Option<i64>, to: i64, epoch: i64) -> Advance {
    Advance {
        partition,
        from,
        to,
        epoch,
    }
}

#[test]
fn a_claim_fences_the_previous_owner_and_offsets_move_only_with_their_owners_epoch() {
    let (a, b) = (db(), db());
    let table = unique("offsets");
    let first = Offsets::new(&table, "g", "instance-a").unwrap();
    let second = Offsets::new(&table, "g", "instance-b").unwrap();
    first.create(&a).unwrap();
    first.create(&a).unwrap();
    // Missing rows take their seed (the group's Kafka offset), or none.
    let got = first.claim(&a, "in", &[(1, None), (0, Some(40))]).unwrap();
    let nexts: Vec<_> = got.iter().map(|c| (c.partition, c.next)).collect();
    assert_eq!(nexts, [(0, Some(40)), (1, None)]);
    let (e0, e1) = (got[0].epoch, got[1].epoch);
    // Moved in a transaction that commits; one rolled back moves nothing.
    a.batch("BEGIN").unwrap();
    let moved = first.advance(&a, "in", &[advance(0, Some(40), 50, e0)]);
    assert!(moved.unwrap().is_empty());
    a.batch("COMMIT").unwrap();
    a.batch("BEGIN").unwrap();
    first
        .advance(&a, "in", &[advance(0, Some(50), 60, e0)])
        .unwrap();
    a.batch("ROLLBACK").unwrap();
    // A second instance claims both: a row there is keeps its offset, whatever the seed; the
    // epochs are new ones.
    let got = second
        .claim(&b, "in", &[(0, Some(0)), (1, Some(7))])
        .unwrap();
    let nexts: Vec<_> = got.iter().map(|c| (c.partition, c.next)).collect();
    assert_eq!(nexts, [(0, Some(50)), (1, None)]);
    let (f0, f1) = (got[0].epoch, got[1].epoch);
    assert!(f0 > e0.max(e1) && f1 > e0.max(e1), "{got:?}");
    // The first, stale, moves nothing: both fenced.
    a.batch("BEGIN").unwrap();
    let stale = [advance(0, Some(50), 70, e0), advance(1, None, 5, e1)];
    assert_eq!(first.advance(&a, "in", &stale).unwrap(), [0, 1]);
    a.batch("ROLLBACK").unwrap();
    // An offset other than the owner's last one is no move either; a partition twice is
    // refused.
    b.batch("BEGIN").unwrap();
    let stale = second.advance(&b, "in", &[advance(0, Some(40), 55, f0)]);
    assert_eq!(stale.unwrap(), [0]);
    let twice = [advance(0, Some(50), 55, f0), advance(0, Some(50), 56, f0)];
    assert!(second.advance(&b, "in", &twice).is_err());
    b.batch("ROLLBACK").unwrap();
    b.batch("BEGIN").unwrap();
    let moves = [advance(0, Some(50), 55, f0), advance(1, None, 3, f1)];
    assert!(second.advance(&b, "in", &moves).unwrap().is_empty());
    b.batch("COMMIT").unwrap();
    let rows = first.read(&a, "in", &[0, 1, 2]).unwrap();
    assert_eq!(rows, [claimed(0, Some(55), f0), claimed(1, Some(3), f1)]);
    // A row deleted and seeded again gets an epoch never used before: the stale owner stays
    // fenced.
    let delete = format!("DELETE FROM \"{table}\" WHERE partition = 1");
    a.batch(&delete).unwrap();
    let again = first.claim(&a, "in", &[(1, None)]).unwrap();
    assert!(again[0].epoch > f1, "{again:?}");
    a.batch("BEGIN").unwrap();
    let stale = first.advance(&a, "in", &[advance(1, None, 9, e1)]);
    assert_eq!(stale.unwrap(), [1]);
    a.batch("ROLLBACK").unwrap();
    // Another group's rows are its own.
    let other = Offsets::new(&table, "other", "instance-a").unwrap();
    assert!(other.read(&a, "in", &[0, 1]).unwrap().is_empty());
    let drop = format!("DROP TABLE \"{table}\"; DROP SEQUENCE \"{table}_epoch\"");
    a.batch(&drop).unwrap();
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

/// The rows of `table` as (id, name, n), by id.
fn rows_of(db: &Db, table: &str) -> Vec<(i32, Option<String>, i32)> {
    let sql = format!("SELECT id, name, n FROM \"{table}\" ORDER BY id");
    db.call(|c| async move { c.query(&sql, &[]).await })
        .unwrap()
        .iter()
        .map(|r| (r.get(0), r.get(1), r.get(2)))
        .collect()
}

#[test]
fn rows_are_upserted_by_key_last_wins_and_a_bad_row_is_named_while_the_rest_is_written() {
    use exactly::db::rows::{Table, Unwritten};
    use serde_json::json;

    let db = db();
    let table = unique("sales");
    db.batch(&format!(
        "CREATE TABLE \"{table}\" (id int PRIMARY KEY, name text, n int NOT NULL CHECK (n < 100))"
    ))
    .unwrap();
    let t = Table::describe(&db, &table).unwrap();
    assert_eq!(t.columns(), ["id", "name", "n"]);
    let missing = Table::describe(&db, "no_such_table").unwrap_err();
    assert!(missing.contains("does not exist"), "{missing}");
    let keyless = unique("keyless");
    db.batch(&format!("CREATE TABLE \"{keyless}\" (a int)"))
        .unwrap();
    let e = Table::describe(&db, &keyless)
        .unwrap()
        .upsertable()
        .unwrap_err();
    assert!(e.contains("no primary key"), "{e}");

    // Two rows of one key in a batch: the last wins (one statement cannot update a row twice).
    db.batch("BEGIN").unwrap();
    let batch = [
        (0, json!({"id": 2, "name": "b", "n": 2}).to_string()),
        (1, json!({"id": 1, "name": "a", "n": 1}).to_string()),
        (
            2,
            json!({"id": "1", "name": "a2", "n": 3, "extra": true}).to_string(),
        ),
    ];
    t.upsert(&db, &batch).unwrap();
    db.batch("COMMIT").unwrap();
    assert_eq!(
        rows_of(&db, &table),
        [(1, Some("a2".into()), 3), (2, Some("b".into()), 2)]
    );
    // Rows the server refuses for what they hold are named; the others are written.
    db.batch("BEGIN").unwrap();
    let batch = [
        (0, json!({"id": 2, "n": 20}).to_string()),
        (1, json!({"id": 4, "n": "x"}).to_string()),
        (2, json!({"id": 5}).to_string()),
        (3, json!({"id": 6, "n": 6}).to_string()),
        (4, json!({"id": 7, "n": 700}).to_string()),
        (5, json!([1, 2]).to_string()),
    ];
    match t.upsert(&db, &batch) {
        Err(Unwritten::Rows(refused)) => {
            let why: Vec<(usize, Option<&str>)> = (refused.iter())
                .map(|(i, e)| (*i, e.code.as_deref()))
                .collect();
            assert_eq!(
                why,
                [
                    (1, Some("22P02")),
                    (2, Some("23502")),
                    (4, Some("23514")),
                    (5, Some("22023"))
                ]
            );
        }
        other => panic!("{other:?}"),
    }
    db.batch("COMMIT").unwrap();
    assert_eq!(
        rows_of(&db, &table),
        [(1, Some("a2".into()), 3), (2, None, 20), (6, None, 6)]
    );
    // Rolled back, nothing.
    db.batch("BEGIN").unwrap();
    t.upsert(&db, &[(0, json!({"id": 9, "n": 9}).to_string())])
        .unwrap();
    db.batch("ROLLBACK").unwrap();
    assert_eq!(rows_of(&db, &table).len(), 3);
    db.batch(&format!("DROP TABLE \"{table}\"; DROP TABLE \"{keyless}\""))
        .unwrap();
}
