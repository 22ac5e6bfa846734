//! Header names as bytes: a small safe wrapper over two librdkafka calls.
//!
//! Kafka header names are byte strings on the wire, and producers outside Java write names
//! that are not UTF-8. rust-rdkafka reads names as `&str` and panics on such a name
//! (`Headers::try_get` unwraps `CStr::to_str`), and `OwnedHeaders::insert` only takes `&str`
//! names. exactly reads and writes every header through this module instead, so no header a
//! producer can write stops the loop or the audit.
//!
//! librdkafka hands a name back as a NUL-terminated string without its length, so a name with
//! a NUL byte inside reads as the bytes before the first NUL (and is written on that way).

use std::ffi::{CStr, c_char, c_void};

use rdkafka::message::{BorrowedHeaders, OwnedHeaders};
use rdkafka_sys as rdsys;

/// One header: name and value bytes (`None`: a header without a value).
pub type Header<'a> = (&'a [u8], Option<&'a [u8]>);

/// The native handle behind `h`. rust-rdkafka's `BorrowedHeaders` is a zero-sized type whose
/// address *is* the `rd_kafka_headers_t` pointer (its own `as_native_ptr` is this cast); the
/// round-trip tests below fail if that ever changes.
fn native(h: &BorrowedHeaders) -> *mut rdsys::rd_kafka_headers_t {
    h as *const BorrowedHeaders as *mut rdsys::rd_kafka_headers_t
}

/// Every header of `h`, in order, names as bytes.
pub fn iter(h: &BorrowedHeaders) -> impl Iterator<Item = Header<'_>> {
    let ptr = native(h);
    // SAFETY: `ptr` is alive as long as `h` is borrowed; the count is read once.
    let count = unsafe { rdsys::rd_kafka_header_cnt(ptr) };
    (0..count).filter_map(move |idx| {
        let mut name: *const c_char = std::ptr::null();
        let mut value: *const c_void = std::ptr::null();
        let mut size = 0usize;
        // SAFETY: out-pointers are valid locals; librdkafka sets them to memory owned by the
        // headers, which outlive the returned slices (tied to `h`'s borrow).
        let err =
            unsafe { rdsys::rd_kafka_header_get_all(ptr, idx, &mut name, &mut value, &mut size) };
        if err != rdsys::rd_kafka_resp_err_t::RD_KAFKA_RESP_ERR_NO_ERROR || name.is_null() {
            return None;
        }
        // SAFETY: librdkafka stores every name NUL-terminated; a value of `size` bytes, or null.
        let name = unsafe { CStr::from_ptr(name) }.to_bytes();
        let value = (!value.is_null())
            .then(|| unsafe { std::slice::from_raw_parts(value.cast::<u8>(), size) });
        Some((name, value))
    })
}

/// The headers of a message, names as bytes (empty when it has none).
pub fn of<M: rdkafka::Message<Headers = BorrowedHeaders>>(m: &M) -> Vec<Header<'_>> {
    m.headers().map(|h| iter(h).collect()).unwrap_or_default()
}

/// Adds a header whose name is any bytes (up to a NUL byte, as it would be read back: so that
/// what is counted against the size limit is what is sent).
pub fn add(h: OwnedHeaders, name: &[u8], value: Option<&[u8]>) -> OwnedHeaders {
    let name = name.split(|b| *b == 0).next().unwrap_or_default();
    let ptr = native(h.as_borrowed());
    let (vptr, vlen) = match value {
        Some(v) => (v.as_ptr().cast::<c_void>(), v.len() as isize),
        None => (std::ptr::null(), 0),
    };
    // SAFETY: `h` is owned here, so nothing else reads the headers while one is added;
    // librdkafka copies name and value. It only fails on read-only headers (those of a
    // message it produced), which an `OwnedHeaders` never is.
    let err = unsafe {
        rdsys::rd_kafka_header_add(
            ptr,
            name.as_ptr().cast::<c_char>(),
            name.len() as isize,
            vptr,
            vlen,
        )
    };
    debug_assert_eq!(err, rdsys::rd_kafka_resp_err_t::RD_KAFKA_RESP_ERR_NO_ERROR);
    h
}

/// librdkafka's headers holding `headers` (`count`: how many there are, for the capacity).
pub fn owned<'h>(count: usize, headers: impl Iterator<Item = Header<'h>>) -> OwnedHeaders {
    let mut h = OwnedHeaders::new_with_capacity(count);
    for (name, value) in headers {
        h = add(h, name, value);
    }
    h
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_and_values_round_trip_as_bytes() {
        let pairs: [Header<'_>; 5] = [
            (b"\xff\xfe not utf-8", Some(b"v")),
            (b"", Some(b"empty name")),
            (b"no value", None),
            (b"empty value", Some(b"")),
            ("ünïcode".as_bytes(), Some(&[0, 159, 146, 150, 255])),
        ];
        let mut h = OwnedHeaders::new();
        for (n, v) in pairs {
            h = add(h, n, v);
        }
        let back: Vec<_> = iter(h.as_borrowed()).collect();
        assert_eq!(back, pairs);
        // A copy (what librdkafka does to a message's headers) reads the same.
        let copy = h.clone();
        assert_eq!(iter(copy.as_borrowed()).collect::<Vec<_>>(), pairs);
    }

    #[test]
    fn a_name_is_read_up_to_its_first_nul() {
        let h = add(OwnedHeaders::new(), b"a\0b", Some(b"v"));
        assert_eq!(
            iter(h.as_borrowed()).collect::<Vec<_>>(),
            [(&b"a"[..], Some(&b"v"[..]))]
        );
    }
}
