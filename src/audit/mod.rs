//! `exactly audit`: evidence that a pipeline delivered exactly once.
//!
//! The audit reads a bounded range of the input, the output and DLQ topics as a downstream
//! consumer does (read_committed), replays the transform over the input, and matches every
//! output to its input through the lineage header. A call-out pipeline's application cannot be
//! replayed blindly: without `--replay-call` the audit accounts by lineage alone (every judged
//! input in the output or the DLQ, none twice, no output index missing). [`analyze`] is a pure function over what was
//! read, so the checks are unit-tested on fabricated histories; [`read`] does the reading.

pub mod read;
mod report;
pub mod table;

pub use report::{History, PartitionState, Range, Report};

use std::collections::{BTreeMap, HashMap, HashSet};

use crate::config::{AuditConfig, OnError, TransformSpec};
use crate::error::Error;
use crate::headers::{self, LINEAGE};
use crate::records;
pub use crate::transform::OwnedRecord as Rec;
use crate::transform::call::{self, Answer, Application};
use crate::transform::{Failure, Fate, InputRecord, Limits, OutputRecord, Transform};

/// `exactly audit`: 0 clean, 1 anomalies, 2 bad options, 3 could not complete.
pub fn command(args: crate::config::AuditArgs) -> u8 {
    crate::telemetry::init(crate::config::LogFormat::Text, "warn");
    let config = match args.validate() {
        Ok(c) => c,
        Err(e) => {
            eprintln!("error: {e}");
            return 2;
        }
    };
    let json = config.json;
    match run(config) {
        Ok(report) => {
            if json {
                match serde_json::to_string_pretty(&report) {
                    Ok(s) => println!("{s}"),
                    Err(e) => eprintln!("error: {e}"),
                }
            } else {
                print!("{}", report.summary());
            }
            if report.anomalies() == 0 { 0 } else { 1 }
        }
        Err(e) => {
            eprintln!("error: {e}");
            match e {
                Error::Config(_) | Error::Jq(_) => 2,
                _ => 3,
            }
        }
    }
}

/// Runs an audit: reads the history, replays the transform (a call-out's application only
/// when told to), returns the report.
pub fn run(config: AuditConfig) -> Result<Report, Error> {
    let t = &config.transform;
    // Compiled before anything is read: a bad program fails at once with jaq's message.
    let transform = match (&t.spec, &config.dedup) {
        (_, Some(dedup)) => Some(dedup_replay(dedup, t)?),
        (TransformSpec::Call(_), None) => None,
        _ => Some(crate::transform::build(t)?),
    };
    let mut history = read::collect(&config.plan)?;
    let rows = match &config.db {
        Some(target) => Some(table::read(
            target,
            config.plan.group.as_deref(),
            &mut history,
        )?),
        None => None,
    };
    let mut replay = match (&t.spec, transform) {
        (_, Some(transform)) => Replay::Transform(transform),
        (TransformSpec::Call(spec), None) if config.replay_call => Replay::Answers {
            answers: replay_call(spec, &history)?,
            limits: Limits::of(t),
        },
        (_, None) => Replay::Lineage,
    };
    let default_output = match (&config.db, config.plan.outputs.first()) {
        (Some(target), _) => target.rows.clone(),
        (None, Some(o)) => o.clone(),
        (None, None) => return Err(Error::Config("--output-topic: none given".into())),
    };
    let (on_error, max) = (config.on_error, config.max_message_bytes);
    match &rows {
        None => Ok(analyze(
            &history,
            &mut replay,
            on_error,
            &default_output,
            max,
        )),
        Some(table) => {
            let parts = analyze_parts(&history, &mut replay, on_error, &default_output, max);
            table::check(parts, table).map_err(|e| Error::Store(format!("--db-url: {e}")))
        }
    }
}

/// The pipeline's dedup, replayed in memory from nothing (the audit reads every input from
/// the start of its partition, so it sees what came first).
fn dedup_replay(
    dedup: &crate::config::DedupConfig,
    t: &crate::config::TransformConfig,
) -> Result<Box<dyn Transform>, Error> {
    let programs = crate::transform::dedup::programs(dedup, t)?;
    let source = Box::new(crate::state::restore::Empty);
    let metrics = crate::metrics::Metrics::new();
    let replay = crate::transform::dedup::Dedup::new(dedup, programs, source, None, metrics);
    Ok(Box::new(replay))
}

/// An output's lineage: its input's topic, partition and offset, and its index.
pub type Lineage = (String, i32, i64, usize);

/// What one output should be.
#[derive(Debug)]
pub struct Expected {
    topic: String,
    key: Option<Vec<u8>>,
    value: Option<Vec<u8>>,
}

/// What the audit replays to know what each input should have become.
pub enum Replay {
    /// Nothing: a call-out whose application is not asked again. Judged by lineage alone.
    Lineage,
    /// The transform the pipeline runs.
    Transform(Box<dyn Transform>),
    /// The call-out's application, asked again: its answer for each input.
    Answers {
        /// By (topic, partition, offset).
        answers: HashMap<(String, i32, i64), Answer>,
        /// The limits the pipeline holds answers to.
        limits: Limits,
    },
}

impl Replay {
    /// Whether there is anything to compare with.
    fn replays(&self) -> bool {
        !matches!(self, Replay::Lineage)
    }

    /// What `input` becomes in the replay; [`Replay::settle`] says what the pipeline made of it.
    fn outputs<'a>(&mut self, input: &InputRecord<'a>) -> Result<Vec<OutputRecord<'a>>, Failure> {
        match self {
            Replay::Lineage => Err(Failure::Unavailable("no replay".into())),
            Replay::Transform(t) => t.apply(input),
            Replay::Answers { answers, limits } => {
                let id = (input.topic.to_string(), input.partition, input.offset);
                match answers.remove(&id) {
                    Some(answer) => call::outputs(input, answer, limits),
                    None => Err(Failure::Unavailable(format!(
                        "no answer for {}",
                        input.lineage()
                    ))),
                }
            }
        }
    }
}

impl Replay {
    /// What became of the input last replayed, as the pipeline's writer decided it: a
    /// stateful transform keeps only what went out. Each record is its own unit: what it
    /// decided is committed (and what it holds stays bounded: closed windows go).
    fn settle(&mut self, fate: Fate) {
        if let Replay::Transform(t) = self {
            t.decided(fate);
            t.committed();
        }
    }
}

/// The call-out's application, asked again about every input of `history` (in batches of
/// `--call-batch-records`): its answers, for the replay.
pub fn replay_call(
    spec: &crate::config::CallSpec,
    history: &History,
) -> Result<HashMap<(String, i32, i64), Answer>, Error> {
    let failed = |why: String| Error::Startup(format!("--replay-call: {why}"));
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .map_err(|e| failed(e.to_string()))?;
    let app = call::Http::new(spec, runtime.handle().clone())?;
    let mut answers = HashMap::new();
    for batch in history.inputs.chunks(spec.batch_records.max(1)) {
        let inputs: Vec<InputRecord<'_>> = batch.iter().map(Rec::as_input).collect();
        let called = app
            .submit(&inputs, spec.timeout)
            .wait(spec.timeout + std::time::Duration::from_secs(1));
        let got = match called.map(|c| c.answers) {
            Some(Ok(got)) => got,
            Some(Err(e)) => return Err(failed(e.to_string())),
            None => return Err(failed("the application did not answer".into())),
        };
        for (r, a) in batch.iter().zip(got) {
            answers.insert((r.topic.clone(), r.partition, r.offset), a);
        }
    }
    Ok(answers)
}

/// The DLQ reasons of a record whose output its destination refused, one per destination.
fn rejected() -> Vec<&'static str> {
    (crate::sink::REFUSERS.iter()).map(|r| r.reason).collect()
}
/// The DLQ reason of a record whose output's topic kept refusing it.
const ROUTE_REFUSED: &str = crate::transform::Reason::RouteRefused.as_str();
/// The DLQ reason of a record the windowed stage cannot place (an event time too far ahead of
/// the clock among them).
const DEDUP_INPUT: &str = crate::transform::Reason::DedupInput.as_str();

type Id = (String, i32, i64);

/// What the replay says each judged input should have become.
#[derive(Default)]
pub struct Expectations {
    outputs: HashMap<Lineage, Expected>,
    dlq: HashSet<Id>,
    /// Beyond the group's committed offsets, or not replayable: not judged.
    pending: HashSet<Id>,
    /// Judged inputs that become nothing.
    dropped: usize,
}

/// What the history holds, by input.
#[derive(Default)]
struct Seen {
    outputs: HashMap<Lineage, usize>,
    output_sources: HashSet<Id>,
    dlq: HashMap<Id, usize>,
}

/// Checks a history against a replay; without one (a call-out not replayed), by lineage
/// alone: every judged input has outputs (indices 0, 1, … without a gap) or a DLQ record, and
/// nothing is there twice.
pub fn analyze(
    history: &History,
    replay: &mut Replay,
    on_error: OnError,
    default_output: &str,
    max_message_bytes: usize,
) -> Report {
    let mut parts = analyze_parts(history, replay, on_error, default_output, max_message_bytes);
    for l in std::mem::take(&mut parts.missing) {
        parts.report.lost += 1;
        parts.report.note(format!("output {} is missing", show(&l)));
    }
    parts.report
}

/// What [`analyze`] found before it counts the missing outputs lost: a table's rows
/// ([`table::check`]) may have been overwritten instead.
pub struct Parts<'h> {
    /// The report so far.
    pub report: Report,
    /// The history judged.
    history: &'h History,
    /// What the replay expects.
    expected: Expectations,
    /// Expected outputs (in range, judged) with nothing of their lineage.
    missing: Vec<Lineage>,
}

/// [`analyze`], the missing outputs left to count.
pub fn analyze_parts<'h>(
    history: &'h History,
    replay: &mut Replay,
    on_error: OnError,
    default_output: &str,
    max_message_bytes: usize,
) -> Parts<'h> {
    let mut r = Report {
        replayed: replay.replays(),
        inputs: history.inputs.len(),
        aborted: history.aborted,
        partitions: history.partitions.clone(),
        ..Report::default()
    };
    let rejected = refused_inputs(history, &mut r);
    let expected = expect(
        history,
        replay,
        &rejected,
        on_error,
        default_output,
        max_message_bytes,
    );
    r.pending = expected.pending.len();
    r.dropped = expected.dropped;
    r.replayed_before_range = history.earlier.len();
    for (topic, partition, low) in &history.truncated {
        r.caveats.push(format!(
            "{topic}[{partition}] starts at offset {low} (retention deleted what came before): \
             keys seen there are unknown to the replay, so a later record of one may look lost \
             and its output unexpected"
        ));
    }
    r.expected_outputs = expected.outputs.len();
    r.expected_dlq = expected.dlq.len();
    let mut seen = Seen::default();
    let missing = check_outputs(&mut r, history, &expected, &mut seen);
    check_dlq(&mut r, history, &expected, &mut seen);
    if !r.replayed {
        account_by_lineage(&mut r, history, &expected.pending, &seen.outputs, &seen.dlq);
    }
    if !history.rows {
        check_order(&mut r, history);
    }
    r.group_reached_end = history.committed.as_ref().map(|c| {
        history
            .range
            .iter()
            .all(|(tp, &(_, end))| c.get(tp).is_some_and(|&next| next >= end))
    });
    for p in &history.partitions {
        if p.hanging() {
            r.hanging_partitions += 1;
            r.note(format!(
                "{}[{}]: last stable offset stuck at {} below high watermark {} (hanging transaction)",
                p.topic, p.partition, p.last_stable_offset_at_end, p.high_watermark_at_end
            ));
        }
    }
    Parts {
        report: r,
        history,
        expected,
        missing,
    }
}

/// The inputs whose DLQ copies stand in for their outputs, as the pipeline decided: the
/// cluster refused their outputs (counted in `r`), or the stage held their event time to the
/// pipeline's clock then (`dedup_input`, its message saying so), which the replay's is past
/// now.
fn refused_inputs(history: &History, r: &mut Report) -> HashSet<Id> {
    let refused = |reasons: &[&str]| -> HashSet<Id> {
        history
            .dlq
            .iter()
            .filter(|d| {
                let reason = d.header(headers::ERROR_REASON);
                reasons.iter().any(|r| reason == Some(r.as_bytes()))
            })
            .filter_map(|d| d.header(LINEAGE).and_then(headers::parse_lineage))
            .map(|l| (l.0, l.1, l.2))
            .collect()
    };
    let mut rejected = refused(&rejected());
    r.rejected_by_broker = rejected.len();
    let route_refused = refused(&[ROUTE_REFUSED]);
    r.route_refused = route_refused.len();
    rejected.extend(route_refused);
    // Held to the pipeline's clock, which the replay's is past now: only those.
    let ahead = (history.dlq.iter())
        .filter(|d| d.header(headers::ERROR_REASON) == Some(DEDUP_INPUT.as_bytes()))
        .filter(|d| {
            d.header(headers::ERROR_MESSAGE).is_some_and(|m| {
                String::from_utf8_lossy(m).contains(crate::transform::dedup::AHEAD_OF_CLOCK)
            })
        })
        .filter_map(|d| d.header(LINEAGE).and_then(headers::parse_lineage))
        .map(|l| (l.0, l.1, l.2));
    rejected.extend(ahead);
    rejected
}

/// The replay of every judged input: the outputs and DLQ records it should have.
fn expect(
    history: &History,
    replay: &mut Replay,
    rejected: &HashSet<Id>,
    on_error: OnError,
    default_output: &str,
    max_message_bytes: usize,
) -> Expectations {
    let mut e = Expectations::default();
    let judged = |t: &str, p: i32, o: i64| match &history.committed {
        Some(c) => c.get(&(t.to_string(), p)).is_some_and(|&next| o < next),
        None => true,
    };
    if replay.replays() {
        // What came before the range, for the state it leaves (whatever it became).
        for input in &history.earlier {
            let input = input.as_input();
            let outs = records::outputs(&input, replay.outputs(&input), true, max_message_bytes);
            let id = (input.topic.to_string(), input.partition, input.offset);
            replay.settle(fate(
                &outs,
                on_error == OnError::Dlq && rejected.contains(&id),
            ));
        }
    }
    for input in &history.inputs {
        let id = (input.topic.clone(), input.partition, input.offset);
        if !judged(&input.topic, input.partition, input.offset) {
            e.pending.insert(id);
            continue;
        }
        if !replay.replays() {
            continue;
        }
        let record = input.as_input();
        let outs = replay.outputs(&record);
        let outs = records::outputs(&record, outs, true, max_message_bytes);
        replay.settle(fate(
            &outs,
            on_error == OnError::Dlq && rejected.contains(&id),
        ));
        match outs {
            Ok(_) if on_error == OnError::Dlq && rejected.contains(&id) => {
                e.dlq.insert(id);
            }
            Ok(outs) => {
                e.dropped += usize::from(outs.is_empty());
                for (i, o) in outs.into_iter().enumerate() {
                    let expected = Expected {
                        topic: o.topic.unwrap_or_else(|| default_output.to_string()),
                        key: o.key.map(|k| k.into_owned()),
                        value: o.value.map(|v| v.into_owned()),
                    };
                    e.outputs.insert((id.0.clone(), id.1, id.2, i), expected);
                }
            }
            // The replay cannot say what the pipeline got: neither judged nor an anomaly.
            Err(Failure::Unavailable(_) | Failure::Held(_)) => {
                e.pending.insert(id);
            }
            Err(Failure::BadRecord(_)) if on_error == OnError::Dlq => {
                e.dlq.insert(id);
            }
            Err(Failure::BadRecord(_)) => {}
        }
    }
    e
}

/// What the pipeline's writer made of a record the replay made `outs` of: it went out,
/// unless it is a bad record or its output was `refused` (its dead-letter copy went instead).
fn fate<T>(outs: &Result<T, Failure>, refused: bool) -> Fate {
    if outs.is_ok() && !refused {
        Fate::Sent
    } else {
        Fate::Refused
    }
}

/// Whether an output's lineage names an input of the audited range.
fn in_range(history: &History, l: &Lineage) -> bool {
    history
        .range
        .get(&(l.0.clone(), l.1))
        .is_some_and(|&(start, end)| l.2 >= start && l.2 < end)
}

/// Every output of the range: once each, and as the replay has it (a table's rows: by the
/// database, later). The expected outputs that are not there.
fn check_outputs(
    r: &mut Report,
    history: &History,
    expected: &Expectations,
    seen: &mut Seen,
) -> Vec<Lineage> {
    for o in &history.outputs {
        let Some(l) = o.header(LINEAGE).and_then(headers::parse_lineage) else {
            r.without_lineage += 1;
            r.note(format!(
                "output {}[{}]@{} has no lineage header",
                o.topic, o.partition, o.offset
            ));
            continue;
        };
        if !in_range(history, &l) {
            continue;
        }
        r.outputs += 1;
        seen.output_sources.insert((l.0.clone(), l.1, l.2));
        let n = seen.outputs.entry(l.clone()).or_default();
        *n += 1;
        if *n > 1 {
            r.duplicated += 1;
            r.note(format!("output {} seen {} times", show(&l), n));
            continue;
        }
        if expected.pending.contains(&(l.0.clone(), l.1, l.2)) || !r.replayed || history.rows {
            // Processed after the committed offsets were read (not judged), or nothing to
            // compare with (a table's rows: the database compares them).
            continue;
        }
        match expected.outputs.get(&l) {
            None => {
                r.unexpected += 1;
                r.note(format!(
                    "output {} is not something the transform gives",
                    show(&l)
                ));
            }
            Some(e) if e.topic != o.topic || e.key != o.key || e.value != o.value => {
                r.unexpected += 1;
                r.note(format!(
                    "output {} differs from the replay: got {} in {}, expected {} in {}",
                    show(&l),
                    preview(o.value.as_deref()),
                    o.topic,
                    preview(e.value.as_deref()),
                    e.topic
                ));
            }
            Some(_) => {}
        }
    }
    let mut missing: Vec<Lineage> = (expected.outputs.keys())
        .filter(|l| !seen.outputs.contains_key(*l))
        .cloned()
        .collect();
    missing.sort();
    missing
}

/// Every DLQ record of the range: once each, never beside an output, only for inputs the
/// replay refuses; every expected one there.
fn check_dlq(r: &mut Report, history: &History, expected: &Expectations, seen: &mut Seen) {
    for d in &history.dlq {
        let Some(l) = d.header(LINEAGE).and_then(headers::parse_lineage) else {
            r.without_lineage += 1;
            r.note(format!(
                "DLQ record {}[{}]@{} has no lineage header",
                d.topic, d.partition, d.offset
            ));
            continue;
        };
        if !in_range(history, &l) {
            continue;
        }
        let id = (l.0.clone(), l.1, l.2);
        r.dlq += 1;
        let n = seen.dlq.entry(id.clone()).or_default();
        *n += 1;
        if *n > 1 {
            r.duplicated += 1;
            r.note(format!("DLQ record for {} seen {} times", show(&l), n));
            continue;
        }
        if seen.output_sources.contains(&id) {
            r.in_output_and_dlq += 1;
            r.note(format!("{} is in both the output and the DLQ", show(&l)));
        }
        if r.replayed && !expected.pending.contains(&id) && !expected.dlq.contains(&id) {
            r.unexpected += 1;
            r.note(format!(
                "DLQ record for {} but the transform succeeds on it",
                show(&l)
            ));
        }
    }
    for id in &expected.dlq {
        if !seen.dlq.contains_key(id) {
            r.lost += 1;
            r.note(format!(
                "DLQ record for {}/{}/{} is missing",
                id.0, id.1, id.2
            ));
        }
    }
}

/// On each output partition, one source partition's outputs keep its order.
fn check_order(r: &mut Report, history: &History) {
    let mut by_partition: BTreeMap<(&str, i32), Vec<&Rec>> = BTreeMap::new();
    for o in history.outputs.iter().chain(&history.dlq) {
        by_partition
            .entry((&o.topic, o.partition))
            .or_default()
            .push(o);
    }
    for ((topic, partition), mut recs) in by_partition {
        recs.sort_by_key(|o| o.offset);
        let mut last: HashMap<(String, i32), (i64, usize, i64)> = HashMap::new();
        let mut repeated: HashSet<Lineage> = HashSet::new();
        for o in recs {
            let Some(l) = o.header(LINEAGE).and_then(headers::parse_lineage) else {
                continue;
            };
            if !repeated.insert(l.clone()) {
                // A duplicate is counted as one already.
                continue;
            }
            let key = (l.0.clone(), l.1);
            if let Some(&(po, pi, at)) = last.get(&key)
                && (l.2, l.3) < (po, pi)
            {
                r.order_violations += 1;
                r.note(format!(
                    "{topic}[{partition}]: {} at offset {} comes after {}/{}/{po}/{pi} at {at}",
                    show(&l),
                    o.offset,
                    l.0,
                    l.1
                ));
            }
            last.insert(key, (l.2, l.3, o.offset));
        }
    }
}

/// Without a replay: each judged input in the range has outputs 0..n (none missing between)
/// or a DLQ record; an input with neither is lost (an application that answers a record with
/// no output at all needs `--replay-call` to be told from a loss).
fn account_by_lineage(
    r: &mut Report,
    history: &History,
    pending: &HashSet<(String, i32, i64)>,
    seen: &HashMap<Lineage, usize>,
    dlq_seen: &HashMap<(String, i32, i64), usize>,
) {
    let mut indices: HashMap<(&str, i32, i64), Vec<usize>> = HashMap::new();
    for l in seen.keys() {
        indices.entry((&l.0, l.1, l.2)).or_default().push(l.3);
    }
    for input in &history.inputs {
        let id = (input.topic.clone(), input.partition, input.offset);
        if pending.contains(&id) {
            continue;
        }
        let at = format!("{}/{}/{}", id.0, id.1, id.2);
        match indices.get_mut(&(input.topic.as_str(), input.partition, input.offset)) {
            Some(found) => {
                found.sort_unstable();
                if let Some(gap) = (0..found.len()).find(|i| found[*i] != *i) {
                    r.lost += 1;
                    r.note(format!("output {at}/{gap} is missing"));
                }
            }
            None if dlq_seen.contains_key(&id) => {}
            None => {
                r.lost += 1;
                r.note(format!("input {at} has no output and no DLQ record"));
            }
        }
    }
}

pub(crate) fn show(l: &Lineage) -> String {
    format!("{}/{}/{}/{}", l.0, l.1, l.2, l.3)
}

fn preview(v: Option<&[u8]>) -> String {
    match v {
        None => "null".into(),
        Some(b) => {
            let mut s = String::from_utf8_lossy(b).into_owned();
            crate::transform::truncate(&mut s, 60);
            s
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const LIMITS: Limits = Limits {
        max_output_bytes: 10_000,
        max_outputs: 10,
    };

    fn jq(code: &str) -> Box<dyn Transform> {
        crate::transform::new(
            &TransformSpec::Jq {
                program: code.into(),
                envelope: false,
            },
            LIMITS,
        )
        .unwrap()
    }

    fn input(p: i32, o: i64, value: &str) -> Rec {
        Rec {
            topic: "in".into(),
            partition: p,
            offset: o,
            value: Some(value.as_bytes().to_vec()),
            ..Rec::default()
        }
    }

    fn output(p: i32, o: i64, lineage: &str, value: &str) -> Rec {
        Rec {
            topic: "out".into(),
            partition: p,
            offset: o,
            value: Some(value.as_bytes().to_vec()),
            headers: vec![(LINEAGE.into(), Some(lineage.as_bytes().to_vec()))],
            ..Rec::default()
        }
    }

    /// Inputs 0..4 on partition 0 ({"n": i}), input 4 not JSON; a clean history of
    /// `.n * 10` with the poison record in the DLQ.
    fn clean() -> History {
        let mut h = History::default();
        for i in 0..4 {
            h.inputs.push(input(0, i, &format!(r#"{{"n":{i}}}"#)));
            h.outputs
                .push(output(0, i, &format!("in/0/{i}/0"), &format!("{}", i * 10)));
        }
        h.inputs.push(input(0, 4, "oops"));
        let mut d = output(0, 0, "in/0/4/0", "oops");
        d.topic = "out.dlq".into();
        h.dlq.push(d);
        h.range.insert(("in".into(), 0), (0, 5));
        h
    }

    fn check(h: &History) -> Report {
        analyze(
            h,
            &mut Replay::Transform(jq(".n * 10")),
            OnError::Dlq,
            "out",
            1_000_000,
        )
    }

    #[test]
    fn a_clean_history_passes() {
        let r = check(&clean());
        assert_eq!(r.anomalies(), 0, "{}", r.summary());
        assert_eq!(
            (
                r.inputs,
                r.expected_outputs,
                r.outputs,
                r.expected_dlq,
                r.dlq
            ),
            (5, 4, 4, 1, 1)
        );
        assert!(r.summary().contains("CLEAN"));
    }

    #[test]
    fn without_a_replay_the_lineage_accounts_for_every_input() {
        let by_lineage =
            |h: &History| analyze(h, &mut Replay::Lineage, OnError::Dlq, "out", 1_000_000);
        let r = by_lineage(&clean());
        assert_eq!(r.anomalies(), 0, "{}", r.summary());
        assert!(!r.replayed && r.summary().contains("not replayed"));
        // A different value is no anomaly without a replay to compare with...
        let mut h = clean();
        h.outputs[2].value = Some(b"21".to_vec());
        assert_eq!(by_lineage(&h).anomalies(), 0);
        // ...but an input with nothing, a gap in its outputs, or a copy twice is.
        let mut h = clean();
        h.outputs.remove(1);
        assert_eq!(by_lineage(&h).lost, 1);
        let mut h = clean();
        h.dlq.clear();
        assert_eq!(by_lineage(&h).lost, 1);
        let mut h = clean();
        h.outputs.push(output(0, 9, "in/0/2/2", "x"));
        let r = by_lineage(&h);
        assert_eq!(r.lost, 1, "{}", r.summary());
        assert!(
            r.examples[0].contains("in/0/2/1 is missing"),
            "{:?}",
            r.examples
        );
        let mut h = clean();
        h.outputs.push(output(0, 9, "in/0/2/0", "20"));
        assert_eq!(by_lineage(&h).duplicated, 1);
    }

    #[test]
    fn a_planted_duplicate_is_found() {
        let mut h = clean();
        h.outputs.push(output(0, 4, "in/0/2/0", "20"));
        let r = check(&h);
        assert_eq!(r.duplicated, 1);
        assert_eq!(r.anomalies(), 1, "{}", r.summary());
    }

    #[test]
    fn a_planted_loss_is_found() {
        let mut h = clean();
        h.outputs.remove(1);
        let r = check(&h);
        assert_eq!(r.lost, 1);
        assert_eq!(r.anomalies(), 1);
        let mut h = clean();
        h.dlq.clear();
        assert_eq!(check(&h).lost, 1);
    }

    #[test]
    fn a_reorder_is_found() {
        let mut h = clean();
        // Output partition 0 holds 1 then 0: the source order is broken.
        h.outputs[0].offset = 1;
        h.outputs[1].offset = 0;
        let r = check(&h);
        assert_eq!(r.order_violations, 1, "{}", r.summary());
    }

    #[test]
    fn a_wrong_transform_result_is_found() {
        let mut h = clean();
        h.outputs[2].value = Some(b"21".to_vec());
        let r = check(&h);
        assert_eq!(r.unexpected, 1);
        assert!(r.examples[0].contains("differs"), "{:?}", r.examples);
    }

    #[test]
    fn an_output_also_in_the_dlq_is_found() {
        let mut h = clean();
        let mut d = output(0, 1, "in/0/3/0", "x");
        d.topic = "out.dlq".into();
        h.dlq.push(d);
        let r = check(&h);
        assert_eq!(r.in_output_and_dlq, 1);
        // The transform works on it, so the DLQ copy is unexpected too.
        assert_eq!(r.unexpected, 1);
    }

    #[test]
    fn an_output_the_broker_rejected_is_expected_in_the_dlq() {
        let mut h = clean();
        // Input 3's output was rejected: its DLQ copy says so, and no output exists.
        h.outputs
            .retain(|o| o.header(LINEAGE) != Some(&b"in/0/3/0"[..]));
        // Its DLQ copy comes before input 4's.
        let mut d = output(0, 0, "in/0/3/0", "x");
        d.topic = "out.dlq".into();
        d.headers.push((
            headers::ERROR_REASON.into(),
            Some(crate::sink::kafka::BROKER.reason.into()),
        ));
        h.dlq[0].offset = 1;
        h.dlq.insert(0, d.clone());
        let r = check(&h);
        assert_eq!(r.anomalies(), 0, "{}", r.summary());
        assert_eq!((r.rejected_by_broker, r.expected_dlq), (1, 2));
        // So is one whose route kept refusing it.
        let mut routed = h.clone();
        routed.dlq[0].headers.pop();
        routed.dlq[0]
            .headers
            .push((headers::ERROR_REASON.into(), Some(ROUTE_REFUSED.into())));
        let r = check(&routed);
        assert_eq!(r.anomalies(), 0, "{}", r.summary());
        assert_eq!((r.route_refused, r.rejected_by_broker), (1, 0));
        // Another reason does not excuse a missing output.
        d.headers.pop();
        let mut h2 = clean();
        h2.outputs
            .retain(|o| o.header(LINEAGE) != Some(&b"in/0/3/0"[..]));
        h2.dlq[0].offset = 1;
        h2.dlq.insert(0, d);
        let r = check(&h2);
        assert_eq!((r.lost, r.unexpected), (1, 1), "{}", r.summary());
    }

    #[test]
    fn pending_inputs_are_not_judged() {
        let mut h = clean();
        h.outputs.truncate(2);
        h.dlq.clear();
        h.committed = Some(BTreeMap::from([(("in".into(), 0), 2)]));
        let r = check(&h);
        assert_eq!(r.anomalies(), 0, "{}", r.summary());
        assert_eq!(r.pending, 3);
        assert_eq!(r.group_reached_end, Some(false));
    }

    #[test]
    fn outputs_outside_the_range_are_ignored() {
        let mut h = clean();
        h.outputs.push(output(0, 9, "in/0/99/0", "990"));
        assert_eq!(check(&h).anomalies(), 0);
    }

    #[test]
    fn missing_lineage_and_hanging_transactions_are_anomalies() {
        let mut h = clean();
        h.outputs[0].headers.clear();
        h.partitions.push(PartitionState {
            topic: "out".into(),
            partition: 0,
            high_watermark: 10,
            last_stable_offset: 7,
            high_watermark_at_end: 10,
            last_stable_offset_at_end: 7,
        });
        let r = check(&h);
        assert_eq!(r.without_lineage, 1);
        assert_eq!(r.hanging_partitions, 1);
        // The output without lineage cannot be matched: its input counts as lost too.
        assert_eq!(r.lost, 1);
    }

    #[test]
    fn an_unstable_partition_that_moves_is_not_hanging() {
        let p = PartitionState {
            topic: "out".into(),
            partition: 0,
            high_watermark: 10,
            last_stable_offset: 7,
            high_watermark_at_end: 14,
            last_stable_offset_at_end: 12,
        };
        assert!(!p.hanging());
        assert_eq!(p.unstable(), 2);
    }

    /// The dedup by Kafka key per day, replayed: keys a b a b c at offsets 0..5 of one day,
    /// the range starting at 1 (offset 0 came before it).
    fn deduplicated() -> (History, Replay) {
        use std::time::Duration;

        use crate::state::window::{Size, Windows};
        let dedup = crate::config::DedupConfig {
            windows: Windows::new(Size::Days(1), jiff::tz::TimeZone::UTC, Duration::ZERO),
            key: None,
            time: None,
            late: crate::config::Late::Dlq,
            changelog: "cl".into(),
            retention: Duration::from_secs(86_400),
            state_dir: None,
            max_key: 100,
            max_keys: 100,
            max_ahead: 86_400_000,
            aggregate: None,
        };
        let transform = crate::config::TransformConfig {
            spec: TransformSpec::Passthrough,
            max_output_bytes: LIMITS.max_output_bytes,
            max_outputs_per_record: LIMITS.max_outputs,
        };
        let mut h = History::default();
        for (o, key) in ["a", "b", "a", "b", "c"].into_iter().enumerate() {
            let mut r = input(0, o as i64, key);
            r.key = Some(key.as_bytes().to_vec());
            r.timestamp = Some(1_700_000_000_000 + o as i64);
            if o == 0 {
                h.earlier.push(r);
            } else {
                h.inputs.push(r);
            }
        }
        for (at, o) in [(0, 1), (1, 4)] {
            h.outputs.push(passed(at, o));
        }
        h.range.insert(("in".into(), 0), (1, 5));
        let replay = Replay::Transform(dedup_replay(&dedup, &transform).unwrap());
        (h, replay)
    }

    /// Input `o` of [`deduplicated`] as the passthrough writes it, at output offset `at`.
    fn passed(at: i64, o: i64) -> Rec {
        let v = ["a", "b", "a", "b", "c"][o as usize];
        let mut r = output(0, at, &format!("in/0/{o}/0"), v);
        r.key = Some(v.as_bytes().to_vec());
        r
    }

    fn check_with(h: &History, mut replay: Replay) -> Report {
        analyze(h, &mut replay, OnError::Dlq, "out", 1_000_000)
    }

    /// The first b's output was refused by the broker, or the pipeline held its time too far
    /// ahead of its clock then (its dead-letter copy stands in): the replay keeps nothing of
    /// it, as the pipeline does, so the second b is the first out.
    #[test]
    fn a_dedup_replay_keeps_nothing_of_an_input_whose_output_was_refused() {
        let ahead = format!(
            "event time 9 ms is 2 s {}, more",
            crate::transform::dedup::AHEAD_OF_CLOCK
        );
        let cases = [
            (crate::sink::kafka::BROKER.reason, ""),
            (DEDUP_INPUT, ahead.as_str()),
            (DEDUP_INPUT, "no key"),
        ];
        for (reason, message) in cases {
            let (mut h, replay) = deduplicated();
            h.outputs = vec![passed(0, 3), passed(1, 4)];
            let mut d = output(0, 0, "in/0/1/0", "b");
            d.topic = "out.dlq".into();
            d.headers
                .push((headers::ERROR_REASON.into(), Some(reason.into())));
            d.headers
                .push((headers::ERROR_MESSAGE.into(), Some(message.into())));
            h.dlq.push(d);
            let r = check_with(&h, replay);
            if message == "no key" {
                // Another dedup_input: the replay's to judge, and it takes the record.
                assert!(r.anomalies() > 0, "{}", r.summary());
                continue;
            }
            assert_eq!(r.anomalies(), 0, "{reason}: {}", r.summary());
            assert_eq!((r.expected_outputs, r.expected_dlq), (2, 1), "{reason}");
        }
    }

    #[test]
    fn a_dedup_is_judged_by_what_came_first_even_before_the_range() {
        let (h, replay) = deduplicated();
        let r = check_with(&h, replay);
        assert_eq!(r.anomalies(), 0, "{}", r.summary());
        // a (seen before the range) and the second b: nothing of them anywhere.
        assert_eq!((r.dropped, r.replayed_before_range), (2, 1));
        assert_eq!(r.expected_outputs, 2);

        // The second of a key in the output: a duplicate the replay never gives.
        let (mut h, replay) = deduplicated();
        h.outputs.push(passed(2, 3));
        assert_eq!(check_with(&h, replay).unexpected, 1);

        // The later b instead of the first: the first is lost, the later one unexpected.
        let (mut h, replay) = deduplicated();
        h.outputs[0] = passed(0, 3);
        let r = check_with(&h, replay);
        assert_eq!((r.lost, r.unexpected), (1, 1), "{}", r.summary());

        // Without what came before the range, the a at offset 2 would look lost: when
        // retention took it, the report says so beside the anomaly.
        let (mut h, replay) = deduplicated();
        h.earlier.clear();
        h.truncated.push(("in".into(), 0, 1));
        let r = check_with(&h, replay);
        assert_eq!(r.lost, 1);
        assert_eq!(r.caveats.len(), 1);
        assert!(
            r.summary().contains("? in[0] starts at offset 1"),
            "{}",
            r.summary()
        );
    }
}
