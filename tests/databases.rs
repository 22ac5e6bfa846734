//! The database sink's seam, [`exactly::db::Session`], against a real PostgreSQL 15 and a real
//! MariaDB (`scripts/stores.sh`): the same contract from both. Claims fence the previous
//! owner and offsets move only by compare-and-set on their owner's epoch; rows are upserted by
//! key, the last of a key winning, and the rows a server refuses are named while the others
//! are written; refusals at opening say where. Then what only MySQL and MariaDB have: the
//! Spark recipes' `kafka_offset` as the offsets table, JSON values into MySQL's columns, and a
//! call past its bound ended on the server.

mod common;

use std::time::Duration;

use common::*;
use exactly::db::{
    self, Advance, Backend, Bounds, Claimed, Kind, Layout, NotOpen, Session, Step, Target,
    Unwritten, Write,
};
use serde_json::json;

fn target(backend: Backend, rows: &str, offsets: &str, group: &str, owner: &str) -> Target {
    Target {
        backend,
        url: db_url(backend),
        password: Some(db_password()),
        bounds: Bounds {
            statement: Duration::from_secs(10),
            idle_in_transaction: Duration::from_secs(30),
            idle_session: None,
        },
        tables: vec![rows.to_string()],
        write: Write::Upsert,
        lineage_column: None,
        offsets: offsets.to_string(),
        layout: Layout::Exactly,
        dead: format!("{rows}_dlq"),
        group: group.to_string(),
        owner: owner.to_string(),
    }
}

fn open(t: &Target) -> Box<dyn Session> {
    db::open(t).unwrap_or_else(|e| panic!("{e:?}"))
}

/// A rows' table: `id` the key, `n` below 100.
fn sales(sql: &Sql) -> String {
    let table = unique_table("sales");
    let text = match sql.backend() {
        Backend::Postgres => "text",
        Backend::Mysql => "VARCHAR(100)",
    };
    sql.batch(&format!(
        "CREATE TABLE {} (id int PRIMARY KEY, name {text}, n int NOT NULL CHECK (n < 100))",
        sql.quote(&table)
    ));
    table
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

fn a_claim_fences_the_previous_owner(backend: Backend) {
    let sql = Sql::connect(backend);
    let rows = sales(&sql);
    let offsets = unique_table("offsets");
    let a = open(&target(backend, &rows, &offsets, "g", "instance-a"));
    // Opening again finds the tables there.
    let b = open(&target(backend, &rows, &offsets, "g", "instance-b"));
    // Missing rows take their seed (the group's Kafka offset), or none.
    let got = a.claim("in", &[(1, None), (0, Some(40))]).unwrap();
    let nexts: Vec<_> = got.iter().map(|c| (c.partition, c.next)).collect();
    assert_eq!(nexts, [(0, Some(40)), (1, None)]);
    let (e0, e1) = (got[0].epoch, got[1].epoch);
    // Moved in a transaction that commits; one rolled back moves nothing.
    a.begin(false).unwrap();
    let moved = a.advance("in", &[advance(0, Some(40), 50, e0)]);
    assert!(moved.unwrap().is_empty());
    a.commit().unwrap();
    a.begin(false).unwrap();
    assert!(
        (a.advance("in", &[advance(0, Some(50), 60, e0)]))
            .unwrap()
            .is_empty()
    );
    a.rollback().unwrap();
    // A second instance claims both: a row there keeps its offset, whatever the seed; the
    // epochs are new ones.
    let got = b.claim("in", &[(0, Some(0)), (1, Some(7))]).unwrap();
    let nexts: Vec<_> = got.iter().map(|c| (c.partition, c.next)).collect();
    assert_eq!(nexts, [(0, Some(50)), (1, None)]);
    let (f0, f1) = (got[0].epoch, got[1].epoch);
    assert!(f0 > e0.max(e1) && f1 > e0.max(e1), "{got:?}");
    // The first, stale, moves nothing: both fenced.
    a.begin(false).unwrap();
    let stale = [advance(0, Some(50), 70, e0), advance(1, None, 5, e1)];
    assert_eq!(a.advance("in", &stale).unwrap(), [0, 1]);
    a.rollback().unwrap();
    // An offset other than the owner's last one is no move either; a partition twice is
    // refused.
    b.begin(false).unwrap();
    let wrong = b.advance("in", &[advance(0, Some(40), 55, f0)]);
    assert_eq!(wrong.unwrap(), [0]);
    let twice = [advance(0, Some(50), 55, f0), advance(0, Some(50), 56, f0)];
    assert!(b.advance("in", &twice).is_err());
    b.rollback().unwrap();
    b.begin(false).unwrap();
    let moves = [advance(1, None, 3, f1), advance(0, Some(50), 55, f0)];
    assert!(b.advance("in", &moves).unwrap().is_empty());
    b.commit().unwrap();
    let read = a.read("in", &[0, 1, 2]).unwrap();
    assert_eq!(read, [claimed(0, Some(55), f0), claimed(1, Some(3), f1)]);
    // A row deleted and seeded again gets an epoch never used before: the stale owner stays
    // fenced.
    let partition = match backend {
        Backend::Postgres => "partition",
        Backend::Mysql => "partition_id",
    };
    sql.batch(&format!(
        "DELETE FROM {} WHERE {partition} = 1",
        sql.quote(&offsets)
    ));
    let again = a.claim("in", &[(1, None)]).unwrap();
    assert!(again[0].epoch > f1, "{again:?}");
    b.begin(false).unwrap();
    let stale = b.advance("in", &[advance(1, Some(3), 9, f1)]);
    assert_eq!(stale.unwrap(), [1]);
    b.rollback().unwrap();
    // Another group's rows are its own.
    let other = open(&target(backend, &rows, &offsets, "other", "instance-a"));
    assert!(other.read("in", &[0, 1]).unwrap().is_empty());
}

#[test]
fn a_claim_fences_the_previous_owner_and_offsets_move_only_with_their_owners_epoch() {
    for backend in BACKENDS {
        a_claim_fences_the_previous_owner(backend);
    }
}

/// The rows of `table` as (id, name, n), by id.
fn rows_of(sql: &Sql, table: &str) -> Vec<(i64, Option<String>, i64)> {
    let rows = sql.rows(&format!(
        "SELECT id, name, n FROM {} ORDER BY id",
        sql.quote(table)
    ));
    let number = |v: &Option<String>| v.as_deref().unwrap().parse::<i64>().unwrap();
    rows.iter()
        .map(|r| (number(&r[0]), r[1].clone(), number(&r[2])))
        .collect()
}

fn rows_upserted_and_refused(backend: Backend) {
    let sql = Sql::connect(backend);
    let table = sales(&sql);
    let offsets = unique_table("offsets");
    let s = open(&target(backend, &table, &offsets, "g", "a"));
    // Two rows of one key in a batch: the last wins (`1` and `"1"` are one key once typed).
    s.begin(false).unwrap();
    let batch = [
        (0, json!({"id": 2, "name": "b", "n": 2}).to_string()),
        (1, json!({"id": 1, "name": "a", "n": 1}).to_string()),
        (
            2,
            json!({"id": "1", "name": "a2 ✓ 😀", "n": 3, "extra": true}).to_string(),
        ),
    ];
    s.write_rows(0, Write::Upsert, &batch).unwrap();
    s.commit().unwrap();
    assert_eq!(
        rows_of(&sql, &table),
        [(1, Some("a2 ✓ 😀".into()), 3), (2, Some("b".into()), 2)]
    );
    // Rows the server refuses for what they hold are named; the others are written.
    s.begin(false).unwrap();
    let batch = [
        (0, json!({"id": 2, "n": 20}).to_string()),
        (1, json!({"id": 4, "n": "x"}).to_string()),
        (2, json!({"id": 5}).to_string()),
        (3, json!({"id": 6, "n": 6}).to_string()),
        (4, json!({"id": 7, "n": 700}).to_string()),
        (5, json!({"id": 8, "n": {"an": "object"}}).to_string()),
    ];
    match s.write_rows(0, Write::Upsert, &batch) {
        Err(Unwritten::Rows(refused)) => {
            let why: Vec<(usize, Kind)> = refused.iter().map(|(i, e)| (*i, e.kind)).collect();
            let object = match backend {
                Backend::Postgres => "INVALID_TEXT_REPRESENTATION",
                Backend::Mysql => "DATA_EXCEPTION",
            };
            assert_eq!(
                why,
                [
                    (1, Kind::Data("INVALID_TEXT_REPRESENTATION")),
                    (2, Kind::Data("NOT_NULL_VIOLATION")),
                    (4, Kind::Data("CHECK_VIOLATION")),
                    (5, Kind::Data(object)),
                ],
                "{backend:?}: {refused:?}"
            );
        }
        other => panic!("{backend:?}: {other:?}"),
    }
    s.commit().unwrap();
    assert_eq!(
        rows_of(&sql, &table),
        [(1, Some("a2 ✓ 😀".into()), 3), (2, None, 20), (6, None, 6)]
    );
    // Rolled back, nothing.
    s.begin(false).unwrap();
    s.write_rows(
        0,
        Write::Upsert,
        &[(0, json!({"id": 9, "n": 9}).to_string())],
    )
    .unwrap();
    s.rollback().unwrap();
    assert_eq!(rows_of(&sql, &table).len(), 3);
    // Deleted by key (the rows need only the key; one not there is no failure), and an
    // upsert after a delete of one key in one transaction: the later wins.
    s.begin(false).unwrap();
    let gone = [
        json!({"id": 2}),
        json!({"id": "6", "n": 1}),
        json!({"id": 77}),
    ];
    let gone: Vec<(usize, String)> = gone.iter().map(|v| v.to_string()).enumerate().collect();
    s.write_rows(0, Write::Delete, &gone).unwrap();
    let back = [(0, json!({"id": 2, "name": "back", "n": 5}).to_string())];
    s.write_rows(0, Write::Upsert, &back).unwrap();
    s.commit().unwrap();
    assert_eq!(
        rows_of(&sql, &table),
        [(1, Some("a2 ✓ 😀".into()), 3), (2, Some("back".into()), 5)]
    );
    // Dead-letter copies, as they were.
    s.begin(false).unwrap();
    let copy = db::DeadLetter {
        reason: Some("transform_error".into()),
        lineage: Some("in/0/7/0".into()),
        key: Some(b"k\0\xff".to_vec()),
        value: Some(b"v".to_vec()),
        headers: r#"[["a", "b"], ["c", null]]"#.into(),
    };
    s.write_dead(std::slice::from_ref(&copy)).unwrap();
    s.commit().unwrap();
    let hex = match backend {
        Backend::Postgres => "encode(key, 'hex')",
        Backend::Mysql => "LOWER(HEX(`key`))",
    };
    let dead = sql.rows(&format!(
        "SELECT reason, lineage, {hex} FROM {}",
        sql.quote(&format!("{table}_dlq"))
    ));
    assert_eq!(
        dead,
        [[
            Some("transform_error".into()),
            Some("in/0/7/0".into()),
            Some("6b00ff".into())
        ]]
    );
}

#[test]
fn rows_are_upserted_by_key_last_wins_and_a_bad_row_is_named_while_the_rest_is_written() {
    for backend in BACKENDS {
        rows_upserted_and_refused(backend);
    }
}

fn opening_refused(backend: Backend) {
    let sql = Sql::connect(backend);
    let table = sales(&sql);
    let offsets = unique_table("offsets");
    let refused = |t: &Target| match db::open(t) {
        Err(NotOpen { step, failure }) => (step, failure),
        Ok(_) => panic!("{backend:?}: opened {t:?}"),
    };
    let mut t = target(backend, &table, &offsets, "g", "a");
    t.password = Some("wrong".into());
    let (step, f) = refused(&t);
    assert_eq!((step, f.kind), (Step::Connect, Kind::Refused), "{f:?}");
    t = target(backend, &table, &offsets, "g", "a");
    t.url = match backend {
        Backend::Postgres => "postgres://exactly@127.0.0.1:1/postgres".into(),
        Backend::Mysql => "mysql://exactly@127.0.0.1:1/offsets".into(),
    };
    let (step, f) = refused(&t);
    assert_eq!((step, f.kind), (Step::Connect, Kind::Other), "{f:?}");
    // A table missing, a keyless table upserted into, a lineage column missing: the setup's.
    t = target(backend, "no_such_table", &offsets, "g", "a");
    let (step, f) = refused(&t);
    assert_eq!((step, f.kind), (Step::Rows, Kind::Setup), "{f:?}");
    assert!(f.message.contains("does not exist"), "{f:?}");
    let keyless = unique_table("keyless");
    sql.batch(&format!("CREATE TABLE {} (a int)", sql.quote(&keyless)));
    t = target(backend, &keyless, &offsets, "g", "a");
    let (step, f) = refused(&t);
    assert_eq!((step, f.kind), (Step::Rows, Kind::Setup), "{f:?}");
    assert!(f.message.contains("no primary key"), "{f:?}");
    t.write = Write::Insert;
    open(&t);
    t = target(backend, &table, &offsets, "g", "a");
    t.lineage_column = Some("lineage".into());
    let (step, f) = refused(&t);
    assert_eq!((step, f.kind), (Step::Rows, Kind::Setup), "{f:?}");
}

#[test]
fn opening_says_where_it_was_refused_and_whose_fault_it_is() {
    for backend in BACKENDS {
        opening_refused(backend);
    }
}

fn mysql(bound: Duration, idle: Duration) -> exactly::db::mysql::Conn {
    let bounds = Bounds {
        statement: bound,
        idle_in_transaction: idle,
        idle_session: None,
    };
    let url = db_url(Backend::Mysql);
    exactly::db::mysql::Conn::connect(&url, Some(&db_password()), bounds).expect("connected")
}

#[test]
fn mysql_the_spark_recipes_kafka_offset_is_an_offsets_table_and_an_old_job_writing_it_is_fenced() {
    let sql = Sql::connect(Backend::Mysql);
    let rows = sales(&sql);
    let table = unique_table("kafka_offset");
    // The job's table and rows, as the recipe made them.
    sql.batch(&format!(
        "CREATE TABLE `{table}` (group_id VARCHAR(255) NOT NULL, topic VARCHAR(255) NOT NULL,
           partition_id INT NOT NULL, fromOffset BIGINT NOT NULL, untilOffset BIGINT NOT NULL,
           PRIMARY KEY (group_id, topic, partition_id))"
    ));
    sql.batch(&format!(
        "REPLACE INTO `{table}` VALUES ('g', 'in', 0, 90, 100), ('other', 'in', 1, 0, 5)"
    ));
    let mut t = target(Backend::Mysql, &rows, &table, "g", "a");
    t.layout = Layout::KafkaOffset;
    let s = open(&t);
    // The job's offset is where partition 0 starts; partition 1 has none (another group's
    // row is not this group's), and takes its seed; partition 2 has neither.
    let got = s
        .claim("in", &[(0, Some(3)), (1, Some(7)), (2, None)])
        .unwrap();
    let starts: Vec<_> = got.iter().map(|c| (c.partition, c.next)).collect();
    assert_eq!(starts, [(0, Some(100)), (1, Some(7)), (2, None)]);
    let epoch = got[0].epoch;
    assert!(got.iter().all(|c| c.epoch == epoch && epoch > 0), "{got:?}");
    s.begin(false).unwrap();
    let moves = [
        advance(0, Some(100), 150, epoch),
        advance(1, Some(7), 8, epoch),
        advance(2, None, 20, epoch),
    ];
    assert!(s.advance("in", &moves).unwrap().is_empty());
    s.commit().unwrap();
    let ranges = sql.rows(&format!(
        "SELECT partition_id, fromOffset, untilOffset FROM `{table}` WHERE group_id = 'g'
         ORDER BY partition_id"
    ));
    let text = |r: &[(i32, i64, i64)]| -> Vec<Vec<Option<String>>> {
        r.iter()
            .map(|(p, f, u)| {
                vec![
                    Some(p.to_string()),
                    Some(f.to_string()),
                    Some(u.to_string()),
                ]
            })
            .collect()
    };
    assert_eq!(ranges, text(&[(0, 100, 150), (1, 7, 8), (2, 20, 20)]));
    // The old job, still running, writes its offset the recipe's way: exactly's next
    // compare-and-set finds it and moves nothing.
    sql.batch(&format!(
        "REPLACE INTO `{table}` VALUES ('g', 'in', 0, 150, 160)"
    ));
    s.begin(false).unwrap();
    let moves = [
        advance(0, Some(150), 170, epoch),
        advance(1, Some(8), 9, epoch),
    ];
    assert_eq!(s.advance("in", &moves).unwrap(), [0]);
    s.rollback().unwrap();
    // Another instance's claim fences this one through the owners' table.
    let b = open(&t);
    let theirs = b.claim("in", &[(1, None)]).unwrap();
    assert!(theirs[0].epoch > epoch, "{theirs:?}");
    s.begin(false).unwrap();
    let stale = s.advance("in", &[advance(1, Some(8), 9, epoch)]);
    assert_eq!(stale.unwrap(), [1]);
    s.rollback().unwrap();
    // A row that appeared since a claim found none is no insert of ours.
    let fresh = s.claim("in", &[(3, None)]).unwrap();
    sql.batch(&format!(
        "INSERT INTO `{table}` VALUES ('g', 'in', 3, 0, 1)"
    ));
    s.begin(false).unwrap();
    let late = s.advance("in", &[advance(3, None, 5, fresh[0].epoch)]);
    assert_eq!(late.unwrap(), [3]);
    s.rollback().unwrap();
}

/// MySQL has no bound on an idle transaction, only on an idle session (`wait_timeout`): the
/// sink's sessions set it, and a zombie's open transaction ends with its connection. Shown
/// on MariaDB as MySQL would be: without its idle-transaction bound (0: none).
#[test]
fn mysql_a_zombies_transaction_ends_with_its_idle_session() {
    let sql = Sql::connect(Backend::Mysql);
    let table = unique_table("idle");
    sql.batch(&format!(
        "CREATE TABLE `{table}` (id INT PRIMARY KEY, n INT)"
    ));
    sql.batch(&format!("INSERT INTO `{table}` VALUES (1, 1)"));
    let bounds = Bounds {
        statement: Duration::from_secs(5),
        idle_in_transaction: Duration::from_secs(5),
        idle_session: Some(Duration::from_secs(1)),
    };
    let url = db_url(Backend::Mysql);
    let zombie = exactly::db::mysql::Conn::connect(&url, Some(&db_password()), bounds).unwrap();
    zombie
        .batch("SET SESSION idle_transaction_timeout = 0")
        .unwrap();
    zombie.batch("START TRANSACTION").unwrap();
    zombie
        .batch(&format!("UPDATE `{table}` SET n = 4 WHERE id = 1"))
        .unwrap();
    std::thread::sleep(Duration::from_millis(2500));
    // The row is free: another writer takes its lock at once.
    let other = mysql(Duration::from_secs(5), Duration::from_secs(30));
    other
        .batch(&format!("UPDATE `{table}` SET n = 5 WHERE id = 1"))
        .unwrap();
    let e = zombie.batch("COMMIT").unwrap_err();
    assert!(e.closed, "{e:?}");
    assert_eq!(
        sql.count(&format!("SELECT n FROM `{table}` WHERE id = 1")),
        5
    );
}

/// The recipes create `kafka_offset` with the server's collation, which ignores case: names
/// still compare exactly. A group or topic whose name collides with another's there is
/// refused, with the fix; once the names are exact, the two keep their own rows.
#[test]
fn mysql_a_kafka_offset_table_blind_to_case_never_lets_two_groups_share_rows() {
    let sql = Sql::connect(Backend::Mysql);
    let rows = sales(&sql);
    let table = unique_table("kafka_offset");
    sql.batch(&format!(
        "CREATE TABLE `{table}` (group_id VARCHAR(255) NOT NULL, topic VARCHAR(255) NOT NULL,
           partition_id INT NOT NULL, fromOffset BIGINT NOT NULL, untilOffset BIGINT NOT NULL,
           PRIMARY KEY (group_id, topic, partition_id)) CHARACTER SET utf8mb4
           COLLATE utf8mb4_general_ci"
    ));
    sql.batch(&format!(
        "REPLACE INTO `{table}` VALUES ('orders', 'in', 0, 90, 100), ('g', 'IN', 0, 5, 7)"
    ));
    let t = |group: &str| {
        let mut t = target(Backend::Mysql, &rows, &table, group, "a");
        t.layout = Layout::KafkaOffset;
        t
    };
    let refused = |f: db::Failure, other: &str| {
        assert_eq!(f.kind, Kind::Setup, "{f:?}");
        assert!(f.message.contains(&format!("'{other}'")), "{f:?}");
        assert!(f.message.contains("COLLATE utf8mb4_bin"), "{f:?}");
    };
    match db::open(&t("Orders")) {
        Err(NotOpen { step, failure }) => {
            assert_eq!(step, Step::Offsets);
            refused(failure, "orders");
        }
        Ok(_) => panic!("group Orders opened a table holding orders's rows"),
    }
    let g = open(&t("g"));
    refused(g.claim("in", &[(0, None)]).unwrap_err(), "IN");
    // Exact names: Orders's rows are its own, orders's stay as they were.
    sql.batch(&format!(
        "ALTER TABLE `{table}` MODIFY group_id VARCHAR(255) CHARACTER SET utf8mb4 COLLATE
           utf8mb4_bin NOT NULL, MODIFY topic VARCHAR(255) CHARACTER SET utf8mb4 COLLATE
           utf8mb4_bin NOT NULL"
    ));
    let s = open(&t("Orders"));
    let got = s.claim("in", &[(0, Some(3))]).unwrap();
    assert_eq!(got[0].next, Some(3), "its own row, seeded: {got:?}");
    s.begin(false).unwrap();
    let moves = [advance(0, Some(3), 4, got[0].epoch)];
    assert!(s.advance("in", &moves).unwrap().is_empty());
    s.commit().unwrap();
    let theirs = sql.rows(&format!(
        "SELECT untilOffset FROM `{table}` WHERE group_id = 'orders' COLLATE utf8mb4_bin"
    ));
    assert_eq!(theirs, vec![vec![Some("100".to_string())]]);
}

#[test]
fn mysql_json_values_become_typed_columns_as_postgres_would_take_them() {
    let sql = Sql::connect(Backend::Mysql);
    let table = unique_table("shapes");
    sql.batch(&format!(
        "CREATE TABLE `{table}` (k VARCHAR(20) PRIMARY KEY, t TEXT, amount DECIMAL(40, 20),
           ok BOOLEAN, doc JSON, at DATETIME(3), big BIGINT UNSIGNED)"
    ));
    let offsets = unique_table("offsets");
    let s = open(&target(Backend::Mysql, &table, &offsets, "g", "a"));
    s.begin(false).unwrap();
    let batch = [
        json!({"k": "a", "t": "plain", "amount": 12345678901234567890.12345678901234567890_f64,
               "ok": true, "doc": {"x": [1, "é"]}, "at": "2026-12-05 10:11:12.345",
               "big": 18446744073709551615_u64}),
        // A case-blind key: `A` is `a`'s row, and comes later: it wins.
        json!({"k": "A", "t": {"an": "object"}, "amount": "1.10", "ok": false, "doc": "text"}),
        json!({"k": "b", "t": 42, "ok": null, "doc": null}),
    ];
    let batch: Vec<(usize, String)> = batch.iter().map(|v| v.to_string()).enumerate().collect();
    // Numbers as written (serde_json keeps what it parsed, f64 here: one number typed by
    // hand instead).
    let mut batch = batch;
    batch[0].1 = batch[0].1.replacen(
        &json!(12345678901234567890.12345678901234567890_f64).to_string(),
        "12345678901234567890.12345678901234567890",
        1,
    );
    s.write_rows(0, Write::Upsert, &batch).unwrap();
    s.commit().unwrap();
    let got = sql.rows(&format!(
        "SELECT k, t, amount, ok, doc, at, big FROM `{table}` ORDER BY k"
    ));
    let some = |s: &str| Some(s.to_string());
    assert_eq!(
        got,
        [
            // The key as first written (an upsert updates the other columns).
            vec![
                some("a"),
                some(r#"{"an":"object"}"#),
                some("1.10000000000000000000"),
                some("0"),
                some(r#""text""#),
                None,
                None
            ],
            vec![some("b"), some("42"), None, None, None, None, None],
        ]
    );
    // The first row on its own: every digit, the JSON document, the unsigned maximum.
    sql.batch(&format!("DELETE FROM `{table}`"));
    s.begin(false).unwrap();
    s.write_rows(0, Write::Upsert, &batch[..1]).unwrap();
    s.commit().unwrap();
    let got = sql.rows(&format!("SELECT amount, ok, doc, at, big FROM `{table}`"));
    assert_eq!(
        got,
        [[
            some("12345678901234567890.12345678901234567890"),
            some("1"),
            some(r#"{"x":[1,"é"]}"#),
            some("2026-12-05 10:11:12.345"),
            some("18446744073709551615")
        ]]
    );
}

#[test]
fn mysql_batches_go_in_chunks_under_max_allowed_packet_and_a_row_over_it_is_the_rows_fault() {
    let sql = Sql::connect(Backend::Mysql);
    let table = unique_table("wide");
    sql.batch(&format!(
        "CREATE TABLE `{table}` (id INT PRIMARY KEY, payload LONGTEXT)"
    ));
    let packet = sql.count("SELECT @@max_allowed_packet") as usize;
    let offsets = unique_table("offsets");
    let s = open(&target(Backend::Mysql, &table, &offsets, "g", "a"));
    // Half again the packet in all, in rows of 1/20 of it: two statements at least.
    let payload = "x".repeat(packet / 20);
    let rows: Vec<(usize, String)> = (0..30)
        .map(|i| (i, json!({"id": i, "payload": payload}).to_string()))
        .collect();
    s.begin(false).unwrap();
    s.write_rows(0, Write::Upsert, &rows).unwrap();
    s.commit().unwrap();
    let written = sql.count(&format!(
        "SELECT count(*) FROM `{table}` WHERE LENGTH(payload) = {}",
        payload.len()
    ));
    assert_eq!(written, 30);
    // A row larger than a packet can hold goes to the dead letters, the rest is written.
    let huge = json!({"id": 100, "payload": "y".repeat(packet)}).to_string();
    let batch = [(0, json!({"id": 99}).to_string()), (1, huge)];
    s.begin(false).unwrap();
    match s.write_rows(0, Write::Upsert, &batch) {
        Err(Unwritten::Rows(refused)) => {
            assert_eq!(refused.len(), 1, "{refused:?}");
            assert_eq!(
                (refused[0].0, refused[0].1.kind),
                (1, Kind::Data("ROW_TOO_LARGE"))
            );
        }
        other => panic!("{other:?}"),
    }
    s.commit().unwrap();
    assert_eq!(
        sql.count(&format!("SELECT count(*) FROM `{table}` WHERE id = 99")),
        1
    );
}

#[test]
fn mysql_tables_an_upsert_cannot_keep_to_its_key_or_a_failed_statement_cannot_undo_are_refused() {
    let sql = Sql::connect(Backend::Mysql);
    let offsets = unique_table("offsets");
    let unique = unique_table("unique");
    sql.batch(&format!(
        "CREATE TABLE `{unique}` (id INT PRIMARY KEY, email VARCHAR(100) UNIQUE)"
    ));
    let refused = |t: &Target| match db::open(t) {
        Err(NotOpen { step, failure }) => (step, failure),
        Ok(_) => panic!("opened {t:?}"),
    };
    let mut t = target(Backend::Mysql, &unique, &offsets, "g", "a");
    let (step, f) = refused(&t);
    assert_eq!((step, f.kind), (Step::Rows, Kind::Setup));
    assert!(f.message.contains("unique index"), "{f:?}");
    t.write = Write::Insert;
    open(&t);
    let myisam = unique_table("myisam");
    sql.batch(&format!(
        "CREATE TABLE `{myisam}` (id INT PRIMARY KEY) ENGINE=MyISAM"
    ));
    let (step, f) = refused(&target(Backend::Mysql, &myisam, &offsets, "g", "a"));
    assert_eq!((step, f.kind), (Step::Rows, Kind::Setup));
    assert!(f.message.contains("not InnoDB"), "{f:?}");
}

#[test]
fn mysql_a_call_past_its_bound_is_ended_on_the_server_and_a_zombies_transaction_does_not_last() {
    let sql = Sql::connect(Backend::Mysql);
    // The server's bound on a lock wait: a conflict, the connection goes on.
    let table = unique_table("locks");
    sql.batch(&format!(
        "CREATE TABLE `{table}` (id INT PRIMARY KEY, n INT)"
    ));
    sql.batch(&format!("INSERT INTO `{table}` VALUES (1, 1)"));
    let holder = mysql(Duration::from_secs(10), Duration::from_secs(30));
    holder.batch("START TRANSACTION").unwrap();
    holder
        .batch(&format!("UPDATE `{table}` SET n = 2 WHERE id = 1"))
        .unwrap();
    let waiter = mysql(Duration::from_secs(1), Duration::from_secs(30));
    let e = waiter
        .batch(&format!("UPDATE `{table}` SET n = 3 WHERE id = 1"))
        .unwrap_err();
    // The lock wait's bound (1205) or the statement's (MariaDB's max_statement_time, 1969),
    // whichever the server counts first: either aborts and replays the transaction.
    assert!(
        matches!(e.code.as_deref(), Some("1205" | "1969")) && !e.closed,
        "{e:?}"
    );
    assert!(waiter.usable());
    holder.batch("ROLLBACK").unwrap();
    // A statement the server does not end: the client's bound drops the connection and ends
    // it on the server.
    let slow = mysql(Duration::from_millis(500), Duration::from_secs(30));
    slow.batch("SET SESSION max_statement_time = 0").unwrap();
    let id = sql.count("SELECT max(ID) FROM information_schema.PROCESSLIST");
    let started = std::time::Instant::now();
    let e = slow.batch("SELECT SLEEP(20)").unwrap_err();
    assert!(
        e.closed && e.message.contains("ended on the server"),
        "{e:?}"
    );
    assert!(started.elapsed() < Duration::from_secs(5));
    assert!(!slow.usable());
    assert!(slow.batch("SELECT 1").unwrap_err().closed);
    let sleeping = sql.count(
        "SELECT count(*) FROM information_schema.PROCESSLIST WHERE INFO = 'SELECT SLEEP(20)'",
    );
    assert_eq!(sleeping, 0, "(connection {id})");
    // An open transaction left idle (a paused process) is ended by the server, its locks
    // with it.
    let zombie = mysql(Duration::from_secs(1), Duration::from_secs(1));
    zombie.batch("START TRANSACTION").unwrap();
    zombie
        .batch(&format!("UPDATE `{table}` SET n = 4 WHERE id = 1"))
        .unwrap();
    std::thread::sleep(Duration::from_millis(2500));
    let e = zombie.batch("COMMIT").unwrap_err();
    assert!(e.closed, "{e:?}");
    assert_eq!(
        sql.count(&format!("SELECT n FROM `{table}` WHERE id = 1")),
        1
    );
}
