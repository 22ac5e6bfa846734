//! Talking to a running exactly's HTTP endpoints: a plain GET, and reading metric samples
//! out of `/metrics`.

#![allow(dead_code)]

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

/// GET `path` from `addr`: (status, body).
pub fn get(addr: &str, path: &str) -> Option<(u16, String)> {
    request(addr, "GET", path, "")
}

/// POST `body` (JSON) to `path` at `addr`: (status, body).
pub fn post(addr: &str, path: &str, body: &str) -> Option<(u16, String)> {
    request(addr, "POST", path, body)
}

/// One HTTP/1.1 request by hand, to need no client crate.
fn request(addr: &str, method: &str, path: &str, body: &str) -> Option<(u16, String)> {
    let mut s = TcpStream::connect(addr).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    write!(
        s,
        "{method} {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\
         Content-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    )
    .ok()?;
    let mut raw = String::new();
    s.read_to_string(&mut raw).ok()?;
    let status = raw.split_whitespace().nth(1)?.parse().ok()?;
    let body = raw
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_string())
        .unwrap_or_default();
    Some((status, body))
}

/// The values of a metric's samples whose labels contain every `label=value` given.
pub fn samples(text: &str, name: &str, labels: &[(&str, &str)]) -> Vec<f64> {
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| l.rsplit_once(' '))
        .filter(|(series, _)| {
            let (n, rest) = series.split_once('{').unwrap_or((series, ""));
            n == name
                && labels
                    .iter()
                    .all(|(k, v)| rest.contains(&format!("{k}=\"{v}\"")))
        })
        .map(|(_, v)| v.parse::<f64>().unwrap())
        .collect()
}

/// Sum of a metric's matching samples.
pub fn metric(text: &str, name: &str, labels: &[(&str, &str)]) -> f64 {
    samples(text, name, labels).iter().sum()
}

/// The value of one series: at most one may match.
pub fn sample(text: &str, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
    let found = samples(text, name, labels);
    assert!(found.len() <= 1, "{name} {labels:?}: {found:?}");
    found.first().copied()
}
