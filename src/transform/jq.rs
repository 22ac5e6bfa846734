//! The jq transform, through the jaq crates (jaq-core 3).
//!
//! The program is compiled once. Each record's value is parsed as JSON and run through it; the
//! record's metadata is there as `$key`, `$topic`, `$partition`, `$offset`, `$timestamp` and
//! `$headers`. Each output becomes one record: its JSON text as the value (plain mode), or an
//! envelope `{"key", "value", "topic", "headers"}` that says everything about the record.
//!
//! A program of an enrichment's shape (field reads and assignments, `del`, arithmetic,
//! comparisons, `select`, objects and arrays built from fields, builtins called with
//! constants) also gets a [`direct`] form, run without jaq's interpreter; a record it cannot
//! decide, or that raises a jq error, is run by jaq as before.

mod direct;

use std::borrow::Cow;
use std::sync::atomic::{AtomicU32, Ordering};

use jaq_core::data::JustLut;
use jaq_core::load::{self, Arena, File, Loader};
use jaq_core::{Compiler, Ctx, Vars, unwrap_valr};
use jaq_json::{Map, Val};

use self::direct::{Direct, Stop};
use super::json::{parse_json, write_compact};
use super::{
    Failure, InputRecord, Limits, OutputHeaders, OutputRecord, Reason, Transform, TransformError,
    check_size, truncate,
};

/// Names of the variables a program sees, in the order their values are passed. `$window`
/// is the dedup's (the label of the record's window), `null` elsewhere.
const VARS: [&str; 7] = [
    "$key",
    "$topic",
    "$partition",
    "$offset",
    "$timestamp",
    "$headers",
    "$window",
];

/// A compiled jq program.
pub struct Jq {
    filter: jaq_core::Filter<JustLut<Val>>,
    /// The program without jaq's interpreter, when its shape allows (most enrichments).
    direct: Option<Direct>,
    /// Records in a row the direct program left to jaq undecided; past [`GIVE_UP_AFTER`]
    /// jaq runs them all (a program whose builtin yields several values on every record).
    unsure: AtomicU32,
    envelope: bool,
    limits: Limits,
    pp: jaq_json::write::Pp,
    /// Which of [`VARS`] the program names: the others are `null` rather than built for every
    /// record (the headers object alone is an allocation per header).
    uses: [bool; 7],
}

impl Jq {
    /// Compiles `code`; the error is jaq's message with a line and column.
    pub fn compile(code: &str, envelope: bool, limits: Limits) -> Result<Jq, String> {
        let filter = compile_filter(code, &VARS)?;
        let builtin = |text: &str| compile_filter(text, &[]).ok();
        Ok(Jq {
            filter,
            direct: Direct::compile(code, &builtin),
            unsure: AtomicU32::new(0),
            envelope,
            limits,
            pp: Default::default(),
            uses: VARS.map(|var| mentions(code, var)),
        })
    }

    /// Whether the program runs without jaq's interpreter (see [`direct`]).
    pub fn is_direct(&self) -> bool {
        self.direct.is_some()
    }

    /// The direct program's outputs for `value`; else the value back for jaq to run, or
    /// `None` when the direct program consumed it and left this record to jaq (the value is
    /// parsed again: passed on, not shared, the direct program's updates need not copy it).
    fn run_direct(&self, value: Val) -> Result<Vec<Val>, Option<Val>> {
        let Some(direct) = &self.direct else {
            return Err(Some(value));
        };
        let unsure = self.unsure.load(Ordering::Relaxed);
        if unsure >= GIVE_UP_AFTER {
            return Err(Some(value));
        }
        match direct.run(value) {
            Ok(outs) => {
                if unsure > 0 {
                    self.unsure.store(0, Ordering::Relaxed);
                }
                Ok(outs)
            }
            Err(Stop::Error) => Err(None),
            Err(Stop::Unsure) => {
                self.unsure.fetch_add(1, Ordering::Relaxed);
                Err(None)
            }
        }
    }

    /// `input`'s value as jaq's (a tombstone is `null` to the program).
    fn value(input: &InputRecord<'_>) -> Result<Val, TransformError> {
        match input.value {
            None => Ok(Val::Null),
            Some(bytes) => parse_json(bytes),
        }
    }

    /// `input`'s value for jaq: run directly if the program allows, else parsed.
    fn direct_or_value(
        &self,
        input: &InputRecord<'_>,
    ) -> Result<Result<Vec<Val>, Val>, TransformError> {
        Ok(match self.run_direct(Self::value(input)?) {
            Ok(outs) => Ok(outs),
            Err(Some(value)) => Err(value),
            Err(None) => Err(Self::value(input)?),
        })
    }

    /// Runs the program over one record.
    pub fn apply<'a>(
        &self,
        input: &InputRecord<'a>,
    ) -> Result<Vec<OutputRecord<'a>>, TransformError> {
        self.apply_in(input, None)
    }

    /// The JSON text of the program's first output for `input`, if it yields one (the
    /// dedup's key and time expressions).
    pub fn first_json(&self, input: &InputRecord<'_>) -> Result<Option<Vec<u8>>, TransformError> {
        let value = match self.direct_or_value(input)? {
            Ok(outs) => return Ok(outs.first().map(|v| self.to_json(v))),
            Err(value) => value,
        };
        let vars = Vars::new(variables(input, &self.uses, None));
        let ctx = Ctx::<JustLut<Val>>::new(&self.filter.lut, vars);
        let first = self.filter.id.run((ctx, value)).map(unwrap_valr).next();
        match first {
            None => Ok(None),
            Some(v) => {
                let v = v.map_err(|e| TransformError::new(Reason::JqError, e.to_string()))?;
                Ok(Some(self.to_json(&v)))
            }
        }
    }

    /// Runs the program over one record, `$window` set to `window`.
    pub fn apply_in<'a>(
        &self,
        input: &InputRecord<'a>,
        window: Option<&str>,
    ) -> Result<Vec<OutputRecord<'a>>, TransformError> {
        let value = match self.direct_or_value(input)? {
            Ok(outs) => return self.outputs(input, outs.into_iter().map(Ok)),
            Err(value) => value,
        };
        let vars = Vars::new(variables(input, &self.uses, window));
        let ctx = Ctx::<JustLut<Val>>::new(&self.filter.lut, vars);
        let results = self.filter.id.run((ctx, value)).map(unwrap_valr);
        self.outputs(input, results.map(|r| r.map_err(|e| e.to_string())))
    }

    /// The records of a run's values, checked against the limits.
    fn outputs<'a>(
        &self,
        input: &InputRecord<'a>,
        results: impl Iterator<Item = Result<Val, String>>,
    ) -> Result<Vec<OutputRecord<'a>>, TransformError> {
        let mut outputs = Vec::new();
        for result in results {
            if outputs.len() == self.limits.max_outputs {
                return Err(TransformError::new(
                    Reason::TooManyOutputs,
                    format!(
                        "more than --max-outputs-per-record {} outputs",
                        self.limits.max_outputs
                    ),
                ));
            }
            let v = result.map_err(|e| TransformError::new(Reason::JqError, e))?;
            let out = if self.envelope {
                self.open_envelope(input, v)?
            } else {
                self.plain(input, v)
            };
            let size =
                out.key.as_ref().map_or(0, |k| k.len()) + out.value.as_ref().map_or(0, |v| v.len());
            check_size(size, &self.limits)?;
            outputs.push(out);
        }
        Ok(outputs)
    }

    fn to_json(&self, v: &Val) -> Vec<u8> {
        let mut buf = Vec::with_capacity(128);
        write_compact(&mut buf, &self.pp, v);
        buf
    }

    fn plain<'a>(&self, input: &InputRecord<'a>, v: Val) -> OutputRecord<'a> {
        OutputRecord {
            topic: None,
            partition: None,
            key: input.key.map(Cow::Borrowed),
            value: Some(Cow::Owned(self.to_json(&v))),
            headers: OutputHeaders::Input,
        }
    }

    fn open_envelope<'a>(
        &self,
        input: &InputRecord<'a>,
        v: Val,
    ) -> Result<OutputRecord<'a>, TransformError> {
        let bad = |m: String| TransformError::new(Reason::BadEnvelope, m);
        let Val::Obj(fields) = v else {
            return Err(bad(format!(
                "--envelope output must be an object, got {}",
                self.show(&v)
            )));
        };
        let mut out = OutputRecord {
            topic: None,
            partition: None,
            key: input.key.map(Cow::Borrowed),
            value: None,
            headers: OutputHeaders::Input,
        };
        let mut has_value = false;
        for (name, field) in fields.iter() {
            match str_bytes(name) {
                Some(b"key") => {
                    out.key = match field {
                        Val::Null => None,
                        f => Some(Cow::Owned(
                            str_bytes(f)
                                .ok_or_else(|| bad("envelope key must be a string or null".into()))?
                                .to_vec(),
                        )),
                    }
                }
                Some(b"value") => {
                    has_value = true;
                    out.value = match field {
                        Val::Null => None,
                        f => Some(Cow::Owned(self.to_json(f))),
                    }
                }
                Some(b"topic") => {
                    out.topic = match field {
                        Val::Null => None,
                        f => Some(topic_name(f).ok_or_else(|| {
                            bad(format!(
                                "envelope topic {} is not a valid topic name",
                                self.show(f)
                            ))
                        })?),
                    }
                }
                Some(b"headers") => {
                    out.headers = OutputHeaders::Set(headers(field).ok_or_else(|| {
                        bad("envelope headers must be an object of strings (or nulls)".into())
                    })?)
                }
                _ => {
                    return Err(bad(format!(
                        "unknown envelope field {} (allowed: key, value, topic, headers)",
                        self.show(name)
                    )));
                }
            }
        }
        if !has_value {
            return Err(bad(
                "envelope has no value field (use null for a tombstone)".into(),
            ));
        }
        Ok(out)
    }

    fn show(&self, v: &Val) -> String {
        let mut s = String::from_utf8_lossy(&self.to_json(v)).into_owned();
        truncate(&mut s, 80);
        s
    }
}

impl Transform for Jq {
    fn apply<'a>(&mut self, input: &InputRecord<'a>) -> Result<Vec<OutputRecord<'a>>, Failure> {
        Ok(Jq::apply(self, input)?)
    }
}

/// Records in a row the direct program may leave undecided before jaq runs them all.
const GIVE_UP_AFTER: u32 = 64;

/// `code` compiled with jaq's core, standard and JSON definitions, `vars` its global variables.
fn compile_filter(code: &str, vars: &[&str]) -> Result<jaq_core::Filter<JustLut<Val>>, String> {
    let defs = jaq_core::defs()
        .chain(jaq_std::defs())
        .chain(jaq_json::defs());
    let funs = jaq_core::funs()
        .chain(jaq_std::funs())
        .chain(jaq_json::funs());
    let arena = Arena::default();
    let modules = Loader::new(defs)
        .load(&arena, File { code, path: () })
        .map_err(|errs| describe_load_errors(code, errs))?;
    Compiler::default()
        .with_funs(funs)
        .with_global_vars(vars.iter().copied())
        .compile(modules)
        .map_err(|errs| {
            let msgs: Vec<String> = errs
                .into_iter()
                .flat_map(|(_, es)| es)
                .map(|(name, undef)| {
                    format!(
                        "undefined {} `{name}` at {}",
                        undef.as_str(),
                        at(code, name)
                    )
                })
                .collect();
            msgs.join("; ")
        })
}

/// The values of [`VARS`] for one record; `null` for those the program does not name.
fn variables(input: &InputRecord<'_>, uses: &[bool; 7], window: Option<&str>) -> [Val; 7] {
    let bytes_or_null = |b: Option<&[u8]>| b.map_or(Val::Null, |b| Val::utf8_str(b.to_vec()));
    let headers = || {
        let mut headers = Map::default();
        for (name, value) in &input.headers {
            headers.insert(Val::utf8_str(name.to_vec()), bytes_or_null(*value));
        }
        Val::obj(headers)
    };
    let build = |i: usize| match i {
        0 => bytes_or_null(input.key),
        1 => Val::utf8_str(input.topic.as_bytes().to_vec()),
        2 => Val::from(input.partition as isize),
        3 => Val::from(input.offset as isize),
        4 => input.timestamp.map_or(Val::Null, |t| Val::from(t as isize)),
        5 => headers(),
        _ => window.map_or(Val::Null, |w| Val::utf8_str(w.as_bytes().to_vec())),
    };
    std::array::from_fn(|i| if uses[i] { build(i) } else { Val::Null })
}

/// Whether `code` names the variable `var` (`$key`, not `$keys`). jq variables are lexical: a
/// program can reach a global only by naming it, and exactly's loader reads no other files.
/// A comment or string that happens to name it only costs building it.
fn mentions(code: &str, var: &str) -> bool {
    code.match_indices(var).any(|(at, _)| {
        !code[at + var.len()..].starts_with(|c: char| c.is_ascii_alphanumeric() || c == '_')
    })
}

fn str_bytes(v: &Val) -> Option<&[u8]> {
    match v {
        Val::TStr(b) | Val::BStr(b) => Some(b.as_ref()),
        _ => None,
    }
}

fn topic_name(v: &Val) -> Option<String> {
    let b = str_bytes(v)?;
    crate::kafka::valid_topic_name(b).then(|| String::from_utf8_lossy(b).into_owned())
}

fn headers(v: &Val) -> Option<Vec<(String, Option<Vec<u8>>)>> {
    let Val::Obj(map) = v else { return None };
    map.iter()
        .map(|(k, v)| {
            let name = String::from_utf8(str_bytes(k)?.to_vec()).ok()?;
            let value = match v {
                Val::Null => None,
                v => Some(str_bytes(v)?.to_vec()),
            };
            Some((name, value))
        })
        .collect()
}

/// "line L, column C" of `part` inside `code`.
fn at(code: &str, part: &str) -> String {
    let start = load::span(code, part).start;
    let before = &code[..start];
    let line = before.matches('\n').count() + 1;
    let column = before.rsplit('\n').next().map_or(0, |l| l.chars().count()) + 1;
    format!("line {line}, column {column}")
}

fn describe_load_errors(code: &str, errs: load::Errors<&str, ()>) -> String {
    let mut msgs = Vec::new();
    for (_, err) in errs {
        match err {
            load::Error::Io(es) => msgs.extend(es.into_iter().map(|(p, e)| format!("{p}: {e}"))),
            load::Error::Lex(es) => msgs.extend(
                es.into_iter()
                    .map(|(exp, part)| format!("expected {} at {}", exp.as_str(), at(code, part))),
            ),
            load::Error::Parse(es) => msgs.extend(es.into_iter().map(|(exp, part)| {
                let found = if part.is_empty() {
                    "end of program".to_string()
                } else {
                    format!("`{part}`")
                };
                format!(
                    "expected {}, found {found} at {}",
                    exp.as_str(),
                    at(code, part)
                )
            })),
        }
    }
    msgs.join("; ")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::transform::tests::record;

    const LIMITS: Limits = Limits {
        max_output_bytes: 1000,
        max_outputs: 5,
    };

    fn jq(code: &str) -> Jq {
        Jq::compile(code, false, LIMITS).unwrap()
    }

    fn values(out: &[OutputRecord<'_>]) -> Vec<String> {
        out.iter()
            .map(|o| String::from_utf8(o.value.as_deref().unwrap().to_vec()).unwrap())
            .collect()
    }

    #[test]
    fn maps_a_value() {
        let out = jq("{id: .id, doubled: (.n * 2)}")
            .apply(&record(Some(br#"{"id":"a","n":21,"x":true}"#)))
            .unwrap();
        assert_eq!(values(&out), [r#"{"id":"a","doubled":42}"#]);
        assert_eq!(out[0].headers, OutputHeaders::Input);
        assert_eq!(out[0].topic, None);
        assert_eq!(out[0].key.as_deref(), Some(&b"k1"[..]));
    }

    #[test]
    fn fan_out_and_filter() {
        let j = jq(".items[]");
        let out = j.apply(&record(Some(br#"{"items":[1,2,3]}"#))).unwrap();
        assert_eq!(values(&out), ["1", "2", "3"]);
        let out = jq("select(.keep)")
            .apply(&record(Some(br#"{"keep":false}"#)))
            .unwrap();
        assert!(out.is_empty());
    }

    #[test]
    fn metadata_variables() {
        let out = jq("[$key, $topic, $partition, $offset, $timestamp, $headers]")
            .apply(&record(Some(b"null")))
            .unwrap();
        assert_eq!(
            values(&out),
            [r#"["k1","in",2,41,1700000000000,{"h":"v","empty":null}]"#]
        );
    }

    #[test]
    fn each_variable_is_there_alone_and_bound_names_do_not_confuse() {
        // Each variable on its own: the one the program names is built.
        let cases = [
            ("$key", r#""k1""#),
            ("$topic", r#""in""#),
            ("$partition", "2"),
            ("$offset", "41"),
            ("$timestamp", "1700000000000"),
            ("$headers", r#"{"h":"v","empty":null}"#),
            // In a function body, in a string interpolation.
            (r#"def t: $topic; "\(t)-\($partition)""#, r#""in-2""#),
        ];
        for (code, want) in cases {
            let out = jq(code).apply(&record(Some(b"null"))).unwrap();
            assert_eq!(values(&out), [want], "{code}");
        }
        // A variable of the program's own whose name starts like one of exactly's.
        let out = jq(". as $keys | [$keys, $key]")
            .apply(&record(Some(b"1")))
            .unwrap();
        assert_eq!(values(&out), [r#"[1,"k1"]"#]);
        assert!(mentions("$key", "$key") && mentions("[$key]", "$key"));
        assert!(!mentions("$keys", "$key") && !mentions("$key_2", "$key"));
    }

    #[test]
    fn std_library_is_there() {
        let out = jq(r#".ts / 1000 | todate"#)
            .apply(&record(Some(br#"{"ts":0}"#)))
            .unwrap();
        assert_eq!(values(&out), [r#""1970-01-01T00:00:00Z""#]);
        let out = jq("map(. + 1)").apply(&record(Some(b"[1,2]"))).unwrap();
        assert_eq!(values(&out), ["[2,3]"]);
    }

    #[test]
    fn not_json_is_an_error() {
        for bad in [&b"not json"[..], b"{\"a\":", b"\xff\xfe", b"{} {}"] {
            let e = jq(".").apply(&record(Some(bad))).unwrap_err();
            assert_eq!(e.reason, Reason::NotJson, "{bad:?}");
        }
    }

    #[test]
    fn tombstone_is_null() {
        let out = jq("{was: .}").apply(&record(None)).unwrap();
        assert_eq!(values(&out), [r#"{"was":null}"#]);
    }

    #[test]
    fn runtime_error_is_reported() {
        let e = jq(".n + 1")
            .apply(&record(Some(br#"{"n":"x"}"#)))
            .unwrap_err();
        assert_eq!(e.reason, Reason::JqError);
        assert!(e.message.contains("cannot"), "{}", e.message);
        let e = jq(r#"error("custom")"#)
            .apply(&record(Some(b"1")))
            .unwrap_err();
        assert_eq!(e.reason, Reason::JqError);
        assert!(e.message.contains("custom"), "{}", e.message);
    }

    #[test]
    fn limits() {
        let e = jq("range(10)").apply(&record(Some(b"1"))).unwrap_err();
        assert_eq!(e.reason, Reason::TooManyOutputs);
        // An endless generator stops at the limit instead of running forever.
        let e = jq("repeat(1)").apply(&record(Some(b"1"))).unwrap_err();
        assert_eq!(e.reason, Reason::TooManyOutputs);
        let e = jq(r#"[range(600)] | tostring"#)
            .apply(&record(Some(b"1")))
            .unwrap_err();
        assert_eq!(e.reason, Reason::OutputTooLarge);
    }

    #[test]
    fn deep_nesting_is_refused_not_a_crash() {
        let deep = format!("{}{}", "[".repeat(100_000), "]".repeat(100_000));
        let e = jq(".").apply(&record(Some(deep.as_bytes()))).unwrap_err();
        assert_eq!(e.reason, Reason::NotJson);
        // Brackets inside strings do not count.
        let s = format!(r#"{{"s":"{}"}}"#, "[".repeat(2000));
        assert!(jq("1").apply(&record(Some(s.as_bytes()))).is_ok());
    }

    #[test]
    fn compile_errors_say_where() {
        let e = Jq::compile(".a | ", false, LIMITS).err().unwrap();
        assert!(e.contains("expected"), "{e}");
        let e = Jq::compile("{a: 1", false, LIMITS).err().unwrap();
        assert!(e.contains("line 1"), "{e}");
        let e = Jq::compile(".a |\n nosuchfn(1)", false, LIMITS)
            .err()
            .unwrap();
        assert!(
            e.contains("undefined filter `nosuchfn`") && e.contains("line 2"),
            "{e}"
        );
        let e = Jq::compile("$nope", false, LIMITS).err().unwrap();
        assert!(e.contains("undefined variable"), "{e}");
    }

    #[test]
    fn envelope_routes_rekeys_and_sets_headers() {
        let j = Jq::compile(
            r#"{key: .id, value: {v: .n}, topic: "other", headers: {src: $topic}}, {value: null}"#,
            true,
            LIMITS,
        )
        .unwrap();
        let out = j.apply(&record(Some(br#"{"id":"a","n":1}"#))).unwrap();
        assert_eq!(out.len(), 2);
        assert_eq!(out[0].key.as_deref(), Some(&b"a"[..]));
        assert_eq!(out[0].value.as_deref(), Some(&br#"{"v":1}"#[..]));
        assert_eq!(out[0].topic.as_deref(), Some("other"));
        assert_eq!(
            out[0].headers,
            OutputHeaders::Set(vec![("src".into(), Some(b"in".to_vec()))])
        );
        // Missing key keeps the input's; null value is a tombstone; headers default to input.
        assert_eq!(out[1].key.as_deref(), Some(&b"k1"[..]));
        assert_eq!(out[1].value, None);
        assert_eq!(out[1].headers, OutputHeaders::Input);
    }

    #[test]
    fn bad_envelopes() {
        for code in [
            "1",
            r#"{key: 1, value: 2}"#,
            r#"{value: 1, topic: "bad topic"}"#,
            r#"{value: 1, headers: {a: 1}}"#,
            r#"{value: 1, extra: 1}"#,
            r#"{key: "k"}"#,
        ] {
            let j = Jq::compile(code, true, LIMITS).unwrap();
            let e = j.apply(&record(Some(b"{}"))).unwrap_err();
            assert_eq!(e.reason, Reason::BadEnvelope, "{code}: {}", e.message);
        }
    }
}
