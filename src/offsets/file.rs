//! Offsets in a file (`file://PATH`): what a job that checkpoints to files (HDFS-style) kept.
//!
//! JSON (`[{"topic": "t", "partition": 0, "offset": 42}, …]`) or CSV (`topic,partition,offset`
//! lines, an optional header line), by the file's extension (`.csv`; anything else is JSON).
//! When PATH is a directory, its last file is read (`--file` names another): the recipes write
//! one file per batch, named by batch number, and names compare as text with their numbers as
//! numbers (`batch-9` before `batch-10`). Markers such as `_SUCCESS`, hidden files and files
//! still being written (`.tmp`, `.part`, `~` and the like) are not batches; the plan says which
//! file was read. A file holds one job's offsets, so the group is not part of it.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use super::{OffsetStore, Offsets};
use crate::error::Error;

/// A file of offsets, or a directory of them.
pub struct FileStore {
    path: PathBuf,
    /// In a directory, the file to read instead of the last.
    file: Option<String>,
}

#[derive(Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
struct Entry {
    topic: String,
    partition: i32,
    offset: i64,
}

impl FileStore {
    /// The store at a `file://` URL; `file`: in a directory, the file to read.
    pub fn new(url: &str, file: Option<&str>) -> Result<FileStore, Error> {
        let path = url.strip_prefix("file://").unwrap_or(url);
        if path.is_empty() {
            return Err(Error::Config(format!("'{url}': no path after file://")));
        }
        if let Some(f) = file
            && (f.is_empty() || f.contains('/'))
        {
            return Err(Error::Config(format!(
                "--file: '{f}' must name a file of the directory"
            )));
        }
        Ok(FileStore {
            path: path.into(),
            file: file.map(str::to_string),
        })
    }

    /// The file to read: PATH, or `--file` in the directory PATH, or its last batch file.
    fn source(&self) -> Result<PathBuf, Error> {
        if !self.path.is_dir() {
            if self.file.is_some() {
                return Err(Error::Config(format!(
                    "--file: {} is no directory",
                    self.path.display()
                )));
            }
            return Ok(self.path.clone());
        }
        if let Some(f) = &self.file {
            return Ok(self.path.join(f));
        }
        let mut files: Vec<PathBuf> = std::fs::read_dir(&self.path)
            .map_err(|e| unreadable(&self.path, e))?
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| p.is_file() && is_batch(p))
            .collect();
        files.sort_by_cached_key(|p| natural(&name_of(p)));
        files.pop().ok_or_else(|| {
            Error::Config(format!(
                "{}: the directory has no offsets file",
                self.path.display()
            ))
        })
    }
}

fn name_of(path: &Path) -> String {
    path.file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default()
}

/// Whether a file of a directory is a batch: not a marker (`_SUCCESS`), not hidden, not one
/// still being written or kept aside.
fn is_batch(path: &Path) -> bool {
    let name = name_of(path).to_ascii_lowercase();
    const ASIDE: [&str; 9] = [
        ".tmp",
        ".temp",
        ".part",
        ".partial",
        ".inprogress",
        ".swp",
        ".bak",
        ".crc",
        "~",
    ];
    !(name.starts_with('_')
        || name.starts_with('.')
        || ASIDE.iter().any(|s| name.ends_with(s))
        || name.contains(".tmp"))
}

/// A piece of a name, for natural order: text compares as text, a number as a number.
#[derive(Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Piece {
    Number(u128, usize),
    Text(String),
}

/// `name` in natural order: `batch-9` before `batch-10`, `9.csv` before `10.csv`.
fn natural(name: &str) -> Vec<Piece> {
    let mut pieces = Vec::new();
    let mut rest = name;
    while let Some(c) = rest.chars().next() {
        let digit = c.is_ascii_digit();
        let end = rest
            .find(|c: char| c.is_ascii_digit() != digit)
            .unwrap_or(rest.len());
        let (piece, tail) = rest.split_at(end);
        pieces.push(match piece.parse() {
            // More leading zeros after: `09` after `9`.
            Ok(n) if digit => Piece::Number(n, piece.len()),
            _ => Piece::Text(piece.to_string()),
        });
        rest = tail;
    }
    pieces
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
    fn describe(&self) -> Option<String> {
        let path = self.source().ok()?;
        Some(format!("file {}", path.display()))
    }

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
        let path = match &self.file {
            Some(f) if self.path.is_dir() => self.path.join(f),
            _ => self.path.clone(),
        };
        if path.is_dir() {
            return Err(Error::Config(format!(
                "{}: a directory; give the file to write (or --file)",
                path.display()
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
        let text = if is_csv(&path) {
            let mut s = String::from("topic,partition,offset\n");
            for e in &entries {
                s.push_str(&format!("{},{},{}\n", e.topic, e.partition, e.offset));
            }
            s
        } else {
            serde_json::to_string_pretty(&entries).unwrap_or_default() + "\n"
        };
        // Written beside it, then renamed: a crash leaves the old file or the new, whole.
        let tmp = path.with_extension("tmp-exactly");
        std::fs::write(&tmp, text).map_err(|e| unreadable(&tmp, e))?;
        std::fs::rename(&tmp, &path).map_err(|e| unreadable(&path, e))
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
            let store = FileStore::new(&url, None).unwrap();
            store.write("g", &offsets).unwrap();
            assert_eq!(store.read("g", &all).unwrap(), offsets, "{name}");
            // Only the partitions asked for.
            assert_eq!(store.read("g", &all[..1]).unwrap().len(), 1);
        }
        let batches = dir.join("batches");
        std::fs::create_dir_all(&batches).unwrap();
        for (name, text) in [
            ("batch-9.csv", "a,0,1\n"),
            ("batch-10.csv", "a,0,2\n"),
            ("batch-11.csv.tmp", "a,0,3\n"),
            ("batch-12.csv.part", "a,0,4\n"),
            (".batch-13.csv", "a,0,5\n"),
            ("_SUCCESS", ""),
        ] {
            std::fs::write(batches.join(name), text).unwrap();
        }
        let url = format!("file://{}", batches.display());
        let store = FileStore::new(&url, None).unwrap();
        assert_eq!(store.read("g", &all).unwrap(), [(tp("a", 0), 2)].into());
        let chosen = store.describe().unwrap();
        assert!(chosen.ends_with("batch-10.csv"), "{chosen}");
        let store = FileStore::new(&url, Some("batch-9.csv")).unwrap();
        assert_eq!(store.read("g", &all).unwrap(), [(tp("a", 0), 1)].into());
        assert!(FileStore::new(&url, Some("../x")).is_err());
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn names_sort_with_their_numbers_as_numbers() {
        let mut names = [
            "batch-10",
            "batch-9",
            "batch-100",
            "9",
            "10",
            "b-2-10",
            "b-2-9",
        ];
        names.sort_by_key(|n| natural(n));
        assert_eq!(
            names,
            [
                "9",
                "10",
                "b-2-9",
                "b-2-10",
                "batch-9",
                "batch-10",
                "batch-100"
            ]
        );
        for (name, batch) in [
            ("11.csv.tmp", false),
            ("x.json~", false),
            ("11.csv", true),
            ("7", true),
            ("_SUCCESS", false),
            (".11.csv.crc", false),
        ] {
            assert_eq!(is_batch(Path::new(name)), batch, "{name}");
        }
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
