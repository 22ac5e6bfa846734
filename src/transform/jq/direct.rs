//! Programs of the shape most enrichments have, run straight over jaq's values.
//!
//! jaq's interpreter pays for jq's generality on every record: boxed iterators for every
//! term's outputs, a context cloned at every pipe, paths exploded before an assignment. Most
//! programs exactly runs are a few field reads, assignments, deletions, arithmetic, a
//! builtin or two, a `select` and an object built from fields, each yielding one value. This
//! module compiles such a program (jaq's own parse of it) to a small tree and runs it as plain
//! recursion, with jaq's own operations on jaq's own values: `Val`'s arithmetic and ordering,
//! `ValT::index` and `ValT::map_index` (which decide key order, `del`'s `swap_remove`, and
//! every error), and jaq itself for every builtin (`todate`, `floor`, `test("…")`, …), compiled
//! once per call site. So the semantics are jaq's by construction; the unit tests below run
//! both on many programs and inputs and compare the bytes.
//!
//! Anything else is [`Stop::Unsure`] at compile time (no direct program: jaq runs it all) or
//! at run time (this record goes to jaq). A jq error is [`Stop::Error`]: the record goes to
//! jaq too, which reports it in its own words.

use jaq_core::data::JustLut;
use jaq_core::load::lex::StrPart;
use jaq_core::load::parse::{BinaryOp, Term};
use jaq_core::ops::{Cmp, Math};
use jaq_core::path::{Opt, Part};
use jaq_core::{Ctx, Exn, ValT, Vars};
use jaq_json::Val;

/// Why a record is not run here.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stop {
    /// jq raised an error (jaq says which, in its run).
    Error,
    /// The run left what this module does (a builtin with more than one output, a key that
    /// is not a string): jaq decides.
    Unsure,
}

/// Zero or one value, or why not.
type Out = Result<Option<Val>, Stop>;

/// A path of constant keys or indices: `.a`, `.a.b?`, `.[0]`.
type Keys = Vec<(Val, Opt)>;

/// A compiled program: its top-level comma-separated parts, each yielding zero or one value.
pub struct Direct {
    outputs: Vec<Node>,
}

/// A jaq filter for one builtin call, with the constants it was called with.
struct Builtin {
    filter: jaq_core::Filter<JustLut<Val>>,
}

enum Node {
    Id,
    Lit(Val),
    /// `f` then the keys, read.
    Get(Box<Node>, Keys),
    Pipe(Box<Node>, Box<Node>),
    Math(Box<Node>, Math, Box<Node>),
    Cmp(Box<Node>, Cmp, Box<Node>),
    /// `l and r` (stop on `false`), `l or r` (stop on `true`).
    Logic(Box<Node>, bool, Box<Node>),
    Alt(Box<Node>, Box<Node>),
    Neg(Box<Node>),
    Not,
    Empty,
    Select(Box<Node>),
    If(Box<Node>, Box<Node>, Box<Node>),
    /// `f?`, `try f`: a jq error yields nothing.
    Try(Box<Node>),
    /// Each entry's key and value.
    Obj(Vec<(Node, Node)>),
    /// Each element yields zero or one value.
    Arr(Vec<Node>),
    /// `keys = f` (`f` of the input).
    Assign(Keys, Box<Node>),
    /// `keys |= f` (`f` of the value at `keys`; none deletes it, as `del` does).
    Update(Keys, Box<Node>),
    /// `keys op= f` (`f` of the input).
    UpdateMath(Keys, Math, Box<Node>),
    /// `keys //= f` (`f` of the input).
    UpdateAlt(Keys, Box<Node>),
    /// Several updates in turn (`del(.a, .b)`).
    Seq(Vec<Node>),
    Call(Builtin),
}

/// Builtins that touch more than their input (or read the program's inputs): left to jaq.
const NOT_DIRECT: &[&str] = &[
    "input",
    "inputs",
    "debug",
    "debug_empty",
    "stderr",
    "stderr_empty",
    "halt",
    "halt_error",
    "input_filename",
    "getpath",
    "paths",
    "path",
    "error",
];

impl Direct {
    /// The direct program for `code`, if every part of it is one this module runs.
    /// `compile` compiles a builtin call's text with the same definitions as the program.
    pub fn compile(
        code: &str,
        compile: &dyn Fn(&str) -> Option<jaq_core::Filter<JustLut<Val>>>,
    ) -> Option<Direct> {
        let term = jaq_core::load::parse(code, |p| p.term())?;
        let mut parts = Vec::new();
        commas(term, &mut parts);
        let outputs = parts
            .into_iter()
            .map(|t| node(t, compile))
            .collect::<Option<Vec<_>>>()?;
        Some(Direct { outputs })
    }

    /// The program's outputs for `v`.
    pub fn run(&self, v: Val) -> Result<Vec<Val>, Stop> {
        let mut outs = Vec::with_capacity(self.outputs.len());
        let last = self.outputs.len().saturating_sub(1);
        let mut v = Some(v);
        for (i, n) in self.outputs.iter().enumerate() {
            // The last part takes the input itself, so its updates need not copy it.
            let input = if i == last { v.take() } else { v.clone() };
            if let Some(y) = eval(n, input.unwrap_or_default())? {
                outs.push(y);
            }
        }
        Ok(outs)
    }
}

fn commas<'s>(t: Term<&'s str>, into: &mut Vec<Term<&'s str>>) {
    match t {
        Term::BinOp(l, BinaryOp::Comma, r) => {
            commas(*l, into);
            commas(*r, into);
        }
        t => into.push(t),
    }
}

type Compile<'c> = &'c dyn Fn(&str) -> Option<jaq_core::Filter<JustLut<Val>>>;

fn boxed(t: Term<&str>, c: Compile) -> Option<Box<Node>> {
    node(t, c).map(Box::new)
}

fn node(t: Term<&str>, c: Compile) -> Option<Node> {
    Some(match t {
        Term::Id => Node::Id,
        Term::Num(_) | Term::Str(None, _) => Node::Lit(literal(&t)?),
        Term::Arr(None) => Node::Arr(Vec::new()),
        Term::Arr(Some(t)) => {
            let mut elems = Vec::new();
            commas(*t, &mut elems);
            Node::Arr(
                elems
                    .into_iter()
                    .map(|t| node(t, c))
                    .collect::<Option<_>>()?,
            )
        }
        Term::Obj(entries) => Node::Obj(
            entries
                .into_iter()
                .map(|(k, v)| {
                    let value = match v {
                        Some(v) => node(v, c)?,
                        // `{a}` is `{a: .a}`.
                        None => Node::Get(Box::new(Node::Id), vec![(literal(&k)?, Opt::Essential)]),
                    };
                    Some((node(k, c)?, value))
                })
                .collect::<Option<_>>()?,
        ),
        Term::Neg(t) => Node::Neg(boxed(*t, c)?),
        Term::TryCatch(t, None) => Node::Try(boxed(*t, c)?),
        Term::IfThenElse(branches, otherwise) => {
            let mut tail = match otherwise {
                Some(e) => node(*e, c)?,
                None => Node::Id,
            };
            for (cond, then) in branches.into_iter().rev() {
                tail = Node::If(boxed(cond, c)?, boxed(then, c)?, Box::new(tail));
            }
            tail
        }
        Term::Path(base, path) => Node::Get(boxed(*base, c)?, keys(path.0)?),
        Term::BinOp(l, op, r) => match op {
            BinaryOp::Pipe(None) => Node::Pipe(boxed(*l, c)?, boxed(*r, c)?),
            BinaryOp::Alt => Node::Alt(boxed(*l, c)?, boxed(*r, c)?),
            BinaryOp::Or => Node::Logic(boxed(*l, c)?, true, boxed(*r, c)?),
            BinaryOp::And => Node::Logic(boxed(*l, c)?, false, boxed(*r, c)?),
            BinaryOp::Math(op) => Node::Math(boxed(*l, c)?, op, boxed(*r, c)?),
            BinaryOp::Cmp(op) => Node::Cmp(boxed(*l, c)?, op, boxed(*r, c)?),
            BinaryOp::Assign => Node::Assign(path_of(*l)?, boxed(*r, c)?),
            BinaryOp::Update => Node::Update(path_of(*l)?, boxed(*r, c)?),
            BinaryOp::UpdateMath(op) => Node::UpdateMath(path_of(*l)?, op, boxed(*r, c)?),
            BinaryOp::UpdateAlt => Node::UpdateAlt(path_of(*l)?, boxed(*r, c)?),
            BinaryOp::Pipe(Some(_)) | BinaryOp::Comma => return None,
        },
        Term::Call(name, args) => call(name, args, c)?,
        _ => return None,
    })
}

fn call(name: &str, mut args: Vec<Term<&str>>, c: Compile) -> Option<Node> {
    Some(match (name, args.len()) {
        ("empty", 0) => Node::Empty,
        ("not", 0) => Node::Not,
        ("true", 0) => Node::Lit(Val::Bool(true)),
        ("false", 0) => Node::Lit(Val::Bool(false)),
        ("null", 0) => Node::Lit(Val::Null),
        ("select", 1) => Node::Select(boxed(args.pop()?, c)?),
        // `def del(f): f |= empty;`
        ("del", 1) => {
            let mut paths = Vec::new();
            commas(args.pop()?, &mut paths);
            let dels = paths
                .into_iter()
                .map(|p| Some(Node::Update(path_of(p)?, Box::new(Node::Empty))))
                .collect::<Option<Vec<_>>>()?;
            Node::Seq(dels)
        }
        _ if NOT_DIRECT.contains(&name) || name.starts_with('$') => return None,
        _ => {
            // A builtin called with constants: jaq runs it, compiled once here.
            let consts = args
                .iter()
                .map(|a| constant_text(a))
                .collect::<Option<Vec<_>>>()?;
            let text = if consts.is_empty() {
                name.to_string()
            } else {
                format!("{name}({})", consts.join("; "))
            };
            Node::Call(Builtin { filter: c(&text)? })
        }
    })
}

/// A constant argument as jq text: a number as written, a string as JSON.
fn constant_text(t: &Term<&str>) -> Option<String> {
    match t {
        Term::Num(n) => Some(n.to_string()),
        Term::Str(None, parts) => serde_json::to_string(&string(parts)?).ok(),
        _ => None,
    }
}

fn num(n: &str) -> Option<Val> {
    match n.parse::<isize>() {
        Ok(i) => Some(Val::from(i)),
        Err(_) => <Val as ValT>::from_num(n).ok(),
    }
}

fn string(parts: &[StrPart<&str, Term<&str>>]) -> Option<String> {
    let mut s = String::new();
    for p in parts {
        match p {
            StrPart::Str(t) => s.push_str(t),
            StrPart::Char(ch) => s.push(*ch),
            StrPart::Term(_) => return None,
        }
    }
    Some(s)
}

fn literal(t: &Term<&str>) -> Option<Val> {
    match t {
        Term::Num(n) => num(n),
        Term::Str(None, parts) => Some(Val::from(string(parts)?)),
        _ => None,
    }
}

fn keys(parts: Vec<(Part<Term<&str>>, Opt)>) -> Option<Keys> {
    parts
        .into_iter()
        .map(|(part, opt)| match part {
            Part::Index(i) => Some((literal(&i)?, opt)),
            Part::Range(..) => None,
        })
        .collect()
}

/// The keys of an assignment's left side: `.a.b`, never `f.a`.
fn path_of(t: Term<&str>) -> Option<Keys> {
    match t {
        Term::Path(base, path) if matches!(*base, Term::Id) => keys(path.0),
        _ => None,
    }
}

fn eval(n: &Node, v: Val) -> Out {
    Ok(Some(match n {
        Node::Id => v,
        Node::Lit(x) => x.clone(),
        Node::Get(base, keys) => return get(base, keys, v),
        Node::Pipe(l, r) => match eval(l, v)? {
            Some(x) => return eval(r, x),
            None => return Ok(None),
        },
        Node::Math(l, op, r) => match both(l, r, v)? {
            Some((x, y)) => op.run(x, y).map_err(|_| Stop::Error)?,
            None => return Ok(None),
        },
        Node::Cmp(l, op, r) => match both(l, r, v)? {
            Some((x, y)) => Val::Bool(op.run(&x, &y)),
            None => return Ok(None),
        },
        Node::Logic(l, stop, r) => return logic(l, *stop, r, v),
        Node::Alt(l, r) => match eval(l, v.clone())? {
            Some(x) if x.as_bool() => x,
            _ => return eval(r, v),
        },
        Node::Neg(f) => match eval(f, v)? {
            Some(x) => (-x).map_err(|_| Stop::Error)?,
            None => return Ok(None),
        },
        Node::Not => Val::Bool(!v.as_bool()),
        Node::Empty => return Ok(None),
        Node::Select(f) => match eval(f, v.clone())? {
            Some(c) if c.as_bool() => v,
            _ => return Ok(None),
        },
        Node::If(cond, then, otherwise) => match eval(cond, v.clone())? {
            Some(c) if c.as_bool() => return eval(then, v),
            Some(_) => return eval(otherwise, v),
            None => return Ok(None),
        },
        Node::Try(f) => match eval(f, v) {
            Err(Stop::Error) => return Ok(None),
            out => return out,
        },
        Node::Obj(entries) => return object(entries, v),
        Node::Arr(elems) => return array(elems, v),
        Node::Assign(keys, f) => match eval(f, v.clone())? {
            Some(y) => return update(v, keys, &|_| Ok(Some(y.clone()))),
            None => return Ok(None),
        },
        Node::Update(keys, f) => return update(v, keys, &|x| eval(f, x)),
        Node::UpdateMath(keys, op, f) => match eval(f, v.clone())? {
            Some(y) => {
                return update(v, keys, &|x| {
                    op.run(x, y.clone()).map(Some).map_err(|_| Stop::Error)
                });
            }
            None => return Ok(None),
        },
        Node::UpdateAlt(keys, f) => match eval(f, v.clone())? {
            Some(y) => {
                return update(v, keys, &|x| {
                    Ok(Some(if x.as_bool() { x } else { y.clone() }))
                });
            }
            None => return Ok(None),
        },
        Node::Seq(steps) => return seq(steps, v),
        Node::Call(b) => return b.run(v),
    }))
}

/// Both sides of a binary operator over `v`, left first; nothing when either gives nothing
/// (jaq runs the right side once per output of the left: not at all after none, so an error
/// there is never raised).
fn both(l: &Node, r: &Node, v: Val) -> Result<Option<(Val, Val)>, Stop> {
    let Some(x) = eval(l, v.clone())? else {
        return Ok(None);
    };
    Ok(eval(r, v)?.map(|y| (x, y)))
}

/// `l and r` (`stop` false) or `l or r` (`stop` true): the right side only when the left
/// does not decide.
fn logic(l: &Node, stop: bool, r: &Node, v: Val) -> Out {
    let Some(x) = eval(l, v.clone())? else {
        return Ok(None);
    };
    if x.as_bool() == stop {
        return Ok(Some(Val::Bool(stop)));
    }
    Ok(eval(r, v)?.map(|y| Val::Bool(y.as_bool())))
}

/// `.a.b?…` of `base`'s output.
fn get(base: &Node, keys: &[(Val, Opt)], v: Val) -> Out {
    let Some(mut x) = eval(base, v)? else {
        return Ok(None);
    };
    for (k, opt) in keys {
        x = match (x.index(k), opt) {
            (Ok(y), _) => y,
            (Err(_), Opt::Optional) => return Ok(None),
            (Err(_), Opt::Essential) => return Err(Stop::Error),
        };
    }
    Ok(Some(x))
}

/// An object, entry by entry, key before value, as jaq's `{k: v} + …` runs them.
fn object(entries: &[(Node, Node)], v: Val) -> Out {
    let mut pairs = Vec::with_capacity(entries.len());
    for (k, x) in entries {
        let Some(k) = eval(k, v.clone())? else {
            return Ok(None);
        };
        let Some(x) = eval(x, v.clone())? else {
            return Ok(None);
        };
        if !matches!(k, Val::TStr(_)) {
            return Err(Stop::Unsure);
        }
        pairs.push((k, x));
    }
    Ok(Some(Val::from_map(pairs).map_err(|_| Stop::Error)?))
}

/// An array of every element's output.
fn array(elems: &[Node], v: Val) -> Out {
    let mut items = Vec::with_capacity(elems.len());
    for e in elems {
        items.extend(eval(e, v.clone())?);
    }
    Ok(Some(Val::Arr(items.into())))
}

/// Steps one after the other, each over the last's output.
fn seq(steps: &[Node], v: Val) -> Out {
    let mut x = v;
    for s in steps {
        match eval(s, x)? {
            Some(y) => x = y,
            None => return Ok(None),
        }
    }
    Ok(Some(x))
}

/// `v` with the value at `keys` replaced by `f` of it (removed when `f` yields nothing),
/// through jaq's `map_index`, as jaq's own path update does.
fn update(v: Val, keys: &[(Val, Opt)], f: &dyn Fn(Val) -> Out) -> Out {
    let Some(((k, opt), rest)) = keys.split_first() else {
        return f(v);
    };
    // `map_index` speaks jaq's exceptions: ours go through it as an error, and come back
    // out of this cell.
    let stop = std::cell::Cell::new(None);
    let result = v.map_index(k, *opt, |x| {
        let y = match update(x, rest, f) {
            Ok(y) => y.map(Ok),
            Err(s) => {
                stop.set(Some(s));
                Some(Err(Exn::from(jaq_core::Error::str("direct"))))
            }
        };
        y.into_iter()
    });
    match (result, stop.get()) {
        (_, Some(s)) => Err(s),
        (Ok(y), None) => Ok(Some(y)),
        (Err(_), None) => Err(Stop::Error),
    }
}

impl Builtin {
    fn run(&self, v: Val) -> Out {
        let ctx = Ctx::<JustLut<Val>>::new(&self.filter.lut, Vars::new([]));
        let mut outs = self.filter.id.run((ctx, v)).map(jaq_core::unwrap_valr);
        match (outs.next(), outs.next()) {
            (None, _) => Ok(None),
            (Some(Ok(y)), None) => Ok(Some(y)),
            (Some(Err(_)), _) => Err(Stop::Error),
            (Some(Ok(_)), Some(_)) => Err(Stop::Unsure),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::transform::json::{parse_json, write_compact};
    use proptest::prelude::*;

    fn builtin(text: &str) -> Option<jaq_core::Filter<JustLut<Val>>> {
        super::super::compile_filter(text, &[]).ok()
    }

    fn direct(code: &str) -> Option<Direct> {
        Direct::compile(code, &builtin)
    }

    fn text(v: &Val) -> String {
        let mut buf = Vec::new();
        write_compact(&mut buf, &Default::default(), v);
        String::from_utf8_lossy(&buf).into_owned()
    }

    /// jaq's outputs for `input`, each as text or as its error.
    fn jaq(code: &str, input: &[u8]) -> Vec<Result<String, String>> {
        let filter = super::super::compile_filter(code, &[]).unwrap();
        let ctx = Ctx::<JustLut<Val>>::new(&filter.lut, Vars::new([]));
        let v = parse_json(input).unwrap();
        filter
            .id
            .run((ctx, v))
            .map(jaq_core::unwrap_valr)
            .map(|r| r.map(|v| text(&v)).map_err(|e| e.to_string()))
            .collect()
    }

    /// Runs `code` both ways on `input`: the same outputs when the direct program decides,
    /// an error from jaq when it says jq raised one. Whether it decided.
    fn same(code: &str, input: &[u8]) -> bool {
        let d = direct(code).unwrap_or_else(|| panic!("{code} is not direct"));
        let want = jaq(code, input);
        match d.run(parse_json(input).unwrap()) {
            Ok(outs) => {
                let got: Vec<Result<String, String>> = outs.iter().map(|v| Ok(text(v))).collect();
                assert_eq!(got, want, "{code} on {}", String::from_utf8_lossy(input));
                true
            }
            Err(Stop::Error) => {
                assert!(
                    want.iter().any(Result::is_err),
                    "{code} on {}: direct says error, jaq gives {want:?}",
                    String::from_utf8_lossy(input)
                );
                false
            }
            Err(Stop::Unsure) => false,
        }
    }

    /// Programs the direct path runs, each something a pipeline does.
    const PROGRAMS: &[&str] = &[
        ".",
        ".a",
        ".a.b",
        ".a?",
        ".[0]",
        ".dt = (.ts / 1000 | todate) | .hr = (.ts / 3600000 | floor % 24) | del(.drop)",
        ".a = 1",
        ".a.b = .n",
        ".n += 1",
        ".n -= .m",
        ".n *= 2",
        ".a //= \"default\"",
        ".s |= ascii_downcase",
        ".n |= . + 1",
        ".a |= empty",
        "del(.a)",
        "del(.a, .n)",
        "del(.a.b)",
        "del(.missing)",
        "{id: .n, name: .s}",
        "{n, s}",
        "{\"quoted key\": .a, (.s): 1}",
        "{a: .a, a: .n}",
        "[.a, .n, .missing]",
        "[]",
        "[.n, empty, .m]",
        "select(.n > 1)",
        "select(.s == \"x\")",
        "select(.a != null and .n < 10)",
        "select(.a == null or .n >= 2)",
        "select(.flag | not)",
        "if .n > 1 then \"big\" elif .n == 1 then \"one\" else \"small\" end",
        "if .flag then .a end",
        ".a // .n // 0",
        "-.n",
        ".n % 7",
        ".n / 3",
        ".n * .m - 1",
        ".s + \"-\" + .s",
        ".a + .n",
        ".n | tostring",
        ".s | length",
        ".s | test(\"x\")",
        ".s | split(\"-\")",
        ".s | ltrimstr(\"a\")",
        "keys",
        ".n | floor",
        ".ts | todate",
        "try .s.x",
        ".s.x?",
        ".a, .n",
        "empty",
        "null",
        "true, false",
        ".big + 1",
        ".dec * 2",
        ".dec",
        "\"\\u00e9\\n\\\"\"",
        "1.50",
        "12345678901234567890",
        "{a: 1} + {b: 2}",
        ".n == 1.0",
        ".nested.x.y |= 3",
        ".nested.x = {}",
        "range(3)",
        "{(.n): 1}",
        // An empty left side: jaq never runs the right one (nor its error).
        "try [empty + .a.b]",
        "try (((.n | select(. > 0)) * .m.k) // 0)",
        "try (.a |= (empty + .b.c))",
        "try [{(empty): .a.b}]",
        "try [(empty) == .a.b]",
        "try [{a: empty, b: .a.b}]",
        "@base64",
    ];

    /// Programs the direct path leaves to jaq whole.
    const NOT_DIRECT_PROGRAMS: &[&str] = &[
        ". as $x | $x",
        "def f: .; f",
        "[.[] | .]",
        "reduce .[] as $x (0; . + 1)",
        "$__loc__",
        ".s | error",
        "input",
        ".s | \"\\(.)!\"",
        "$key",
        "{$topic}",
        "try .a catch .",
        ".a[1:]",
        "map(.a)",
    ];

    const INPUTS: &[&str] = &[
        r#"{"seq":123456,"ts":1764460800123,"us":1764460800123456,"user":"u456","amount":56.78,"drop":"xxxx"}"#,
        r#"{"a":{"b":1,"c":[1,2]},"n":3,"m":2,"s":"a-x-b","flag":true,"big":12345678901234567890,"dec":1.50,"ts":1764460800,"drop":null}"#,
        r#"{"a":null,"n":1,"m":0,"s":"","flag":false,"nested":{"x":{}}}"#,
        r#"{"n":-2.5,"m":1e300,"s":"ÉTÉ\n\u0000\"","a":[1,2,3]}"#,
        r#"{"n":"text","s":5,"a":"str"}"#,
        r#"{}"#,
        r#"[1,2,3]"#,
        r#"null"#,
        r#"42"#,
        r#""just a string""#,
        r#"{"n":9223372036854775807,"m":-1,"s":"A","ts":-1}"#,
        r#"{"drop":1,"a":2,"b":3,"n":0,"m":0}"#,
        r#"{"a":1,"n":-1,"m":5}"#,
    ];

    #[test]
    fn the_direct_path_gives_jaqs_outputs() {
        let mut decided = 0;
        for code in PROGRAMS {
            for input in INPUTS {
                decided += usize::from(same(code, input.as_bytes()));
            }
        }
        // Most pairs are decided here, not handed to jaq (else this tests little).
        let pairs = PROGRAMS.len() * INPUTS.len();
        assert!(decided * 2 > pairs, "{decided} of {pairs} decided");
    }

    #[test]
    fn programs_outside_the_shape_are_left_to_jaq() {
        for code in NOT_DIRECT_PROGRAMS {
            assert!(direct(code).is_none(), "{code}");
        }
    }

    #[test]
    fn the_benchmarks_enrichment_is_decided_directly() {
        let code = ".dt = (.ts / 1000 | todate) | .hr = (.ts / 3600000 | floor % 24) | del(.drop)";
        assert!(same(code, INPUTS[0].as_bytes()));
        assert!(same("{id: .seq, user}", INPUTS[0].as_bytes()));
        assert!(same("select(.amount > 10)", INPUTS[0].as_bytes()));
    }

    /// A builtin with several outputs is jaq's: the record goes there.
    #[test]
    fn several_outputs_of_a_builtin_are_unsure() {
        let d = direct("range(3)").unwrap();
        assert_eq!(d.run(Val::Null).unwrap_err(), Stop::Unsure);
        let d = direct("{(.n): 1}").unwrap();
        assert_eq!(
            d.run(parse_json(br#"{"n":1}"#).unwrap()).unwrap_err(),
            Stop::Unsure
        );
    }

    fn scalar() -> impl Strategy<Value = String> {
        prop_oneof![
            Just("null".to_string()),
            any::<bool>().prop_map(|b| b.to_string()),
            any::<i64>().prop_map(|n| n.to_string()),
            (-1e6f64..1e6).prop_map(|f| format!("{f}")),
            any::<f64>()
                .prop_filter("finite", |f| f.is_finite())
                .prop_map(|f| format!("{f:e}")),
            "[1-9][0-9]{18,24}",
            "-?[1-9][0-9]{0,2}\\.[0-9]{1,4}0",
            "[a-zA-Z0-9 _\\-éü🐢]{0,8}".prop_map(|s| serde_json::to_string(&s).unwrap()),
            Just(r#""with \"escapes\" \\ \n \u0001""#.to_string()),
        ]
    }

    fn document() -> impl Strategy<Value = String> {
        let field = prop_oneof![
            Just("a"),
            Just("n"),
            Just("m"),
            Just("s"),
            Just("flag"),
            Just("ts"),
            Just("drop"),
            Just("nested"),
            Just("x"),
        ];
        let value = scalar().prop_recursive(2, 8, 4, |inner| {
            prop_oneof![
                prop::collection::vec(inner.clone(), 0..4)
                    .prop_map(|v| format!("[{}]", v.join(","))),
                prop::collection::vec(("[abnx]", inner), 0..4).prop_map(|kv| {
                    let fields: Vec<String> = kv
                        .into_iter()
                        .map(|(k, v)| format!("\"{k}\":{v}"))
                        .collect();
                    format!("{{{}}}", fields.join(","))
                }),
            ]
        });
        prop_oneof![
            4 => prop::collection::vec((field, value), 0..8).prop_map(|kv| {
                let fields: Vec<String> =
                    kv.into_iter().map(|(k, v)| format!("\"{k}\":{v}")).collect();
                format!("{{{}}}", fields.join(","))
            }),
            1 => scalar(),
        ]
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(300))]
        #[test]
        fn any_document_gives_jaqs_outputs(doc in document(), which in 0..PROGRAMS.len()) {
            same(PROGRAMS[which], doc.as_bytes());
        }
    }
}
