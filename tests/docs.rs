//! The reference docs cannot drift from the code. `docs/configuration.md` lists exactly the
//! flags that `exactly run --help` and `exactly audit --help` print, with the same environment
//! variables and defaults; `docs/metrics.md` lists exactly the metric families the registry
//! exports, with the same types and label names; `docs/extending.md` shows the seams' traits
//! with the methods the code declares. README.md and the chapters under docs/ hold together:
//! every relative link leads to a file that exists, and its `#anchor` to a heading there; every
//! chapter is linked from README.md or docs/README.md; README.md stays a front door. No broker
//! needed.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::Command;

use exactly::metrics::{Family, Metrics};

const CONFIGURATION: &str = "docs/configuration.md";
const METRICS: &str = "docs/metrics.md";
const EXTENDING: &str = "docs/extending.md";
/// The most lines README.md may have: the front door; the chapters under docs/ hold the rest.
const README_LINES: usize = 400;

#[test]
fn extending_doc_shows_the_seams_as_they_are() {
    for (name, file) in [
        ("Transform", "src/transform/mod.rs"),
        ("Application", "src/transform/call.rs"),
        ("Sink", "src/sink/mod.rs"),
    ] {
        let code = std::fs::read_to_string(file).unwrap();
        let docs = std::fs::read_to_string(EXTENDING).unwrap();
        let code =
            trait_methods(&code, name).unwrap_or_else(|| panic!("no trait {name} in {file}"));
        let docs = trait_methods(&docs, name)
            .unwrap_or_else(|| panic!("fix {EXTENDING}: show `pub trait {name}`"));
        same_names(
            &format!("{EXTENDING}, `pub trait {name}`"),
            code.iter().map(String::as_str),
            docs.iter().map(String::as_str),
        );
    }
}

/// The names of the methods of `pub trait {name}` in `text`, up to its closing brace at the
/// start of a line.
fn trait_methods(text: &str, name: &str) -> Option<Vec<String>> {
    let start = text.find(&format!("pub trait {name}"))?;
    let body = &text[start..];
    let end = body.find("\n}").unwrap_or(body.len());
    Some(
        body[..end]
            .split("fn ")
            .skip(1)
            .filter_map(|f| f.split(['(', '<']).next())
            .map(str::to_string)
            .collect(),
    )
}

#[test]
fn configuration_doc_matches_run_help() {
    check_options("run", "## exactly run");
}

#[test]
fn configuration_doc_matches_audit_help() {
    check_options("audit", "## exactly audit");
}

#[test]
fn configuration_doc_matches_offsets_help() {
    for sub in ["show", "import", "export"] {
        check_options(
            &format!("offsets {sub}"),
            &format!("## exactly offsets {sub}"),
        );
    }
}

#[test]
fn configuration_doc_matches_state_help() {
    for sub in ["show", "import"] {
        check_options(&format!("state {sub}"), &format!("## exactly state {sub}"));
    }
}

#[test]
fn metrics_doc_matches_the_registry() {
    let metrics = Metrics::new();
    let code: BTreeMap<&str, &Family> = metrics
        .catalog()
        .iter()
        .map(|f| (f.name.as_str(), f))
        .collect();
    let mut docs = BTreeMap::new();
    for row in table(METRICS, "## Metric families") {
        let [name, kind, labels, _] = &row[..] else {
            panic!("fix {METRICS}: a row needs four cells: {row:?}");
        };
        let name = spans(name).next().unwrap_or(name.as_str()).to_string();
        let entry = (kind.clone(), label_names(labels));
        assert!(
            docs.insert(name, entry).is_none(),
            "fix {METRICS}: {row:?} is listed twice"
        );
    }
    same_names(
        &format!("{METRICS}, `## Metric families`"),
        code.keys().copied(),
        docs.keys().map(String::as_str),
    );
    for (name, family) in &code {
        let (kind, labels) = &docs[*name];
        assert_eq!(
            kind.as_str(),
            family.kind,
            "fix {METRICS}: the type of {name}"
        );
        let want: BTreeSet<String> = family.labels.iter().map(|l| l.to_string()).collect();
        assert_eq!(labels, &want, "fix {METRICS}: the labels of {name}");
    }
}

/// What `--help` says about one flag.
#[derive(Debug, Default)]
struct HelpFlag {
    /// The `[env: NAME=]` variable, empty when there is none.
    env: String,
    /// The `[default: …]` value.
    default: Option<String>,
}

/// Compares the table under `heading` with `exactly <subcommand> --help`.
fn check_options(subcommand: &str, heading: &str) {
    let help = help_flags(&help_text(subcommand));
    assert_eq!(
        help.get("--bootstrap-servers").map(|f| f.env.as_str()),
        Some("EXACTLY_BOOTSTRAP_SERVERS"),
        "fix tests/docs.rs: clap's help format changed, help_flags no longer reads it"
    );
    let mut docs = BTreeMap::new();
    for row in table(CONFIGURATION, heading) {
        let [flag, env, default, _] = &row[..] else {
            panic!("fix {CONFIGURATION}, `{heading}`: a row needs four cells: {row:?}");
        };
        assert!(
            flag.starts_with("`--"),
            "fix {CONFIGURATION}, `{heading}`: a flag cell starts with one backquoted flag: {flag}"
        );
        let flag = spans(flag).next().unwrap_or_default().to_string();
        let env = spans(env).next().unwrap_or(env.as_str()).to_string();
        let entry = (env, default.clone());
        assert!(
            docs.insert(flag, entry).is_none(),
            "fix {CONFIGURATION}, `{heading}`: {row:?} is listed twice"
        );
    }
    same_names(
        &format!("{CONFIGURATION}, `{heading}` (against `exactly {subcommand} --help`)"),
        help.keys().map(String::as_str),
        docs.keys().map(String::as_str),
    );
    for (flag, said) in &help {
        let (env, default) = &docs[flag];
        assert_eq!(
            env, &said.env,
            "fix {CONFIGURATION}, `{heading}`: the variable of {flag}"
        );
        if let Some(want) = &said.default {
            assert!(
                default == want || spans(default).any(|s| s == want.as_str()),
                "fix {CONFIGURATION}, `{heading}`: {flag} defaults to `{want}`, not {default:?}"
            );
        }
    }
}

/// Asserts that the docs name what the code names, no more, no less.
fn same_names<'a>(
    place: &str,
    code: impl IntoIterator<Item = &'a str>,
    docs: impl IntoIterator<Item = &'a str>,
) {
    let code: BTreeSet<&str> = code.into_iter().collect();
    let docs: BTreeSet<&str> = docs.into_iter().collect();
    let missing: Vec<_> = code.difference(&docs).collect();
    let stale: Vec<_> = docs.difference(&code).collect();
    assert!(
        missing.is_empty() && stale.is_empty(),
        "fix {place}: add {missing:?}; remove {stale:?}"
    );
}

/// The output of `exactly <subcommand> --help`, uncoloured.
fn help_text(subcommand: &str) -> String {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_exactly"));
    cmd.args(subcommand.split(' '))
        .arg("--help")
        .env("NO_COLOR", "1")
        .env_remove("CLICOLOR_FORCE");
    // A variable that is set shows its value in `[env: NAME=value]`.
    for (name, _) in std::env::vars_os() {
        if name.to_string_lossy().starts_with("EXACTLY_") {
            cmd.env_remove(name);
        }
    }
    let out = cmd.output().expect("run exactly");
    assert!(out.status.success(), "exactly {subcommand} --help: {out:?}");
    String::from_utf8(out.stdout).expect("help is UTF-8")
}

/// Every long flag in clap's long help (what `--help` prints), but `--help` and `--version`.
///
/// Each option starts a block at a line `-h, --help` or `--name <VALUE>`; its description
/// follows, then, after a blank line, any `Possible values:` with one `- value: …` a line, and,
/// after another blank line, one annotation a line (`[env: NAME=]`, `[default: value]`). A
/// description may itself contain `[default: …]`, but never after a blank line; an annotation
/// that wraps continues until its brackets balance.
fn help_flags(help: &str) -> BTreeMap<String, HelpFlag> {
    let mut blocks: Vec<Vec<&str>> = Vec::new();
    for line in help.lines().map(str::trim) {
        let option = line.starts_with("--")
            || line
                .strip_prefix('-')
                .is_some_and(|rest| rest.starts_with(|c: char| c.is_ascii_alphanumeric()));
        if option {
            blocks.push(vec![line]);
        } else if let Some(block) = blocks.last_mut() {
            block.push(line);
        }
    }
    let mut flags = BTreeMap::new();
    for block in blocks {
        let Some(at) = block[0].find("--") else {
            continue; // a short flag only
        };
        let name: String = block[0][at + 2..]
            .chars()
            .take_while(|c| c.is_ascii_alphanumeric() || *c == '-')
            .collect();
        if name == "help" || name == "version" {
            continue;
        }
        let mut annotations = Vec::new();
        let mut partial = String::new();
        let mut after_break = false;
        for &line in &block[1..] {
            if !partial.is_empty() {
                partial.push(' ');
                partial.push_str(line);
            } else if after_break && line.starts_with('[') {
                partial.push_str(line);
            } else {
                after_break = line.is_empty();
                continue;
            }
            if partial.matches('[').count() == partial.matches(']').count() {
                annotations.push(std::mem::take(&mut partial));
            }
        }
        let mut flag = HelpFlag::default();
        for a in annotations {
            if let Some(env) = a.strip_prefix("[env: ") {
                flag.env = env.split(['=', ']']).next().unwrap_or_default().to_string();
            } else if let Some(default) = a.strip_prefix("[default: ") {
                flag.default = Some(default.strip_suffix(']').unwrap_or(default).to_string());
            }
        }
        flags.insert(format!("--{name}"), flag);
    }
    flags
}

/// The rows of the first table under `heading` in `file`, as trimmed cells, without the header
/// row and the `|---|` line.
fn table(file: &str, heading: &str) -> Vec<Vec<String>> {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join(file);
    let doc = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let rows: Vec<Vec<String>> = doc
        .lines()
        .skip_while(|l| l.trim() != heading)
        .skip(1)
        .take_while(|l| !l.starts_with("## "))
        .skip_while(|l| !l.starts_with('|'))
        .take_while(|l| l.starts_with('|'))
        .skip(2)
        .map(|l| {
            // A `\|` inside a cell is a bar of its text, as Markdown has it.
            let cells = l.trim().trim_start_matches('|').trim_end_matches('|');
            cells
                .replace("\\|", "\u{0}")
                .split('|')
                .map(|c| c.trim().replace('\u{0}', "|"))
                .collect::<Vec<_>>()
        })
        .collect();
    assert!(!rows.is_empty(), "fix {file}: no table under `{heading}`");
    rows
}

/// The `code spans` of a table cell.
fn spans(cell: &str) -> impl Iterator<Item = &str> {
    cell.split('`').skip(1).step_by(2)
}

/// The label names in a cell: `topic, partition`, or `outcome (committed, aborted)` where the
/// parenthesised words are example values.
fn label_names(cell: &str) -> BTreeSet<String> {
    let mut outside = String::new();
    let mut depth = 0usize;
    for c in cell.chars() {
        match c {
            '(' => depth += 1,
            ')' => depth = depth.saturating_sub(1),
            _ if depth == 0 => outside.push(c),
            _ => {}
        }
    }
    outside
        .split(',')
        .map(|l| l.trim().trim_matches('`').to_string())
        .filter(|l| !l.is_empty())
        .collect()
}

#[test]
fn the_readme_stays_a_front_door() {
    let lines = read(&repo().join("README.md")).lines().count();
    assert!(
        lines <= README_LINES,
        "fix README.md: {lines} lines, more than {README_LINES}; move the detail into a chapter \
         under docs/"
    );
}

#[test]
fn every_relative_link_in_the_docs_resolves() {
    let mut broken = Vec::new();
    for file in markdown_files() {
        let text = read(&file);
        for target in prose(&text).into_iter().flat_map(link_targets) {
            if let Err(why) = resolve(&file, target) {
                broken.push(format!("{}: ({target}): {why}", shown(&file)));
            }
        }
    }
    assert!(broken.is_empty(), "fix these links:\n{}", broken.join("\n"));
}

#[test]
fn every_chapter_is_linked_from_the_readme_or_the_index() {
    let mut linked = BTreeSet::new();
    for index in [repo().join("README.md"), repo().join("docs/README.md")] {
        let text = read(&index);
        for target in prose(&text).into_iter().flat_map(link_targets) {
            let path = target.split('#').next().unwrap_or(target);
            if let Some(path) = local(&index, path).and_then(|p| p.canonicalize().ok()) {
                linked.insert(path);
            }
        }
    }
    let unlinked: Vec<String> = chapters()
        .into_iter()
        .filter(|c| !c.canonicalize().is_ok_and(|path| linked.contains(&path)))
        .map(|c| shown(&c))
        .collect();
    assert!(
        unlinked.is_empty(),
        "link these chapters from README.md or docs/README.md: {unlinked:?}"
    );
}

/// The repository's root.
fn repo() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// `path` from the repository's root, for messages.
fn shown(path: &Path) -> String {
    path.strip_prefix(repo())
        .unwrap_or(path)
        .display()
        .to_string()
}

/// The chapters: every `docs/*.md`, in name order.
fn chapters() -> Vec<PathBuf> {
    let mut found: Vec<PathBuf> = std::fs::read_dir(repo().join("docs"))
        .expect("read docs/")
        .map(|entry| entry.expect("a docs/ entry").path())
        .filter(|p| p.extension().is_some_and(|x| x == "md"))
        .collect();
    found.sort();
    found
}

/// README.md and the chapters.
fn markdown_files() -> Vec<PathBuf> {
    let mut files = vec![repo().join("README.md")];
    files.extend(chapters());
    files
}

/// The lines of a Markdown text outside its fenced code blocks.
fn prose(text: &str) -> Vec<&str> {
    let mut fenced = false;
    text.lines()
        .filter(|line| {
            if line.trim_start().starts_with("```") {
                fenced = !fenced;
                return false;
            }
            !fenced
        })
        .collect()
}

/// The targets of the inline links `[text](target)` on a line.
fn link_targets(line: &str) -> Vec<&str> {
    line.match_indices("](")
        .filter_map(|(at, _)| {
            let rest = &line[at + 2..];
            rest.find(')').map(|end| &rest[..end])
        })
        .collect()
}

/// The file a link from `file` to `path` (its part before any `#`) leads to; `None` for a link
/// off the repository.
fn local(file: &Path, path: &str) -> Option<PathBuf> {
    if path.contains("://") || path.starts_with("mailto:") {
        return None;
    }
    if path.is_empty() {
        return Some(file.to_path_buf());
    }
    file.parent().map(|dir| dir.join(path))
}

/// Checks that a link from `file` leads to a file that exists and, if it names an anchor in a
/// Markdown file, to a heading of that file.
fn resolve(file: &Path, target: &str) -> Result<(), String> {
    let (path, anchor) = target.split_once('#').unwrap_or((target, ""));
    let Some(linked) = local(file, path) else {
        return Ok(());
    };
    if !linked.exists() {
        return Err(format!("{} does not exist", shown(&linked)));
    }
    let markdown = linked.extension().is_some_and(|x| x == "md");
    if anchor.is_empty() || !markdown || anchors(&read(&linked)).contains(anchor) {
        return Ok(());
    }
    Err(format!(
        "{} has no heading with the anchor #{anchor}",
        shown(&linked)
    ))
}

/// The anchors GitHub gives a Markdown text's headings: the heading's text in lower case, every
/// character but letters, digits, `-`, `_` and spaces dropped, each space made a `-`; the
/// second heading with one anchor gets `-1` after it, the third `-2`.
fn anchors(text: &str) -> BTreeSet<String> {
    let mut uses: BTreeMap<String, usize> = BTreeMap::new();
    let mut found = BTreeSet::new();
    for line in prose(text) {
        let hashes = line.len() - line.trim_start_matches('#').len();
        let heading = match line[hashes..].strip_prefix(' ') {
            Some(heading) if (1..=6).contains(&hashes) => heading,
            _ => continue,
        };
        let slug: String = heading
            .trim()
            .to_lowercase()
            .chars()
            .filter(|&c| c.is_alphanumeric() || matches!(c, '-' | '_' | ' '))
            .map(|c| if c == ' ' { '-' } else { c })
            .collect();
        let seen = uses.entry(slug.clone()).or_default();
        found.insert(match *seen {
            0 => slug,
            n => format!("{slug}-{n}"),
        });
        *seen += 1;
    }
    found
}
