//! JSON in and out of the jq transform: the reader, which refuses nesting deep enough to
//! overflow the stack before it parses, and a compact writer.

use std::io::Write as _;

use jaq_json::{Num, Val};

use super::{Reason, TransformError};

/// JSON nested deeper than this is refused before parsing: the parser, the interpreter and the
/// writer recurse, and a hostile record must not overflow the stack.
const MAX_DEPTH: usize = 512;

/// Parses a record value, refusing pathological nesting first.
pub(super) fn parse_json(bytes: &[u8]) -> Result<Val, TransformError> {
    if bytes.len() > MAX_DEPTH && nesting_exceeds(bytes, MAX_DEPTH) {
        return Err(TransformError::new(
            Reason::NotJson,
            format!("JSON nested deeper than {MAX_DEPTH} levels"),
        ));
    }
    jaq_json::read::parse_single(bytes)
        .map_err(|e| TransformError::new(Reason::NotJson, format!("value is not JSON: {e}")))
}

/// True when brackets outside strings nest deeper than `limit`.
fn nesting_exceeds(bytes: &[u8], limit: usize) -> bool {
    let (mut depth, mut in_string, mut escaped) = (0usize, false, false);
    for &b in bytes {
        if in_string {
            match b {
                _ if escaped => escaped = false,
                b'\\' => escaped = true,
                b'"' => in_string = false,
                _ => {}
            }
            continue;
        }
        match b {
            b'"' => in_string = true,
            b'[' | b'{' => {
                depth += 1;
                if depth > limit {
                    return true;
                }
            }
            b']' | b'}' => depth = depth.saturating_sub(1),
            _ => {}
        }
    }
    false
}

/// Compact JSON, byte for byte what `jaq_json::write::write` writes with the default printer,
/// without its per-token `fmt` calls and dynamic dispatch (the largest cost of an identity
/// program in the profile; see BENCHMARKS.md). Byte strings and big integers still go
/// through jaq's own writer.
pub(super) fn write_compact(buf: &mut Vec<u8>, pp: &jaq_json::write::Pp, v: &Val) {
    match v {
        Val::Null => buf.extend_from_slice(b"null"),
        Val::Bool(true) => buf.extend_from_slice(b"true"),
        Val::Bool(false) => buf.extend_from_slice(b"false"),
        Val::TStr(s) => write_str(buf, s),
        Val::Arr(a) => {
            buf.push(b'[');
            for (i, x) in a.iter().enumerate() {
                if i > 0 {
                    buf.push(b',');
                }
                write_compact(buf, pp, x);
            }
            buf.push(b']');
        }
        Val::Obj(o) => {
            buf.push(b'{');
            for (i, (k, x)) in o.iter().enumerate() {
                if i > 0 {
                    buf.push(b',');
                }
                write_compact(buf, pp, k);
                buf.push(b':');
                write_compact(buf, pp, x);
            }
            buf.push(b'}');
        }
        Val::Num(n) => write_num(buf, n),
        // Writing to a Vec cannot fail.
        Val::BStr(_) => {
            let _ = jaq_json::write::write(buf, pp, 0, v);
        }
    }
}

/// A number as jaq's `Display` writes it (`Infinity` and `NaN` too), without going through
/// `fmt` for the kinds records carry: integers by `itoa`, floats by `ryu` as jaq does, decimals
/// as they were read.
fn write_num(buf: &mut Vec<u8>, n: &Num) {
    match n {
        Num::Int(i) => buf.extend_from_slice(itoa::Buffer::new().format(*i).as_bytes()),
        Num::Dec(d) => buf.extend_from_slice(d.as_bytes()),
        Num::Float(f) if f.is_finite() => {
            buf.extend_from_slice(ryu::Buffer::new().format_finite(*f).as_bytes())
        }
        // Writing to a Vec cannot fail.
        _ => {
            let _ = write!(buf, "{n}");
        }
    }
}

/// A JSON string: the escapes jaq writes, other bytes as they are.
fn write_str(buf: &mut Vec<u8>, s: &[u8]) {
    buf.push(b'"');
    let mut start = 0;
    for (i, &c) in s.iter().enumerate() {
        let escape: &[u8] = match c {
            b'"' => b"\\\"",
            b'\\' => b"\\\\",
            b'\n' => b"\\n",
            b'\r' => b"\\r",
            b'\t' => b"\\t",
            0x08 => b"\\b",
            0x0c => b"\\f",
            0x00..=0x1f | 0x7f => b"",
            _ => continue,
        };
        buf.extend_from_slice(&s[start..i]);
        if escape.is_empty() {
            const HEX: &[u8; 16] = b"0123456789abcdef";
            buf.extend_from_slice(b"\\u00");
            buf.push(HEX[usize::from(c >> 4)]);
            buf.push(HEX[usize::from(c & 0xf)]);
        } else {
            buf.extend_from_slice(escape);
        }
        start = i + 1;
    }
    buf.extend_from_slice(&s[start..]);
    buf.push(b'"');
}

#[cfg(test)]
mod tests {
    use super::*;

    fn jaq_writes(v: &Val) -> Vec<u8> {
        let mut buf = Vec::new();
        jaq_json::write::write(&mut buf, &Default::default(), 0, v).unwrap();
        buf
    }

    #[test]
    fn the_compact_writer_writes_what_jaq_writes() {
        let docs: &[&[u8]] = &[
            br#"{"seq":1,"ts":1764460800123,"user":"u1","amount":12.5,"drop":"xx","t":true,"f":false,"n":null}"#,
            br#"[1,-2,3.25,1e300,-0.0,12345678901234567890123,0.1,1E-7,[],{},[[{}]],{"a":{"b":[1,{"c":[]}]}}]"#,
            br#""quote \" backslash \\ slash \/ nl \n cr \r tab \t bs \b ff \f nul \u0000 us \u001f del \u007f""#,
            r#"{"unicode":"żółw 🐢 \u00e9","key with \"quotes\"":"v","":""}"#.as_bytes(),
            br#"123"#,
            br#""""#,
        ];
        for doc in docs {
            let v = parse_json(doc).unwrap();
            let mut mine = Vec::new();
            write_compact(&mut mine, &Default::default(), &v);
            assert_eq!(
                String::from_utf8_lossy(&mine),
                String::from_utf8_lossy(&jaq_writes(&v))
            );
        }
        // Every single byte in a string, invalid UTF-8 included; and numbers jq computes.
        let all: Vec<u8> = (0..=255u8).collect();
        for v in [
            Val::utf8_str(all),
            Val::from(f64::NAN),
            Val::from(f64::INFINITY),
            Val::from(-1.5e-300),
            Val::from(isize::MIN),
            Val::from(f64::NEG_INFINITY),
            Val::from(1764460800.123),
            Val::from(0.1 + 0.2),
            Val::from(1e21),
            Val::from(123456789.0),
            Val::from(-0.0),
        ] {
            let mut mine = Vec::new();
            write_compact(&mut mine, &Default::default(), &v);
            assert_eq!(mine, jaq_writes(&v));
        }
    }

    #[test]
    fn nesting_scan() {
        assert!(!nesting_exceeds(b"[[[]]]", 3));
        assert!(nesting_exceeds(b"[[[[]]]]", 3));
        assert!(!nesting_exceeds(br#"["\"[[[[", 1]"#, 1));
    }
}
