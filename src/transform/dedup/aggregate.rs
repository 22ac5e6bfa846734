//! The aggregate's mode (`--aggregate`): count, sum and distinct values per group per window;
//! each record's group's new totals go out (`updates`), or each window's once it closes
//! (`final`).

use std::borrow::Cow;

use tracing::warn;

use super::super::jq::Jq;
use super::super::{Failure, InputRecord, OutputHeaders, OutputRecord, TransformError};
use super::{Dedup, Effect, Mode, Step, bad};
use crate::config::{Emit, Late};
use crate::kafka::Tp;
use crate::state::seen::{Acc, Adds, Sum, Verdict, distinct_key};
use crate::state::window::Window;

/// The most an aggregate's output takes besides its group (twice, as JSON text): the window's
/// label twice, five numbers, the field names.
const TOTALS_OVERHEAD: usize = 256;

/// The windowed aggregates: what each record adds, and what goes out.
pub struct Aggregate {
    pub count: bool,
    /// The number each record adds to the sum.
    pub sum: Option<Jq>,
    /// The value each record adds to the distinct count.
    pub distinct: Option<Jq>,
    pub emit: Emit,
}

impl Dedup {
    /// The aggregates, in that mode.
    pub(super) fn aggregating(&self) -> Option<&Aggregate> {
        match &self.mode {
            Mode::Aggregate(agg) => Some(agg),
            Mode::First => None,
        }
    }

    /// A record for `group` at event time `t` in `window`, aggregated: its group's new totals
    /// (`updates`) or the totals of every window it closes (`final`) are its outputs. The
    /// state changes only once its outputs went out ([`Effect::Add`]).
    pub(super) fn aggregate<'a>(
        &mut self,
        input: &InputRecord<'a>,
        tp: &Tp,
        group: &[u8],
        t: i64,
        window: Window,
    ) -> Result<Vec<OutputRecord<'a>>, Failure> {
        let Some(agg) = self.aggregating() else {
            return Ok(Vec::new());
        };
        let number = agg.sum.as_ref().map(|p| number_of(p, input)).transpose()?;
        let value = (agg.distinct.as_ref())
            .map(|p| distinct_of(p, input))
            .transpose()?;
        let emit = agg.emit;
        let escaped = serde_json::to_string(&String::from_utf8_lossy(group)).map_or(0, |g| g.len());
        // --max-output-bytes is the longest key's limit plus its changelog record's 18 bytes.
        let max_output = self.max_key.saturating_add(18);
        if escaped.saturating_mul(2).saturating_add(TOTALS_OVERHEAD) > max_output {
            return Err(bad(format!(
                "a group of {} bytes: its totals would be over --max-output-bytes",
                group.len()
            ))
            .into());
        }
        let distinct = value.flatten().map(|v| distinct_key(group, &v));
        if let Some(k) = distinct.as_ref().filter(|k| k.len() > self.max_key) {
            return Err(bad(format!(
                "a group and distinct value of {} bytes: their changelog record would be over \
                 --max-output-bytes",
                k.len()
            ))
            .into());
        }
        let adds = Adds {
            number: number.flatten(),
            distinct: distinct.as_deref(),
        };
        match self.keeper.seen_mut().admit(tp, &window, group, adds) {
            Verdict::Late => {
                self.verdict("late");
                match self.late {
                    Late::Drop => Ok(Vec::new()),
                    // --window-late pass is refused with --aggregate.
                    Late::Dlq | Late::Pass => Err(self.late_record(&window)),
                }
            }
            Verdict::Full => {
                self.verdict("full");
                Err(self.full(&window, input.partition))
            }
            Verdict::First | Verdict::Duplicate => {
                let outputs = if emit == Emit::Final {
                    self.closing(input, tp, t)
                } else {
                    let acc = self.keeper.seen().peek(tp, &window, group, adds);
                    self.total_output(input, &window, group, &acc)?
                };
                self.verdict("aggregated");
                let (group, number) = (group.into(), adds.number);
                let change = Effect::Add {
                    window,
                    group,
                    number,
                    distinct,
                };
                self.step = Some(Step {
                    tp: tp.clone(),
                    t,
                    change,
                });
                Ok(outputs)
            }
        }
    }

    /// The totals of every window of `tp` a record at `t` closes, as the records to write. A
    /// window closes whatever its outputs: one the program fails for goes out as the plain
    /// totals with the failure's reason headers (the closing record is not to blame, and would
    /// close it again and again).
    fn closing(&self, input: &InputRecord<'_>, tp: &Tp, t: i64) -> Vec<OutputRecord<'static>> {
        let mut outputs = Vec::new();
        for (w, totals) in self.keeper.seen().closing(tp, t) {
            for (g, acc) in totals {
                match self.total_output(input, &w, &g, &acc) {
                    Ok(out) => outputs.extend(out),
                    Err(e) => outputs.push(self.failed_total(&w, &g, &acc, &e)),
                }
            }
        }
        outputs
    }

    /// `group`'s totals `acc` in `window` as the records to write: key
    /// `["<window>", "<group>"]`, value the totals, through `--jq` if given (which sees them
    /// as `.` and the window's label as `$window`).
    fn total_output(
        &self,
        input: &InputRecord<'_>,
        window: &Window,
        group: &[u8],
        acc: &Acc,
    ) -> Result<Vec<OutputRecord<'static>>, TransformError> {
        let (key, value) = self.plain_total(window, group, acc)?;
        let Some(jq) = &self.then else {
            return Ok(vec![OutputRecord {
                topic: None,
                partition: None,
                key: Some(Cow::Owned(key)),
                value: Some(Cow::Owned(value)),
                headers: OutputHeaders::Set(Vec::new()),
            }]);
        };
        let totals = InputRecord {
            key: Some(&key),
            value: Some(&value),
            headers: Vec::new(),
            ..*input
        };
        let label = self.keeper.seen().windows().label(window);
        let outputs = jq.apply_in(&totals, Some(&label))?;
        Ok(outputs.into_iter().map(owned).collect())
    }

    /// The totals the program failed for (`final`), as they are, with the failure's reason
    /// and message headers.
    fn failed_total(
        &self,
        window: &Window,
        group: &[u8],
        acc: &Acc,
        e: &TransformError,
    ) -> OutputRecord<'static> {
        warn!(
            reason = e.reason.as_str(),
            error = %e.message,
            "a window's totals the --jq program failed for go out as they are"
        );
        let (key, value) = self.plain_total(window, group, acc).unwrap_or_default();
        let headers = vec![
            (
                super::super::ERROR_REASON.to_string(),
                Some(e.reason.as_str().into()),
            ),
            (
                super::super::ERROR_MESSAGE.to_string(),
                Some(e.message.clone().into_bytes()),
            ),
        ];
        OutputRecord {
            topic: None,
            partition: None,
            key: Some(Cow::Owned(key)),
            value: Some(Cow::Owned(value)),
            headers: OutputHeaders::Set(headers),
        }
    }

    /// `group`'s totals `acc` in `window` as JSON key and value.
    fn plain_total(
        &self,
        window: &Window,
        group: &[u8],
        acc: &Acc,
    ) -> Result<(Vec<u8>, Vec<u8>), TransformError> {
        let Some(agg) = self.aggregating() else {
            return Ok(Default::default());
        };
        let label = self.keeper.seen().windows().label(window);
        let group = String::from_utf8_lossy(group);
        let mut value = serde_json::Map::new();
        value.insert("window".into(), label.as_str().into());
        value.insert("start".into(), window.start.into());
        value.insert("end".into(), window.end.into());
        value.insert("group".into(), group.as_ref().into());
        if agg.count {
            value.insert("count".into(), acc.count.into());
        }
        if agg.sum.is_some() {
            let sum = match acc.sum {
                Sum::Int(i) => i.into(),
                Sum::Float(f) => {
                    serde_json::Number::from_f64(f).map_or(serde_json::Value::Null, Into::into)
                }
            };
            value.insert("sum".into(), sum);
        }
        if agg.distinct.is_some() {
            value.insert("distinct".into(), acc.distinct.into());
        }
        let key = serde_json::to_vec(&[label.as_str(), group.as_ref()])
            .map_err(|e| bad(format!("the aggregate's key: {e}")))?;
        let value =
            serde_json::to_vec(&value).map_err(|e| bad(format!("the aggregate's value: {e}")))?;
        Ok((key, value))
    }
}

/// The number `program` (`--aggregate-sum`) yields for the record: `None` for null.
fn number_of(program: &Jq, input: &InputRecord<'_>) -> Result<Option<Sum>, TransformError> {
    let json = program
        .first_json(input)?
        .ok_or_else(|| bad("--aggregate-sum yields nothing"))?;
    match serde_json::from_slice::<serde_json::Value>(&json) {
        Ok(serde_json::Value::Null) => Ok(None),
        Ok(serde_json::Value::Number(n)) => match (n.as_i64(), n.as_f64()) {
            (Some(i), _) => Ok(Some(Sum::Int(i))),
            (None, Some(f)) if f.is_finite() => Ok(Some(Sum::Float(f))),
            _ => Err(bad(format!(
                "--aggregate-sum yields {n}, not a finite number"
            ))),
        },
        _ => Err(bad(format!(
            "--aggregate-sum yields {}, not a number",
            String::from_utf8_lossy(&json)
        ))),
    }
}

/// The value `program` (`--aggregate-distinct`) yields for the record, as bytes (a string's
/// text, else its JSON text): `None` for null.
fn distinct_of(program: &Jq, input: &InputRecord<'_>) -> Result<Option<Vec<u8>>, TransformError> {
    let json = program
        .first_json(input)?
        .ok_or_else(|| bad("--aggregate-distinct yields nothing"))?;
    match serde_json::from_slice::<serde_json::Value>(&json) {
        Ok(serde_json::Value::Null) => Ok(None),
        Ok(serde_json::Value::String(s)) => Ok(Some(s.into_bytes())),
        _ => Ok(Some(json)),
    }
}

/// `o` with its bytes its own.
fn owned(o: OutputRecord<'_>) -> OutputRecord<'static> {
    OutputRecord {
        topic: o.topic,
        partition: o.partition,
        key: o.key.map(|k| Cow::Owned(k.into_owned())),
        value: o.value.map(|v| Cow::Owned(v.into_owned())),
        headers: o.headers,
    }
}
