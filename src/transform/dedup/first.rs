//! The dedup's mode: the first record of each key per window goes on, through `--jq` if given
//! (which sees the window's label as `$window`); later ones are dropped and counted.

use std::borrow::Cow;

use super::super::{Failure, InputRecord, OutputHeaders, OutputRecord, TransformError};
use super::{Dedup, Effect, Step};
use crate::config::Late;
use crate::kafka::Tp;
use crate::state::seen::Verdict;
use crate::state::window::Window;

impl Dedup {
    /// The dedup's verdict on a record of `key` at event time `t` in `window`: the first of
    /// its key goes on (its key remembered once its outputs went out), a duplicate is dropped
    /// (it moves the stream time), a late one follows `--window-late`.
    pub(super) fn first<'a>(
        &mut self,
        input: &InputRecord<'a>,
        tp: Tp,
        key: Cow<'_, [u8]>,
        t: i64,
        window: Window,
    ) -> Result<Vec<OutputRecord<'a>>, Failure> {
        let verdict = self.keeper.seen().decide(&tp, &window, &key);
        match verdict {
            Verdict::Duplicate => {
                self.verdict("duplicate");
                // A record dropped moves the stream time (a late one is behind it already).
                self.step = Some(Step {
                    tp,
                    t,
                    change: Effect::Nothing,
                });
                Ok(Vec::new())
            }
            Verdict::Late => {
                self.verdict("late");
                match self.late {
                    Late::Drop => Ok(Vec::new()),
                    Late::Pass => Ok(self.output(input, &window)?),
                    Late::Dlq => Err(self.late_record(&window)),
                }
            }
            Verdict::Full => {
                self.verdict("full");
                Err(self.full(&window, input.partition))
            }
            Verdict::First => {
                self.verdict("first");
                let outputs = self.output(input, &window)?;
                self.step = Some(Step {
                    tp,
                    t,
                    change: Effect::Key(window, key.into()),
                });
                Ok(outputs)
            }
        }
    }

    /// What the record becomes when it goes on, in `window`.
    fn output<'a>(
        &self,
        input: &InputRecord<'a>,
        window: &Window,
    ) -> Result<Vec<OutputRecord<'a>>, TransformError> {
        match &self.then {
            Some(jq) => {
                let label = self.keeper.seen().windows().label(window);
                jq.apply_in(input, Some(&label))
            }
            None => Ok(vec![OutputRecord {
                topic: None,
                partition: None,
                key: input.key.map(Cow::Borrowed),
                value: input.value.map(Cow::Borrowed),
                headers: OutputHeaders::Input,
            }]),
        }
    }
}
