//! The Spark recipes' offsets table, `kafka_offset(group_id, topic, partition_id, fromOffset,
//! untilOffset)`, the job resuming from `untilOffset`: its names in one description. The
//! offsets tool reads and writes a job's table by it (`exactly offsets`, whose `--mysql-*`
//! options rename each part), and so does the database sink that takes the table over
//! (`--db-offsets-layout kafka-offset`, the recipes' names, `--db-offsets-table` its table).

/// The table and its columns.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KafkaOffset {
    /// Table.
    pub table: String,
    /// Consumer group column.
    pub group: String,
    /// Topic column.
    pub topic: String,
    /// Partition column.
    pub partition: String,
    /// The next offset to read (the recipe's `untilOffset`).
    pub offset: String,
    /// The start of the last batch (the recipe's `fromOffset`), written with each move; empty:
    /// no such column (the offsets tool only).
    pub from: String,
}

impl Default for KafkaOffset {
    /// The recipes' names.
    fn default() -> KafkaOffset {
        KafkaOffset {
            table: "kafka_offset".into(),
            group: "group_id".into(),
            topic: "topic".into(),
            partition: "partition_id".into(),
            offset: "untilOffset".into(),
            from: "fromOffset".into(),
        }
    }
}

impl KafkaOffset {
    /// The recipes' table under another name.
    pub fn named(table: &str) -> KafkaOffset {
        KafkaOffset {
            table: table.to_string(),
            ..KafkaOffset::default()
        }
    }

    /// Each part's name, with what it is (`table`, `group`, `topic`, `partition`, `offset`,
    /// `from`).
    pub fn parts(&self) -> [(&'static str, &str); 6] {
        [
            ("table", &self.table),
            ("group", &self.group),
            ("topic", &self.topic),
            ("partition", &self.partition),
            ("offset", &self.offset),
            ("from", &self.from),
        ]
    }

    /// The first part whose name is not plain (a-z A-Z 0-9 _, at most 64 bytes: names are
    /// written into the SQL, not bound), with its name; only `from` may be empty.
    pub fn not_plain(&self) -> Option<(&'static str, &str)> {
        self.parts().into_iter().find(|(part, name)| {
            let empty_ok = *part == "from";
            !((empty_ok || !name.is_empty())
                && name.len() <= 64
                && name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_'))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_plain_and_only_from_may_be_empty() {
        assert_eq!(KafkaOffset::default().not_plain(), None);
        let from_none = KafkaOffset {
            from: String::new(),
            ..KafkaOffset::default()
        };
        assert_eq!(from_none.not_plain(), None);
        let bad = KafkaOffset {
            topic: "topic; DROP".into(),
            ..KafkaOffset::default()
        };
        assert_eq!(bad.not_plain(), Some(("topic", "topic; DROP")));
        let empty = KafkaOffset {
            partition: String::new(),
            ..KafkaOffset::default()
        };
        assert_eq!(empty.not_plain(), Some(("partition", "")));
    }
}
