//! `exactly offsets import|export|show` against the real broker and real stores: a Redis and a
//! MariaDB that `scripts/test.sh` starts on loopback (`scripts/stores.sh`), and files.
//!
//! The import tests end with `exactly run`: for every partition, the first output is the record
//! at the imported offset, with nothing before it and nothing skipped.

mod common;

use std::collections::BTreeMap;
use std::process::{Command, Output};
use std::time::Duration;

use common::*;

fn env(name: &str) -> String {
    std::env::var(name).unwrap_or_else(|_| {
        panic!("{name} is not set: run the tests through scripts/test.sh, which starts the stores")
    })
}

const PASSWORD_VAR: &str = "EXACTLY_TEST_STORE_PASSWORD";

/// `exactly offsets ARGS…`, the store's password in the environment.
fn offsets(args: &[&str]) -> Output {
    let out = Command::new(env!("CARGO_BIN_EXE_exactly"))
        .arg("offsets")
        .args(args)
        .output()
        .unwrap();
    // The password never shows, whatever happened.
    let password = env(PASSWORD_VAR);
    for stream in [&out.stdout, &out.stderr] {
        assert!(
            !String::from_utf8_lossy(stream).contains(&password),
            "the password was printed: {}",
            String::from_utf8_lossy(stream)
        );
    }
    out
}

/// The group and topic arguments every command takes.
fn group_args<'a>(topics: &'a Topics, group: &'a str, b: &'a str) -> Vec<&'a str> {
    vec![
        "--bootstrap-servers",
        b,
        "--group-id",
        group,
        "--input-topics",
        &topics.input,
    ]
}

/// 3 partitions of 100 records each.
fn topics(name: &str) -> Topics {
    let topics = Topics::create(name, 3, 3);
    produce(&topics.input, &numbered(300, 3));
    topics
}

/// Runs exactly from the group's offsets to the end; returns each input partition's output
/// offsets, in order.
fn run_to_end(topics: &Topics, group: &str) -> BTreeMap<i32, Vec<i64>> {
    let mut ex = Exactly::start(&base_args(topics, group, &format!("{group}-0")));
    wait_all_committed(group, &topics.input, Duration::from_secs(120));
    ex.stop_cleanly();
    let mut by_partition: BTreeMap<i32, Vec<i64>> = BTreeMap::new();
    for o in read_all(&topics.output, "read_committed") {
        let (_, p, offset, _) = o.lineage();
        by_partition.entry(p).or_default().push(offset);
    }
    for v in by_partition.values_mut() {
        v.sort_unstable();
    }
    by_partition
}

/// The import worked: outputs start exactly at the imported offsets and skip nothing.
fn assert_starts_at(outputs: &BTreeMap<i32, Vec<i64>>, starts: &[(i32, i64)]) {
    for &(p, start) in starts {
        let want: Vec<i64> = (start..100).collect();
        let got = outputs.get(&p).cloned().unwrap_or_default();
        assert_eq!(got, want, "partition {p}: outputs should be {start}..100");
    }
}

/// Database 1, not the default 0: the password must be given before the database is chosen.
fn redis_url() -> String {
    let url = env("EXACTLY_TEST_REDIS_URL");
    format!("{}/1", url.rsplit_once('/').unwrap().0)
}

fn redis_con() -> redis::Connection {
    let mut con = redis::Client::open(env("EXACTLY_TEST_REDIS_URL").as_str())
        .unwrap()
        .get_connection()
        .unwrap();
    redis::cmd("AUTH")
        .arg(env(PASSWORD_VAR))
        .query::<()>(&mut con)
        .unwrap();
    redis::cmd("SELECT").arg(1).query::<()>(&mut con).unwrap();
    con
}

/// SQL through the mariadb client on the server's socket (as root).
fn sql(statement: &str) -> String {
    let out = Command::new("mariadb")
        .args([
            "--no-defaults",
            "-uroot",
            "-N",
            "-B",
            "offsets",
            "-e",
            statement,
        ])
        .arg(format!("--socket={}", env("EXACTLY_TEST_MYSQL_SOCKET")))
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", said(&out));
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn import(topics: &Topics, group: &str, from: &str, extra: &[&str]) -> Output {
    let b = bootstrap();
    let mut args = vec!["import"];
    args.extend(group_args(topics, group, &b));
    args.extend(["--from", from, "--password-env", PASSWORD_VAR]);
    args.extend(extra);
    offsets(&args)
}

#[test]
fn import_from_redis_then_run_starts_exactly_there() {
    let topics = topics("off-redis");
    let group = unique("off-redis-g");
    redis::cmd("HSET")
        .arg(format!("offset:{}:{group}", topics.input))
        .arg(0)
        .arg(10)
        .arg(1)
        .arg(57)
        .arg(2)
        .arg(100)
        .query::<()>(&mut redis_con())
        .unwrap();
    let out = import(&topics, &group, &redis_url(), &[]);
    assert!(out.status.success(), "{}", said(&out));
    assert!(said(&out).contains("committed 3 offsets"), "{}", said(&out));
    assert_eq!(
        committed(&group, &topics.input),
        BTreeMap::from([(0, 10), (1, 57), (2, 100)])
    );
    assert_starts_at(&run_to_end(&topics, &group), &[(0, 10), (1, 57), (2, 100)]);

    // Export to the topic-only layout, then import it into a new group: the same offsets.
    let url = redis_url();
    let out = export_to_redis(&topics, &group, &["--redis-key", "{topic}"]);
    assert!(out.status.success(), "{}", said(&out));
    let back: BTreeMap<String, String> = redis::cmd("HGETALL")
        .arg(&topics.input)
        .query(&mut redis_con())
        .unwrap();
    let want: BTreeMap<String, String> = [("0", "100"), ("1", "100"), ("2", "100")]
        .map(|(p, o)| (p.into(), o.into()))
        .into();
    assert_eq!(back, want);
    let again = unique("off-redis-again");
    let out = import(&topics, &again, &url, &["--redis-key", "{topic}"]);
    assert!(out.status.success(), "{}", said(&out));
    assert_eq!(
        committed(&again, &topics.input),
        committed(&group, &topics.input)
    );
}

/// `exactly offsets export` of `group` to Redis, with `layout`.
fn export_to_redis(topics: &Topics, group: &str, layout: &[&str]) -> Output {
    let b = bootstrap();
    let mut args = vec!["export"];
    args.extend(group_args(topics, group, &b));
    let url = redis_url();
    args.extend(["--to", &url, "--password-env", PASSWORD_VAR]);
    args.extend(layout);
    offsets(&args)
}

#[test]
fn a_hash_shared_by_groups_moves_field_by_field_and_other_groups_stay() {
    let topics = topics("off-rshared");
    let group = unique("off-rshared-g");
    // A seed job's layout: jedis.hset(topic, groupId + "|" + partition, untilOffset).
    let field = |p: i32| format!("{group}|{p}");
    redis::cmd("HSET")
        .arg(&topics.input)
        .arg(field(0))
        .arg(10)
        .arg(field(1))
        .arg(57)
        .arg(field(2))
        .arg(100)
        .arg("other|0")
        .arg(5)
        .query::<()>(&mut redis_con())
        .unwrap();
    let url = redis_url();
    // The partition-per-field layout refuses it, and says which layout it may be.
    let out = import(&topics, &group, &url, &["--redis-key", "{topic}"]);
    assert!(!out.status.success(), "{}", said(&out));
    assert!(
        said(&out).contains("--redis-field '{group}|{partition}'"),
        "{}",
        said(&out)
    );
    let layout = [
        "--redis-key",
        "{topic}",
        "--redis-field",
        "{group}|{partition}",
    ];
    let out = import(&topics, &group, &url, &layout);
    assert!(out.status.success(), "{}", said(&out));
    assert_eq!(
        committed(&group, &topics.input),
        BTreeMap::from([(0, 10), (1, 57), (2, 100)])
    );
    assert_starts_at(&run_to_end(&topics, &group), &[(0, 10), (1, 57), (2, 100)]);
    // Export: this group's fields move to where exactly got; the other group's stays.
    let out = export_to_redis(&topics, &group, &layout);
    assert!(out.status.success(), "{}", said(&out));
    let back: BTreeMap<String, String> = redis::cmd("HGETALL")
        .arg(&topics.input)
        .query(&mut redis_con())
        .unwrap();
    let mut want: BTreeMap<String, String> = (0..3).map(|p| (field(p), "100".into())).collect();
    want.insert("other|0".into(), "5".into());
    assert_eq!(back, want);
}

#[test]
fn import_from_mysql_then_run_starts_exactly_there() {
    let topics = topics("off-mysql");
    let group = unique("off-mysql-g");
    // The recipe keeps one row per partition; the job resumes from untilOffset.
    sql(&format!(
        "INSERT INTO kafka_offset VALUES ('{group}', '{t}', 0, 0, 33), ('{group}', '{t}', 1, 0, 0), \
         ('{group}', '{t}', 2, 80, 99)",
        t = topics.input
    ));
    let url = env("EXACTLY_TEST_MYSQL_URL");
    let out = import(&topics, &group, &url, &[]);
    assert!(out.status.success(), "{}", said(&out));
    assert_starts_at(&run_to_end(&topics, &group), &[(0, 33), (1, 0), (2, 99)]);

    // Export writes REPLACE INTO rows, which import reads back.
    let b = bootstrap();
    // The password from a file this time.
    let secret = std::env::temp_dir().join(unique("mysql-password"));
    std::fs::write(&secret, format!("{}\n", env(PASSWORD_VAR))).unwrap();
    let secret = secret.display().to_string();
    let mut args = vec!["export"];
    args.extend(group_args(&topics, &group, &b));
    args.extend(["--to", &url, "--password-file", &secret]);
    let out = offsets(&args);
    assert!(out.status.success(), "{}", said(&out));
    let rows = sql(&format!(
        "SELECT partition_id, fromOffset, untilOffset FROM kafka_offset WHERE group_id = '{group}' \
         ORDER BY partition_id"
    ));
    assert_eq!(rows, "0\t100\t100\n1\t100\t100\n2\t100\t100\n");

    // A wrong password: exit 3, the store named, the password nowhere (checked in `offsets`).
    let out = Command::new(env!("CARGO_BIN_EXE_exactly"))
        .arg("offsets")
        .arg("import")
        .args(group_args(&topics, &group, &b))
        .args(["--from", &url, "--password-env", "WRONG"])
        .env("WRONG", "not-the-password")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(3), "{}", said(&out));
    assert!(said(&out).contains("mysql://exactly@"), "{}", said(&out));
    assert!(!said(&out).contains("not-the-password"), "{}", said(&out));
}

#[test]
fn import_from_files_and_export_back() {
    let topics = topics("off-file");
    let group = unique("off-file-g");
    let dir = std::env::temp_dir().join(unique("off-file"));
    std::fs::create_dir_all(dir.join("batches")).unwrap();
    // The last file by name is the newest batch.
    let t = &topics.input;
    std::fs::write(
        dir.join("batches/0001.csv"),
        format!("{t},0,1\n{t},1,1\n{t},2,1\n"),
    )
    .unwrap();
    std::fs::write(
        dir.join("batches/0002.csv"),
        format!("topic,partition,offset\n{t},0,20\n{t},1,40\n{t},2,60\n"),
    )
    .unwrap();
    // A batch still being written, and one kept aside: neither is the newest batch.
    std::fs::write(dir.join("batches/0003.csv.tmp"), format!("{t},0,")).unwrap();
    std::fs::write(dir.join("batches/.0004.csv.crc"), "crc").unwrap();
    let url = format!("file://{}", dir.join("batches").display());
    // --file names another; the plan says which file it read.
    let out = import(&topics, &group, &url, &["--file", "0001.csv", "--dry-run"]);
    assert!(out.status.success(), "{}", said(&out));
    assert!(said(&out).contains("batches/0001.csv"), "{}", said(&out));
    let out = import(&topics, &group, &url, &[]);
    assert!(out.status.success(), "{}", said(&out));
    assert!(
        said(&out).contains("from file ") && said(&out).contains("batches/0002.csv"),
        "{}",
        said(&out)
    );
    assert_starts_at(&run_to_end(&topics, &group), &[(0, 20), (1, 40), (2, 60)]);

    let json = dir.join("out.json");
    let b = bootstrap();
    let mut args = vec!["export"];
    args.extend(group_args(&topics, &group, &b));
    let to = format!("file://{}", json.display());
    args.extend(["--to", &to]);
    assert!(offsets(&args).status.success());
    let written: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    assert_eq!(written.as_array().unwrap().len(), 3);
    assert_eq!(written[0]["offset"], 100);
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn import_validates_before_it_writes() {
    let topics = topics("off-check");
    let group = unique("off-check-g");
    let dir = std::env::temp_dir().join(unique("off-check"));
    std::fs::create_dir_all(&dir).unwrap();
    let t = &topics.input;
    let file = |name: &str, text: String| {
        let path = dir.join(name);
        std::fs::write(&path, text).unwrap();
        format!("file://{}", path.display())
    };
    let fail = |from: &str, extra: &[&str], why: &str| {
        let out = import(&topics, &group, from, extra);
        assert_eq!(out.status.code(), Some(2), "{}", said(&out));
        assert!(said(&out).contains(why), "wanted {why:?}: {}", said(&out));
        assert!(
            committed(&group, &topics.input).is_empty(),
            "nothing may be committed"
        );
    };

    // A partition the store does not have.
    let partial = file("partial.csv", format!("{t},0,5\n{t},1,5\n"));
    fail(
        &partial,
        &[],
        &format!("{t}[2] has no offset in the store; --missing"),
    );
    // An offset past the end, or before the start.
    let past = file("past.csv", format!("{t},0,5\n{t},1,500\n{t},2,5\n"));
    fail(
        &past,
        &[],
        &format!("{t}[1]: the store says 500, outside the partition's offsets 0..100"),
    );
    fail(
        &file("neg.csv", format!("{t},0,-3\n{t},1,5\n{t},2,5\n")),
        &[],
        "says -3",
    );
    // A store that cannot be read.
    fail(
        &file("bad.csv", format!("{t},zero,5\n")),
        &[],
        "line 1: partition 'zero'",
    );
    // A password on the command line: refused, and not repeated.
    let out = import(
        &topics,
        &group,
        "mysql://exactly:secret@127.0.0.1:1/offsets",
        &[],
    );
    assert_eq!(out.status.code(), Some(2), "{}", said(&out));
    assert!(
        said(&out).contains("--password-env or --password-file"),
        "{}",
        said(&out)
    );
    assert!(!said(&out).contains("secret"), "{}", said(&out));
    // A store with nothing for the topic (a wrong key, table or group): refused even with
    // --missing, which would otherwise move every partition.
    let other = file("other.csv", "some-other-topic,0,5\n".to_string());
    fail(
        &other,
        &["--missing", "latest"],
        &format!("no offset of topic '{t}'"),
    );

    // --dry-run prints the plan and commits nothing.
    let out = import(
        &topics,
        &group,
        &partial,
        &["--missing", "latest", "--dry-run"],
    );
    assert!(out.status.success(), "{}", said(&out));
    let text = said(&out);
    assert!(
        text.contains("lag after") && text.contains("missing: latest"),
        "{text}"
    );
    assert!(text.contains("dry run: nothing committed"), "{text}");
    assert!(committed(&group, &topics.input).is_empty());
    // --missing and --clamp make it go through.
    let out = import(&topics, &group, &past, &["--clamp"]);
    assert!(out.status.success(), "{}", said(&out));
    assert_eq!(
        committed(&group, &topics.input),
        BTreeMap::from([(0, 5), (1, 100), (2, 5)])
    );

    // A group in use: refused, and said so.
    let ex = Exactly::start(&base_args(&topics, &group, &format!("{group}-0")));
    wait_all_committed(&group, &topics.input, Duration::from_secs(120));
    let out = import(&topics, &group, &partial, &["--missing", "earliest"]);
    assert_eq!(out.status.code(), Some(2), "{}", said(&out));
    assert!(said(&out).contains("active member"), "{}", said(&out));
    // A dry run says so too.
    let out = import(
        &topics,
        &group,
        &partial,
        &["--missing", "earliest", "--dry-run"],
    );
    assert!(said(&out).contains("active member"), "{}", said(&out));
    drop(ex);

    // show: committed, LSO, high watermark, lag.
    let b = bootstrap();
    let mut args = vec!["show"];
    args.extend(group_args(&topics, &group, &b));
    let out = offsets(&args);
    let text = said(&out);
    assert!(
        out.status.success() && text.contains("LSO") && text.contains("lag"),
        "{text}"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}
