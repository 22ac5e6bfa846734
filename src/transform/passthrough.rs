//! Passthrough: key, value and headers as they are. The outputs borrow the input's bytes.

use std::borrow::Cow;

use super::{Failure, InputRecord, Limits, OutputHeaders, OutputRecord, Transform, check_size};

/// Copies each record (within the size limit).
pub struct Passthrough {
    limits: Limits,
}

impl Passthrough {
    /// A passthrough that enforces `limits`.
    pub fn new(limits: Limits) -> Passthrough {
        Passthrough { limits }
    }
}

impl Transform for Passthrough {
    fn apply<'a>(&mut self, input: &InputRecord<'a>) -> Result<Vec<OutputRecord<'a>>, Failure> {
        let size = input.key.map_or(0, <[u8]>::len) + input.value.map_or(0, <[u8]>::len);
        check_size(size, &self.limits)?;
        Ok(vec![OutputRecord {
            topic: None,
            partition: None,
            key: input.key.map(Cow::Borrowed),
            value: input.value.map(Cow::Borrowed),
            headers: OutputHeaders::Input,
        }])
    }
}
