//! Offsets in a file (`file://PATH`): what a job that checkpoints to files (HDFS-style) kept.
//!
//! JSON (`[{"topic": "t", "partition": 0, "offset": 42}, …]`) or CSV (`topic,partition,offset`
//! lines, an optional header line), by the file's extension (`.csv`; anything else is JSON).
//! When PATH is a directory, its last file is read: the recipes write one file per batch,
//! named by batch number (`9` before `10`: numbers compare as numbers), and markers such as
//! `_SUCCESS` or hidden files are not batches. A file holds one job's offsets, so the group
//! is not part of it.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use super::{OffsetStore, Offsets};
use crate::error::Error;

/// A file of offsets, or a directory of them.
pub struct FileStore {
    path: PathBuf,
}

#[derive(Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
struct Entry {
    topic: String,
    partition: i32,
    offset: i64,
}

impl FileStore {
    /// The store at a `file://` URL.
    pub fn new(url: &str) -> Result<FileStore, Error> {
        let path = url.strip_prefix("file://").unwrap_or(url);
        if path.is_empty() {
            return Err(Error::Config(format!("'{url}': no path after file://")));
        }
        Ok(FileStore { path: path.into() })
    }

    /// The file to read: PATH, or the last file by name in the directory PATH.
    fn source(&self) -> Result<PathBuf, Error> {
        if !self.path.is_dir() {
            return Ok(self.path.clone());
        }
        let mut files: Vec<PathBuf> = std::fs::read_dir(&self.path)
            .map_err(|e| unreadable(&self.path, e))?
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| p.is_file())
            .filter(|p| {
                let name = p.file_name().map(|n| n.to_string_lossy().into_owned());
                !name.is_some_and(|n| n.starts_with('_') || n.starts_with('.'))
            })
            .collect();
        files.sort_by_key(|p| batch_order(p));
        files.pop().ok_or_else(|| {
            Error::Config(format!(
                "{}: the directory has no file",
                self.path.display()
            ))
        })
    }
}

/// Sorting key of a batch file: the digits its name starts with as a number (`9` before
/// `10`), then the name.
fn batch_order(path: &Path) -> (u128, String) {
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let digits: String = name.chars().take_while(char::is_ascii_digit).collect();
    (digits.parse().unwrap_or(0), name)
}

fn unreadable(path: &Path, e: std::io::Error) -> Error {
    Error::Config(format!("{}: {e}", path.display()))
}

fn is_csv(path: &Path) -> bool {
    path.extension()
        .is_some_and(|e| e.eq_ignore_ascii_case("csv"))
}

/// The entries of a file's text.
fn parse(path: &Path, text: &str) -> Result<Vec<Entry>, Error> {
    let bad =
        |line: usize, why: String| Error::Config(format!("{}: line {line}: {why}", path.display()));
    if !is_csv(path) {
        return serde_json::from_str(text).map_err(|e| {
            bad(
                e.line(),
                format!("not a list of topic, partition, offset: {e}"),
            )
        });
    }
    let mut out = Vec::new();
    for (i, line) in text.lines().enumerate() {
        let fields: Vec<&str> = line.split(',').map(str::trim).collect();
        match fields[..] {
            [""] => {}
            ["topic", "partition", "offset"] if i == 0 => {}
            [topic, partition, offset] => out.push(Entry {
                topic: topic.to_string(),
                partition: partition
                    .parse()
                    .map_err(|_| bad(i + 1, format!("partition '{partition}' is not a number")))?,
                offset: offset
                    .parse()
                    .map_err(|_| bad(i + 1, format!("offset '{offset}' is not a number")))?,
            }),
            _ => return Err(bad(i + 1, "expected topic,partition,offset".into())),
        }
    }
    Ok(out)
}

impl OffsetStore for FileStore {
    fn read(&self, _group: &str, partitions: &[(String, i32)]) -> Result<Offsets, Error> {
        let path = self.source()?;
        let text = std::fs::read_to_string(&path).map_err(|e| unreadable(&path, e))?;
        let mut out = Offsets::new();
        for e in parse(&path, &text)? {
            let key = (e.topic, e.partition);
            if partitions.contains(&key) && out.insert(key.clone(), e.offset).is_some() {
                return Err(Error::Config(format!(
                    "{}: {}[{}] is listed twice",
                    path.display(),
                    key.0,
                    key.1
                )));
            }
        }
        Ok(out)
    }

    fn write(&self, _group: &str, offsets: &Offsets) -> Result<(), Error> {
        if self.path.is_dir() {
            return Err(Error::Config(format!(
                "{}: a directory; give the file to write",
                self.path.display()
            )));
        }
        let entries: Vec<Entry> = offsets
            .iter()
            .map(|((topic, partition), offset)| Entry {
                topic: topic.clone(),
                partition: *partition,
                offset: *offset,
            })
            .collect();
        let text = if is_csv(&self.path) {
            let mut s = String::from("topic,partition,offset\n");
            for e in &entries {
                s.push_str(&format!("{},{},{}\n", e.topic, e.partition, e.offset));
            }
            s
        } else {
            serde_json::to_string_pretty(&entries).unwrap_or_default() + "\n"
        };
        // Written beside it, then renamed: a crash leaves the old file or the new, whole.
        let tmp = self.path.with_extension("tmp-exactly");
        std::fs::write(&tmp, text).map_err(|e| unreadable(&tmp, e))?;
        std::fs::rename(&tmp, &self.path).map_err(|e| unreadable(&self.path, e))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tp(t: &str, p: i32) -> (String, i32) {
        (t.to_string(), p)
    }

    #[test]
    fn json_and_csv_round_trip_and_directories_read_their_last_file() {
        let dir = std::env::temp_dir().join(format!("exactly-file-store-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let offsets: Offsets = [(tp("a", 0), 5), (tp("a", 1), 7), (tp("b", 0), 0)].into();
        let all = [tp("a", 0), tp("a", 1), tp("b", 0)];
        for name in ["o.json", "o.csv"] {
            let url = format!("file://{}", dir.join(name).display());
            let store = FileStore::new(&url).unwrap();
            store.write("g", &offsets).unwrap();
            assert_eq!(store.read("g", &all).unwrap(), offsets, "{name}");
            // Only the partitions asked for.
            assert_eq!(store.read("g", &all[..1]).unwrap().len(), 1);
        }
        let batches = dir.join("batches");
        std::fs::create_dir_all(&batches).unwrap();
        std::fs::write(batches.join("9.csv"), "a,0,1\n").unwrap();
        std::fs::write(batches.join("10.csv"), "a,0,2\n").unwrap();
        std::fs::write(batches.join("_SUCCESS"), "").unwrap();
        let store = FileStore::new(&format!("file://{}", batches.display())).unwrap();
        assert_eq!(store.read("g", &all).unwrap(), [(tp("a", 0), 2)].into());
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn bad_files_name_the_line() {
        let p = Path::new("x.csv");
        for (text, why) in [
            ("a,zero,1", "line 1: partition 'zero'"),
            ("a,0,1\na,1", "line 2: expected"),
            ("a,0,-x", "offset '-x'"),
        ] {
            let e = parse(p, text).err().unwrap().to_string();
            assert!(e.contains(why), "{text}: {e}");
        }
        let e = parse(Path::new("x.json"), r#"[{"topic": "a"}]"#)
            .err()
            .unwrap();
        assert!(e.to_string().contains("line 1"), "{e}");
    }
}
