//! The call-out: the application next to exactly decides what each record becomes.
//!
//! exactly POSTs batches of input records to `--call-url` and turns each answer into outputs
//! inside the open transaction, like any transform's. The batching, the calls in flight and
//! their order live with the loop (`pipeline::intake`, which stages records for the
//! application); this file is the wire format, the [`Application`] seam and its HTTP client
//! ([`Http`]), and [`outputs`], the pure function that turns a record and its answer into the
//! record's outputs.
//!
//! # Request
//! `{"records": [R, …]}`, one `R` per input record, in the order they were read:
//! `{"lineage", "topic", "partition", "offset", "timestamp", "key", "key_encoding", "headers",
//! "value", "value_encoding"}`. `lineage` is `topic/partition/offset`: the record's identity,
//! and the idempotency key for any effect the application has outside Kafka (a record comes
//! again after an abort or a restart). Bytes are binary-safe: `key` is a string with
//! `key_encoding` `utf8` or `base64` (both null without a key); `value` is the value's JSON when
//! it parses (`value_encoding: "json"`), else its bytes in base64 (`"base64"`), or null for a
//! tombstone (`"null"`); each header is `{"name", "value", "encoding"}` (`value` null for a
//! header without one), the encoding (`utf8`, or `base64` when name or value is not UTF-8)
//! applying to both name and value.
//!
//! # Response
//! `{"results": [A, …]}`, exactly one `A` per record, in order. `A` is `{"outputs": [O, …]}`
//! (zero or more; `{}` is none) or `{"reject": "message"}` (the record goes to the dead-letter
//! topic with reason `app_rejected`). `A` may echo `lineage`, which must then match. `O` is the
//! `--envelope` shape: `value` (any JSON, written as its JSON text; null writes a tombstone) or
//! `value_base64` (raw bytes); optional `key` (string or null; absent keeps the input's) or
//! `key_base64`; `topic` (absent or null: `--output-topic`); `headers` (absent keeps the
//! input's: an object of UTF-8 strings or nulls, or the request's list of `{"name", "value",
//! "encoding"}`, for binary values). `docs/call.schema.json` is the JSON Schema of both.
//!
//! Anything else — no connection, a timeout, a status other than 2xx, a body that does not
//! parse or has the wrong count — means the application is **unavailable**: the loop aborts,
//! rewinds and backs off; nothing goes to the dead-letter topic.

use std::borrow::Cow;
use std::collections::BTreeMap;
use std::sync::mpsc;
use std::time::{Duration, Instant};

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as BASE64;
use serde::{Deserialize, Deserializer};
use serde_json::value::RawValue;

use super::{
    Failure, InputRecord, Limits, OutputHeaders, OutputRecord, Reason, TransformError, check_size,
    truncate,
};
use crate::config::CallSpec;
use crate::error::Error;

/// The application, as the loop calls it: one batch of records a call, answered later.
pub trait Application: Send {
    /// Sends `records` as one batch; the answer arrives on the returned call.
    fn submit(&self, records: &[InputRecord<'_>], timeout: Duration) -> InFlight;
}

/// The application behind `--call-url`: an HTTP client whose calls run on a tokio runtime.
pub struct Http {
    client: reqwest::Client,
    url: reqwest::Url,
    runtime: tokio::runtime::Handle,
}

/// What the application said about one record.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Answer {
    /// Zero or more outputs.
    Outputs(Vec<Output>),
    /// The record is refused: the dead-letter topic, with this message.
    Rejected(String),
}

/// One output the application asked for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Output {
    /// `None`: `--output-topic`.
    pub topic: Option<String>,
    /// `None`: the input's key; `Some(None)`: no key.
    pub key: Option<Option<Vec<u8>>>,
    /// `None`: a tombstone.
    pub value: Option<Vec<u8>>,
    /// `None`: the input's headers.
    pub headers: Option<Headers>,
}

/// Headers an answer sets: names, and values (`None`: a header without a value).
pub type Headers = Vec<(String, Option<Vec<u8>>)>;

/// Why a call gave no usable answer: the application is unavailable.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum CallError {
    /// No connection, or it broke.
    #[error("application unreachable: {0}")]
    Unreachable(String),
    /// No answer within `--call-timeout`.
    #[error("no answer within {0:?}")]
    Timeout(Duration),
    /// A status other than 2xx.
    #[error("application answered HTTP {0}: {1}")]
    Status(u16, String),
    /// The body is not a valid answer (or not one per record).
    #[error("malformed answer: {0}")]
    Malformed(String),
}

impl CallError {
    /// The `outcome` label of `exactly_calls_total`.
    pub fn outcome(&self) -> &'static str {
        match self {
            CallError::Unreachable(_) => "unreachable",
            CallError::Timeout(_) => "timeout",
            CallError::Status(..) => "http_error",
            CallError::Malformed(_) => "malformed",
        }
    }
}

/// Every `outcome` label of `exactly_calls_total`, so each starts at 0.
pub const OUTCOMES: [&str; 5] = ["ok", "unreachable", "timeout", "http_error", "malformed"];

/// A call on its way: the answer arrives on a channel, decoded off the loop thread.
pub struct InFlight {
    rx: mpsc::Receiver<Called>,
    /// When it was sent.
    pub sent: Instant,
}

/// Where a call's answer is sent from (an application's task, or a test).
pub type Answering = mpsc::Sender<Called>;

/// A finished call.
#[derive(Debug)]
pub struct Called {
    /// One answer per record, or why there is none.
    pub answers: Result<Vec<Answer>, CallError>,
    /// From sending to the decoded answer.
    pub took: Duration,
}

impl InFlight {
    /// A call sent now, and where its answer is to be sent.
    pub fn channel() -> (Answering, InFlight) {
        let (tx, rx) = mpsc::channel();
        let sent = Instant::now();
        (tx, InFlight { rx, sent })
    }

    /// The finished call, if it has finished.
    pub fn try_take(&self) -> Option<Called> {
        match self.rx.try_recv() {
            Ok(c) => Some(c),
            Err(mpsc::TryRecvError::Empty) => None,
            Err(mpsc::TryRecvError::Disconnected) => Some(self.lost()),
        }
    }

    /// Waits up to `wait` for the call to finish.
    pub fn wait(&self, wait: Duration) -> Option<Called> {
        match self.rx.recv_timeout(wait) {
            Ok(c) => Some(c),
            Err(mpsc::RecvTimeoutError::Timeout) => None,
            Err(mpsc::RecvTimeoutError::Disconnected) => Some(self.lost()),
        }
    }

    /// The task ended without answering (the runtime is shutting down).
    fn lost(&self) -> Called {
        Called {
            answers: Err(CallError::Unreachable("the call was cancelled".into())),
            took: self.sent.elapsed(),
        }
    }
}

impl Http {
    /// A client for `spec`; calls run on `runtime`.
    pub fn new(spec: &CallSpec, runtime: tokio::runtime::Handle) -> Result<Http, Error> {
        let url = reqwest::Url::parse(&spec.url)
            .map_err(|e| Error::Config(format!("--call-url: {e}")))?;
        let client = reqwest::Client::builder()
            .timeout(spec.timeout)
            .connect_timeout(spec.timeout)
            // The application is next to exactly: never through a proxy from the environment.
            .no_proxy()
            .pool_max_idle_per_host(spec.in_flight)
            .build()
            .map_err(|e| Error::Config(format!("--call-url: {e}")))?;
        Ok(Http {
            client,
            url,
            runtime,
        })
    }
}

impl Application for Http {
    /// POSTs `records` as one batch; the answer is decoded on the runtime.
    fn submit(&self, records: &[InputRecord<'_>], timeout: Duration) -> InFlight {
        let (body, lineages) = request(records);
        let (tx, call) = InFlight::channel();
        let sent = call.sent;
        let post = self
            .client
            .post(self.url.clone())
            .header(reqwest::header::CONTENT_TYPE, "application/json");
        self.runtime.spawn(async move {
            let answers = match post.body(body).send().await {
                Ok(resp) => answer(resp, &lineages).await,
                Err(e) if e.is_timeout() => Err(CallError::Timeout(timeout)),
                Err(e) => Err(CallError::Unreachable(chain(&e))),
            };
            let _ = tx.send(Called {
                answers,
                took: sent.elapsed(),
            });
        });
        call
    }
}

/// What `input` becomes by the application's `answer`: its outputs (an absent key or headers
/// keep the input's), or a bad record (refused by the application, too many outputs, one too
/// large).
pub fn outputs<'a>(
    input: &InputRecord<'a>,
    answer: Answer,
    limits: &Limits,
) -> Result<Vec<OutputRecord<'a>>, Failure> {
    let outputs = match answer {
        Answer::Rejected(message) => {
            return Err(TransformError::new(Reason::AppRejected, message).into());
        }
        Answer::Outputs(o) => o,
    };
    if outputs.len() > limits.max_outputs {
        return Err(TransformError::new(
            Reason::TooManyOutputs,
            format!(
                "the application answered {} outputs, more than --max-outputs-per-record {}",
                outputs.len(),
                limits.max_outputs
            ),
        )
        .into());
    }
    let mut out = Vec::with_capacity(outputs.len());
    for o in outputs {
        let key = match o.key {
            None => input.key.map(Cow::Borrowed),
            Some(k) => k.map(Cow::Owned),
        };
        let size = key.as_ref().map_or(0, |k| k.len()) + o.value.as_ref().map_or(0, Vec::len);
        check_size(size, limits)?;
        out.push(OutputRecord {
            topic: o.topic,
            partition: None,
            key,
            value: o.value.map(Cow::Owned),
            headers: o.headers.map_or(OutputHeaders::Input, OutputHeaders::Set),
        });
    }
    Ok(out)
}

/// The request body for `records`, and each record's lineage (`topic/partition/offset`, its
/// identity in the request and the answer), in order.
pub fn request(records: &[InputRecord<'_>]) -> (Vec<u8>, Vec<String>) {
    let lineages: Vec<String> = records.iter().map(InputRecord::lineage).collect();
    // Sized for the whole body (base64 takes 4/3; each record's names and numbers ~200 B, a
    // header's ~50 B), so a batch is written without growing and copying it.
    let size: usize = records
        .iter()
        .map(|r| {
            let headers: usize = r
                .headers
                .iter()
                .map(|(n, v)| n.len() + v.map_or(0, <[u8]>::len) + 50)
                .sum();
            (r.key.map_or(0, <[u8]>::len) + r.value.map_or(0, <[u8]>::len) + headers) * 4 / 3
                + r.topic.len() * 2
                + 200
        })
        .sum();
    let mut body = Vec::with_capacity(size + 16);
    body.extend_from_slice(b"{\"records\":[");
    for (i, (input, lineage)) in records.iter().zip(&lineages).enumerate() {
        if i > 0 {
            body.push(b',');
        }
        write_record(&mut body, input, lineage);
    }
    body.extend_from_slice(b"]}");
    (body, lineages)
}

/// One record of the request, written straight into `body`: the field names are constants,
/// every string goes through serde_json's own escaping, a JSON value is copied as it came.
fn write_record(body: &mut Vec<u8>, input: &InputRecord<'_>, lineage: &str) {
    let mut n = itoa::Buffer::new();
    body.extend_from_slice(b"{\"lineage\":");
    string(body, lineage);
    body.extend_from_slice(b",\"topic\":");
    string(body, input.topic);
    body.extend_from_slice(b",\"partition\":");
    body.extend_from_slice(n.format(input.partition).as_bytes());
    body.extend_from_slice(b",\"offset\":");
    body.extend_from_slice(n.format(input.offset).as_bytes());
    body.extend_from_slice(b",\"timestamp\":");
    match input.timestamp {
        Some(t) => body.extend_from_slice(n.format(t).as_bytes()),
        None => body.extend_from_slice(b"null"),
    }
    match input.key.map(text) {
        None => body.extend_from_slice(b",\"key\":null,\"key_encoding\":null"),
        Some((k, encoding)) => {
            body.extend_from_slice(b",\"key\":");
            string(body, &k);
            body.extend_from_slice(b",\"key_encoding\":");
            string(body, encoding);
        }
    }
    body.extend_from_slice(b",\"headers\":[");
    for (i, &(name, value)) in input.headers.iter().enumerate() {
        if i > 0 {
            body.push(b',');
        }
        let (name, value, encoding) =
            match (std::str::from_utf8(name), value.map(std::str::from_utf8)) {
                (Ok(n), None) => (Cow::Borrowed(n), None, "utf8"),
                (Ok(n), Some(Ok(v))) => (Cow::Borrowed(n), Some(Cow::Borrowed(v)), "utf8"),
                _ => (
                    Cow::Owned(BASE64.encode(name)),
                    value.map(|v| Cow::Owned(BASE64.encode(v))),
                    "base64",
                ),
            };
        body.extend_from_slice(b"{\"name\":");
        string(body, &name);
        body.extend_from_slice(b",\"value\":");
        match value {
            Some(v) => string(body, &v),
            None => body.extend_from_slice(b"null"),
        }
        body.extend_from_slice(b",\"encoding\":");
        string(body, encoding);
        body.push(b'}');
    }
    body.extend_from_slice(b"],\"value\":");
    let encoding = match input.value {
        None => {
            body.extend_from_slice(b"null");
            "null"
        }
        Some(v) => match serde_json::from_slice::<&RawValue>(v) {
            Ok(raw) => {
                body.extend_from_slice(raw.get().as_bytes());
                "json"
            }
            Err(_) => {
                body.push(b'"');
                body.extend_from_slice(BASE64.encode(v).as_bytes());
                body.push(b'"');
                "base64"
            }
        },
    };
    body.extend_from_slice(b",\"value_encoding\":");
    string(body, encoding);
    body.push(b'}');
}

/// `s` as a JSON string (serde_json's escaping; writing into a Vec cannot fail).
fn string(body: &mut Vec<u8>, s: &str) {
    let _ = serde_json::to_writer(&mut *body, s);
}

/// Bytes as text when they are UTF-8, else base64; with the encoding's name.
fn text(b: &[u8]) -> (Cow<'_, str>, &'static str) {
    match std::str::from_utf8(b) {
        Ok(s) => (Cow::Borrowed(s), "utf8"),
        Err(_) => (Cow::Owned(BASE64.encode(b)), "base64"),
    }
}

/// Reads and decodes the application's answer.
async fn answer(resp: reqwest::Response, lineages: &[String]) -> Result<Vec<Answer>, CallError> {
    let status = resp.status();
    let body = resp.bytes().await.map_err(|e| {
        if e.is_timeout() {
            CallError::Unreachable(format!("reading the answer: timed out: {}", chain(&e)))
        } else {
            CallError::Unreachable(format!("reading the answer: {}", chain(&e)))
        }
    })?;
    if !status.is_success() {
        let mut text = String::from_utf8_lossy(&body).into_owned();
        truncate(&mut text, 200);
        return Err(CallError::Status(status.as_u16(), text));
    }
    decode(&body, lineages).map_err(CallError::Malformed)
}

/// An error with its causes: reqwest's own message says little ("error sending request").
fn chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut source = e.source();
    while let Some(cause) = source {
        s.push_str(": ");
        s.push_str(&cause.to_string());
        source = cause.source();
    }
    s
}

/// Decodes a response body: one answer per record of the request, in order.
pub fn decode(body: &[u8], lineages: &[String]) -> Result<Vec<Answer>, String> {
    let resp: Response<'_> = serde_json::from_slice(body).map_err(|e| e.to_string())?;
    if resp.results.len() != lineages.len() {
        return Err(format!(
            "{} results for {} records",
            resp.results.len(),
            lineages.len()
        ));
    }
    resp.results
        .into_iter()
        .zip(lineages)
        .enumerate()
        .map(|(i, (r, lineage))| {
            if let Some(echo) = &r.lineage
                && echo != lineage
            {
                return Err(format!(
                    "result {i} is for {echo}, but record {i} is {lineage}"
                ));
            }
            match (r.reject, r.outputs) {
                (Some(_), Some(o)) if !o.is_empty() => Err(format!(
                    "result {i} ({lineage}) has both outputs and a rejection"
                )),
                (Some(None), _) => Err(format!(
                    "result {i} ({lineage}): reject must be a message, not null"
                )),
                (Some(Some(message)), _) => Ok(Answer::Rejected(message)),
                (None, outputs) => outputs
                    .unwrap_or_default()
                    .into_iter()
                    .map(|o| {
                        o.decode()
                            .map_err(|e| format!("result {i} ({lineage}): {e}"))
                    })
                    .collect::<Result<_, _>>()
                    .map(Answer::Outputs),
            }
        })
        .collect()
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Response<'a> {
    #[serde(borrow)]
    results: Vec<ResultJson<'a>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ResultJson<'a> {
    #[serde(default)]
    lineage: Option<String>,
    #[serde(default)]
    #[serde(borrow)]
    outputs: Option<Vec<OutputJson<'a>>>,
    /// Present (null included) or absent: a null rejection is a mistake, not zero outputs.
    #[serde(default, deserialize_with = "present")]
    reject: Option<Option<String>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct OutputJson<'a> {
    /// Present (null included) or absent: `Option<&RawValue>` alone reads null as absent.
    /// Borrowed from the body: the value is copied once, into the output.
    #[serde(default, borrow, deserialize_with = "present")]
    value: Option<&'a RawValue>,
    #[serde(default)]
    value_base64: Option<String>,
    #[serde(default, deserialize_with = "present")]
    key: Option<Option<String>>,
    #[serde(default)]
    key_base64: Option<String>,
    #[serde(default)]
    topic: Option<String>,
    #[serde(default)]
    headers: Option<HeadersJson>,
}

/// An output's headers: an object of UTF-8 names and values (null: a header without a value),
/// or the request's list of `{"name", "value", "encoding"}`, whose `encoding` (`utf8`,
/// `base64`) applies to name and value alike.
#[derive(Deserialize)]
#[serde(untagged)]
enum HeadersJson {
    Object(BTreeMap<String, Option<String>>),
    List(Vec<HeaderJson>),
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct HeaderJson {
    name: String,
    value: Option<String>,
    encoding: Encoding,
}

#[derive(Clone, Copy, Deserialize)]
#[serde(rename_all = "lowercase")]
enum Encoding {
    Utf8,
    Base64,
}

impl HeadersJson {
    fn decode(self) -> Result<Headers, String> {
        let list = match self {
            HeadersJson::Object(h) => {
                return Ok(h
                    .into_iter()
                    .map(|(n, v)| (n, v.map(String::into_bytes)))
                    .collect());
            }
            HeadersJson::List(list) => list,
        };
        list.into_iter()
            .map(|h| match h.encoding {
                Encoding::Utf8 => Ok((h.name, h.value.map(String::into_bytes))),
                Encoding::Base64 => {
                    let bytes = |s: &str, what: &str| {
                        BASE64
                            .decode(s)
                            .map_err(|e| format!("a header's {what} is not base64: {e}"))
                    };
                    let name = String::from_utf8(bytes(&h.name, "name")?)
                        .map_err(|_| "a header's name is not UTF-8 once decoded".to_string())?;
                    let value = h.value.as_deref().map(|v| bytes(v, "value")).transpose()?;
                    Ok((name, value))
                }
            })
            .collect()
    }
}

/// A field that is present, whatever its value (null included).
fn present<'de, D: Deserializer<'de>, T: Deserialize<'de>>(d: D) -> Result<Option<T>, D::Error> {
    T::deserialize(d).map(Some)
}

impl OutputJson<'_> {
    fn decode(self) -> Result<Output, String> {
        let value = match (self.value, self.value_base64) {
            (Some(_), Some(_)) => return Err("an output has both value and value_base64".into()),
            (None, None) => {
                return Err("an output has no value (use null for a tombstone)".into());
            }
            (Some(raw), None) if raw.get() == "null" => None,
            (Some(raw), None) => Some(raw.get().as_bytes().to_vec()),
            (None, Some(b)) => Some(
                BASE64
                    .decode(b)
                    .map_err(|e| format!("value_base64 is not base64: {e}"))?,
            ),
        };
        let key = match (self.key, self.key_base64) {
            (Some(_), Some(_)) => return Err("an output has both key and key_base64".into()),
            (None, None) => None,
            (Some(k), None) => Some(k.map(String::into_bytes)),
            (None, Some(b)) => Some(Some(
                BASE64
                    .decode(b)
                    .map_err(|e| format!("key_base64 is not base64: {e}"))?,
            )),
        };
        if let Some(t) = &self.topic
            && !crate::kafka::valid_topic_name(t.as_bytes())
        {
            return Err(format!("topic {t:?} is not a valid topic name"));
        }
        Ok(Output {
            topic: self.topic,
            key,
            value,
            headers: self.headers.map(HeadersJson::decode).transpose()?,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn input<'a>(value: Option<&'a [u8]>, key: Option<&'a [u8]>) -> InputRecord<'a> {
        InputRecord {
            topic: "in",
            partition: 2,
            offset: 7,
            timestamp: Some(1_700_000_000_000),
            key,
            value,
            headers: vec![(b"h", Some(b"v")), (b"\xff", None)],
        }
    }

    fn limits() -> Limits {
        Limits {
            max_output_bytes: 100,
            max_outputs: 3,
        }
    }

    #[test]
    fn the_request_is_these_bytes() {
        // The wire format pinned: field order, nulls, raw JSON as it came.
        let (body, _) = request(&[input(Some(br#"{"a": 1}"#), Some(b"k")), input(None, None)]);
        let headers = r#""headers":[{"name":"h","value":"v","encoding":"utf8"},{"name":"/w==","value":null,"encoding":"base64"}]"#;
        let record = |rest: &str| {
            format!(
                r#"{{"lineage":"in/2/7","topic":"in","partition":2,"offset":7,"timestamp":1700000000000,{rest}}}"#
            )
        };
        let expected = format!(
            r#"{{"records":[{},{}]}}"#,
            record(&format!(
                r#""key":"k","key_encoding":"utf8",{headers},"value":{{"a": 1}},"value_encoding":"json""#
            )),
            record(&format!(
                r#""key":null,"key_encoding":null,{headers},"value":null,"value_encoding":"null""#
            )),
        );
        assert_eq!(String::from_utf8(body).unwrap(), expected);
    }

    #[test]
    fn request_text_is_escaped_and_a_missing_timestamp_is_null() {
        let record = InputRecord {
            timestamp: None,
            headers: vec![(b"a\"b", Some(b"c\nd\\")), (b"e", None)],
            ..input(Some(b" [1, \"\\u00e9\"] "), Some(b"k\"\n\x01"))
        };
        let (body, _) = request(&[record]);
        let v: serde_json::Value = serde_json::from_slice(&body).unwrap();
        let r = &v["records"][0];
        assert_eq!(r["key"], "k\"\n\u{1}");
        assert_eq!(r["timestamp"], serde_json::Value::Null);
        assert_eq!(
            r["headers"],
            serde_json::json!([
                {"name": "a\"b", "value": "c\nd\\", "encoding": "utf8"},
                {"name": "e", "value": null, "encoding": "utf8"},
            ])
        );
        assert_eq!(r["value"], serde_json::json!([1, "\u{e9}"]));
    }

    #[test]
    fn request_is_json_when_it_parses_and_base64_otherwise() {
        let (body, lineages) = request(&[
            input(Some(br#"{"a": [1, 2.50]}"#), Some(b"k")),
            input(Some(b"\x00\xffnot json"), Some(b"\xfe")),
            input(None, None),
        ]);
        // Raw JSON goes through as written: no float or whitespace reformatting.
        let text = String::from_utf8(body.clone()).unwrap();
        assert!(text.contains(r#""value":{"a": [1, 2.50]}"#), "{text}");
        let v: serde_json::Value = serde_json::from_slice(&body).unwrap();
        let r = &v["records"];
        assert_eq!(r[0]["lineage"], "in/2/7");
        assert_eq!(lineages[0], "in/2/7");
        assert_eq!(lineages.len(), 3);
        assert_eq!(r[0]["value_encoding"], "json");
        assert_eq!(
            (r[0]["key"].as_str(), r[0]["key_encoding"].as_str()),
            (Some("k"), Some("utf8"))
        );
        assert_eq!(r[0]["timestamp"], 1_700_000_000_000i64);
        assert_eq!(
            r[0]["headers"][0],
            serde_json::json!({"name": "h", "value": "v", "encoding": "utf8"})
        );
        assert_eq!(
            r[0]["headers"][1],
            serde_json::json!({"name": "/w==", "value": null, "encoding": "base64"})
        );
        assert_eq!(r[1]["value_encoding"], "base64");
        assert_eq!(
            BASE64.decode(r[1]["value"].as_str().unwrap()).unwrap(),
            b"\x00\xffnot json"
        );
        assert_eq!(r[1]["key_encoding"], "base64");
        assert_eq!(
            (r[2]["value"].is_null(), r[2]["value_encoding"].as_str()),
            (true, Some("null"))
        );
        assert!(r[2]["key"].is_null() && r[2]["key_encoding"].is_null());
    }

    fn lineages(n: usize) -> Vec<String> {
        (0..n).map(|i| format!("in/0/{i}")).collect()
    }

    #[test]
    fn decodes_outputs_rejections_and_envelope_fields() {
        let body = br#"{"results": [
            {"outputs": [{"value": {"x": 1}}, {"value": null, "key": null, "topic": "t2"}]},
            {"reject": "no such customer", "lineage": "in/0/1"},
            {},
            {"outputs": [{"value_base64": "AP8=", "key_base64": "/w==", "headers": {"a": "b", "n": null}}]},
            {"outputs": [{"value": "s", "key": "k"}]},
            {"outputs": [{"value": 1, "headers": [
                {"name": "trace", "value": "t1", "encoding": "utf8"},
                {"name": "YmluaA==", "value": "/wAB", "encoding": "base64"},
                {"name": "none", "value": null, "encoding": "utf8"}
            ]}]}
        ]}"#;
        let a = decode(body, &lineages(6)).unwrap();
        let out = |topic: Option<&str>, key, value: Option<&[u8]>, headers| Output {
            topic: topic.map(str::to_string),
            key,
            value: value.map(<[u8]>::to_vec),
            headers,
        };
        assert_eq!(
            a[0],
            Answer::Outputs(vec![
                out(None, None, Some(br#"{"x": 1}"#), None),
                out(Some("t2"), Some(None), None, None),
            ])
        );
        assert_eq!(a[1], Answer::Rejected("no such customer".into()));
        assert_eq!(a[2], Answer::Outputs(vec![]));
        assert_eq!(
            a[3],
            Answer::Outputs(vec![out(
                None,
                Some(Some(vec![0xff])),
                Some(&[0, 0xff]),
                Some(vec![("a".into(), Some(b"b".to_vec())), ("n".into(), None)]),
            )])
        );
        assert_eq!(
            a[4],
            Answer::Outputs(vec![out(
                None,
                Some(Some(b"k".to_vec())),
                Some(br#""s""#),
                None
            )])
        );
        // The list form: base64 names and values, binary values allowed.
        assert_eq!(
            a[5],
            Answer::Outputs(vec![out(
                None,
                None,
                Some(b"1"),
                Some(vec![
                    ("trace".into(), Some(b"t1".to_vec())),
                    ("binh".into(), Some(vec![0xff, 0x00, 0x01])),
                    ("none".into(), None),
                ]),
            )])
        );
    }

    #[test]
    fn a_wrong_answer_is_malformed() {
        for (body, n, why) in [
            (&b"not json"[..], 1, "expected"),
            (br#"{"results": []}"#, 1, "0 results for 1 records"),
            (br#"{"results": [{}, {}]}"#, 1, "2 results for 1 records"),
            (
                br#"{"results": [{"lineage": "in/0/9"}]}"#,
                1,
                "is for in/0/9",
            ),
            (
                br#"{"results": [{"outputs": [{"key": "k"}]}]}"#,
                1,
                "no value",
            ),
            (
                br#"{"results": [{"outputs": [{"value": 1, "value_base64": "AA=="}]}]}"#,
                1,
                "both value",
            ),
            (
                br#"{"results": [{"outputs": [{"value": 1, "topic": "a b"}]}]}"#,
                1,
                "not a valid topic",
            ),
            (
                br#"{"results": [{"outputs": [{"value_base64": "%%"}]}]}"#,
                1,
                "not base64",
            ),
            (
                br#"{"results": [{"reject": "x", "outputs": [{"value": 1}]}]}"#,
                1,
                "both outputs and a rejection",
            ),
            (br#"{"results": [{"output": []}]}"#, 1, "unknown field"),
            (
                br#"{"results": [{"outputs": [{"value": 1, "headers": [{"name": "%", "value": null, "encoding": "base64"}]}]}]}"#,
                1,
                "not base64",
            ),
            (
                br#"{"results": [{"outputs": [{"value": 1, "headers": [{"name": "/w==", "value": null, "encoding": "base64"}]}]}]}"#,
                1,
                "not UTF-8",
            ),
            (br#"{"results": [{"reject": null}]}"#, 1, "not null"),
        ] {
            let e = decode(body, &lineages(n)).unwrap_err();
            assert!(e.contains(why), "{}: {e}", String::from_utf8_lossy(body));
        }
    }

    #[test]
    fn an_answer_becomes_the_records_outputs_or_a_bad_record() {
        let i = input(Some(b"1"), Some(b"k"));
        let o = Output {
            topic: None,
            key: None,
            value: Some(b"v".to_vec()),
            headers: None,
        };
        let out = outputs(&i, Answer::Outputs(vec![o.clone()]), &limits()).unwrap();
        assert_eq!(
            out[0].key.as_deref(),
            Some(&b"k"[..]),
            "absent key keeps the input's"
        );
        assert_eq!(out[0].value.as_deref(), Some(&b"v"[..]));
        assert_eq!(out[0].headers, OutputHeaders::Input);
        let keyless = Output {
            key: Some(None),
            headers: Some(vec![("h".into(), None)]),
            ..o.clone()
        };
        let out = outputs(&i, Answer::Outputs(vec![keyless]), &limits()).unwrap();
        assert_eq!(out[0].key, None);
        assert_eq!(out[0].headers, OutputHeaders::Set(vec![("h".into(), None)]));
        match outputs(&i, Answer::Rejected("nope".into()), &limits()) {
            Err(Failure::BadRecord(e)) => assert_eq!(
                (e.reason, e.message.as_str()),
                (Reason::AppRejected, "nope")
            ),
            r => panic!("{r:?}"),
        }
        let four = Answer::Outputs(vec![o.clone(); 4]);
        assert!(
            matches!(outputs(&i, four, &limits()), Err(Failure::BadRecord(e)) if e.reason == Reason::TooManyOutputs)
        );
        let big = Output {
            value: Some(vec![b'x'; 101]),
            ..o
        };
        assert!(
            matches!(outputs(&i, Answer::Outputs(vec![big]), &limits()), Err(Failure::BadRecord(e)) if e.reason == Reason::OutputTooLarge)
        );
    }

    /// The schema, with `def` of it as the root.
    fn schema(def: &str) -> jsonschema::Validator {
        let mut schema: serde_json::Value =
            serde_json::from_str(include_str!("../../docs/call.schema.json")).unwrap();
        schema["$ref"] = format!("#/$defs/{def}").into();
        jsonschema::validator_for(&schema).unwrap()
    }

    fn errors(v: &jsonschema::Validator, doc: &serde_json::Value) -> Vec<String> {
        v.iter_errors(doc).map(|e| e.to_string()).collect()
    }

    #[test]
    fn what_exactly_sends_is_a_request_of_the_schema() {
        let (body, _) = request(&[
            input(Some(br#"{"a": 1}"#), Some(b"k")),
            input(Some(b"\x00\xffnot json"), Some(b"\xfe")),
            input(None, None),
        ]);
        let doc: serde_json::Value = serde_json::from_slice(&body).unwrap();
        let v = schema("request");
        assert_eq!(errors(&v, &doc), Vec::<String>::new());
        let mut broken = doc.clone();
        broken["records"][2]["key_encoding"] = "utf8".into();
        assert!(!v.is_valid(&broken), "a key's encoding without a key");
    }

    #[test]
    fn the_documented_examples_are_of_the_schema_and_the_answer_decodes() {
        let doc = include_str!("../../docs/transforms.md");
        let at = doc.find("The whole protocol is a JSON Schema").unwrap();
        let blocks: Vec<serde_json::Value> = doc[at..]
            .split("```json")
            .skip(1)
            .take(2)
            .map(|b| serde_json::from_str(b.split("```").next().unwrap()).unwrap())
            .collect();
        let (req, ans) = (&blocks[0], &blocks[1]);
        assert_eq!(errors(&schema("request"), req), Vec::<String>::new());
        assert_eq!(errors(&schema("answer"), ans), Vec::<String>::new());
        let lineages: Vec<String> = req["records"]
            .as_array()
            .unwrap()
            .iter()
            .map(|r| r["lineage"].as_str().unwrap().to_string())
            .collect();
        let answers = decode(ans.to_string().as_bytes(), &lineages).unwrap();
        let Answer::Outputs(o) = &answers[0] else {
            panic!("{answers:?}")
        };
        assert_eq!(o[1].headers, Some(vec![("sig".into(), Some(vec![0xff]))]));
        assert_eq!(
            answers[1],
            Answer::Rejected("a tombstone has no order".into())
        );
    }

    #[test]
    fn answers_the_schema_refuses_are_malformed_here_too() {
        let v = schema("answer");
        for body in [
            r#"{"results": [{"outputs": [{"key": "k"}]}]}"#,
            r#"{"results": [{"outputs": [{"value": 1, "value_base64": "AA=="}]}]}"#,
            r#"{"results": [{"outputs": [{"value": 1, "key": "a", "key_base64": "AA=="}]}]}"#,
            r#"{"results": [{"outputs": [{"value": 1, "topic": "a b"}]}]}"#,
            r#"{"results": [{"reject": "x", "outputs": [{"value": 1}]}]}"#,
            r#"{"results": [{"output": []}]}"#,
            r#"{"results": [{"reject": null}]}"#,
            r#"{"results": [{"outputs": [{"value": 1, "headers": [{"name": "a"}]}]}]}"#,
        ] {
            let doc: serde_json::Value = serde_json::from_str(body).unwrap();
            assert!(!v.is_valid(&doc), "the schema takes {body}");
            assert!(
                decode(body.as_bytes(), &lineages(1)).is_err(),
                "exactly takes {body}"
            );
        }
        let ok = r#"{"results": [{}, {"outputs": [{"value": null, "key": null, "topic": null}]}]}"#;
        let doc: serde_json::Value = serde_json::from_str(ok).unwrap();
        assert_eq!(errors(&v, &doc), Vec::<String>::new());
        assert!(decode(ok.as_bytes(), &lineages(2)).is_ok());
    }
}
