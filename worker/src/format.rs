//! Kafka key/value formats: raw record bytes to jq values and back.
//!
//! Every record key and value is decoded into a [`Val`] before any jq expression sees it and
//! encoded again before it is produced or stored, so both directions sit on the per-record hot
//! path: JSON is parsed by jaq-json's own parser straight into [`Val`] (no `serde_json::Value`
//! detour) and written by a small encoder straight into the output buffer.
//!
//! | format   | bytes                          | jq value                                   |
//! |----------|--------------------------------|--------------------------------------------|
//! | `string` | UTF-8 text                     | string (non-strings are written as JSON)   |
//! | `json`   | JSON text                      | the JSON value                             |
//! | `i64`    | 8-byte big-endian signed       | integer (Kafka's `LongSerializer`)         |
//! | `bytes`  | anything                       | array of integers 0..=255 (strings: UTF-8) |
//!
//! JSON is written compactly and always valid, the way jq prints it: `nan` as `null`,
//! `±infinite` as `±1.7976931348623157e+308`, integral floats without a fraction (`3`, not
//! `3.0`), number literals read from the input unchanged (`1.10` stays `1.10`), invalid UTF-8 in
//! strings replaced by U+FFFD. Decoding accepts jaq's JSON superset (`NaN`, `Infinity`,
//! `#` comments) but rejects invalid UTF-8 and nesting deeper than [`MAX_DEPTH`], which would
//! otherwise overflow the stack of the recursive parser on one hostile record.

use std::borrow::Cow;

use eddy_crds::Format;
pub use jaq_json::Val;
use jaq_json::{Num, read};

/// Deepest array/object nesting accepted when decoding or encoding JSON; deeper input is
/// rejected instead of risking a stack overflow, which would abort the whole worker. At this
/// depth the most stack-hungry jq builtins (`tojson`, `walk`) need about 0.5 MiB optimised and
/// 1 MiB unoptimised, well inside the 2 MiB stack of a tokio worker thread.
pub const MAX_DEPTH: usize = 256;

/// Longest rendering of a value quoted in an error message.
const MAX_QUOTE: usize = 80;

/// Why bytes could not be read as, or a value could not be written as, a format.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FormatError {
    /// `string` or `json` input that is not UTF-8.
    #[error("not valid UTF-8 at byte {0}")]
    Utf8(usize),
    /// `json` input that does not parse, e.g. "expected value at line 1 column 3".
    #[error("not valid JSON: {0}")]
    Json(String),
    /// `json` input nested deeper than [`MAX_DEPTH`].
    #[error("not accepted as JSON: nested deeper than {MAX_DEPTH} levels")]
    TooDeep,
    /// `i64` input of the wrong length.
    #[error("i64 needs exactly 8 bytes, got {0}")]
    I64Length(usize),
    /// `windowed` used for something that is not a windowed key (validation refuses it).
    #[error("windowed is the format of a windowed key, only for to.key after a window")]
    NotWindowed,
    /// A value the format cannot represent.
    #[error("cannot write {value} as {format}: {reason}")]
    Encode {
        /// The value, shortened to about 80 characters.
        value: String,
        format: &'static str,
        reason: String,
    },
}

/// Reads record bytes in `format` as a jq value.
pub fn decode(format: Format, bytes: &[u8]) -> Result<Val, FormatError> {
    match format {
        Format::String => {
            check_utf8(bytes)?;
            Ok(Val::utf8_str(bytes.to_vec()))
        }
        Format::Json => decode_json(bytes),
        Format::Bytes => Ok(bytes.iter().map(|&b| Val::from(usize::from(b))).collect()),
        Format::I64 => {
            let array: [u8; 8] = bytes
                .try_into()
                .map_err(|_| FormatError::I64Length(bytes.len()))?;
            Ok(Val::Num(Num::from_integral(i64::from_be_bytes(array))))
        }
        Format::Windowed => Err(FormatError::NotWindowed),
    }
}

/// Writes a jq value as record bytes in `format`.
pub fn encode(format: Format, v: &Val) -> Result<Vec<u8>, FormatError> {
    match format {
        Format::String => match v {
            Val::TStr(s) | Val::BStr(s) => Ok(match String::from_utf8_lossy(s) {
                Cow::Borrowed(text) => text.as_bytes().to_vec(),
                Cow::Owned(text) => text.into_bytes(),
            }),
            _ => encode_json(v, format),
        },
        Format::Json => encode_json(v, format),
        Format::Bytes => encode_bytes(v),
        Format::I64 => {
            let n = integer(v).map_err(|reason| encode_error(v, format, reason))?;
            Ok(n.to_be_bytes().to_vec())
        }
        Format::Windowed => Err(FormatError::NotWindowed),
    }
}

/// The lowercase name used in manifests, for messages.
fn name(format: Format) -> &'static str {
    match format {
        Format::String => "string",
        Format::Json => "json",
        Format::Bytes => "bytes",
        Format::I64 => "i64",
        Format::Windowed => "windowed",
    }
}

fn encode_error(v: &Val, format: Format, reason: impl Into<String>) -> FormatError {
    FormatError::Encode {
        value: quote(v),
        format: name(format),
        reason: reason.into(),
    }
}

/// The value's JSON-like rendering, cut at [`MAX_QUOTE`] characters so errors stay readable.
fn quote(v: &Val) -> String {
    shorten(v, MAX_QUOTE)
}

/// `x` rendered with `Display` and cut at `max` characters (marked with '…').
///
/// Rendering stops where the cut is, so a huge value costs no more than `max` characters,
/// and a value nested deeper than anything the decoder accepts (jq can build one) recurses
/// at most `max` levels: every level prints a bracket before it descends.
pub(crate) fn shorten(x: &(impl std::fmt::Display + ?Sized), max: usize) -> String {
    struct Limited {
        out: String,
        room: usize,
        cut: bool,
    }
    impl std::fmt::Write for Limited {
        fn write_str(&mut self, s: &str) -> std::fmt::Result {
            for c in s.chars() {
                if self.room == 0 {
                    self.cut = true;
                    return Err(std::fmt::Error);
                }
                self.out.push(c);
                self.room -= 1;
            }
            Ok(())
        }
    }
    let mut w = Limited {
        out: String::new(),
        room: max,
        cut: false,
    };
    // An error here is the cut (or a Display that failed: keep what it wrote).
    let _ = std::fmt::write(&mut w, format_args!("{x}"));
    if w.cut {
        w.out.push('…');
    }
    w.out
}

fn check_utf8(bytes: &[u8]) -> Result<(), FormatError> {
    std::str::from_utf8(bytes)
        .map(drop)
        .map_err(|e| FormatError::Utf8(e.valid_up_to()))
}

fn decode_json(bytes: &[u8]) -> Result<Val, FormatError> {
    check_utf8(bytes)?;
    // Nesting deeper than MAX_DEPTH needs more than MAX_DEPTH bytes, so short records skip the scan.
    if bytes.len() > MAX_DEPTH && nesting_exceeds(bytes, MAX_DEPTH) {
        return Err(FormatError::TooDeep);
    }
    read::parse_single(bytes).map_err(|e| FormatError::Json(json_message(bytes, &e.to_string())))
}

/// True if brackets outside strings and comments nest deeper than `max`. Cheaper than the
/// parse it guards, and must read the text as jaq's reader does: a `#` outside a string starts
/// a comment up to the end of the line, and a quote in one would otherwise hide what follows.
pub(crate) fn nesting_exceeds(bytes: &[u8], max: usize) -> bool {
    let (mut depth, mut in_string, mut escaped, mut in_comment) = (0usize, false, false, false);
    for &b in bytes {
        if in_comment {
            in_comment = b != b'\n';
            continue;
        }
        if in_string {
            if escaped {
                escaped = false;
            } else if b == b'\\' {
                escaped = true;
            } else if b == b'"' {
                in_string = false;
            }
            continue;
        }
        match b {
            b'"' => in_string = true,
            b'#' => in_comment = true,
            b'[' | b'{' => {
                depth += 1;
                if depth > max {
                    return true;
                }
            }
            b']' | b'}' => depth = depth.saturating_sub(1),
            _ => {}
        }
    }
    false
}

/// True if arrays and objects in `v` nest deeper than `max`; without recursion, as `v` may
/// come from jq, which can build values of any depth.
pub(crate) fn depth_exceeds(v: &Val, max: usize) -> bool {
    let mut todo = vec![(v, 0usize)];
    while let Some((v, depth)) = todo.pop() {
        let children: Box<dyn Iterator<Item = &Val>> = match v {
            Val::Arr(a) => Box::new(a.iter()),
            Val::Obj(o) => Box::new(o.iter().flat_map(|(k, v)| [k, v])),
            _ => continue,
        };
        if depth == max {
            return true;
        }
        todo.extend(children.map(|c| (c, depth + 1)));
    }
    false
}

/// Turns jaq's "byte offset N: what" into "what at line L column C" (column in characters).
fn json_message(bytes: &[u8], jaq: &str) -> String {
    let parsed = jaq
        .strip_prefix("byte offset ")
        .and_then(|rest| rest.split_once(": "))
        .and_then(|(n, what)| Some((n.parse::<usize>().ok()?, what)));
    let Some((offset, what)) = parsed else {
        return jaq.to_owned();
    };
    let before = &bytes[..offset.min(bytes.len())];
    let line_start = before
        .iter()
        .rposition(|&b| b == b'\n')
        .map_or(0, |i| i + 1);
    let line = before.iter().filter(|&&b| b == b'\n').count() + 1;
    // Count characters, not bytes: skip UTF-8 continuation bytes.
    let column = before[line_start..]
        .iter()
        .filter(|&&b| b & 0xc0 != 0x80)
        .count()
        + 1;
    format!("{what} at line {line} column {column}")
}

fn encode_json(v: &Val, format: Format) -> Result<Vec<u8>, FormatError> {
    let mut out = Vec::with_capacity(128);
    write_json(&mut out, v, 0).map_err(|reason| encode_error(v, format, reason))?;
    Ok(out)
}

/// Appends `v` as compact JSON; the error is the reason, the caller adds the value.
fn write_json(out: &mut Vec<u8>, v: &Val, depth: usize) -> Result<(), String> {
    match v {
        Val::Null => out.extend_from_slice(b"null"),
        Val::Bool(true) => out.extend_from_slice(b"true"),
        Val::Bool(false) => out.extend_from_slice(b"false"),
        Val::Num(n) => write_num(out, n),
        Val::TStr(s) | Val::BStr(s) => write_str(out, s),
        Val::Arr(a) => {
            if depth == MAX_DEPTH {
                return Err(format!("nested deeper than {MAX_DEPTH} levels"));
            }
            out.push(b'[');
            for (i, x) in a.iter().enumerate() {
                if i > 0 {
                    out.push(b',');
                }
                write_json(out, x, depth + 1)?;
            }
            out.push(b']');
        }
        Val::Obj(o) => {
            if depth == MAX_DEPTH {
                return Err(format!("nested deeper than {MAX_DEPTH} levels"));
            }
            out.push(b'{');
            for (i, (k, x)) in o.iter().enumerate() {
                if i > 0 {
                    out.push(b',');
                }
                match k {
                    Val::TStr(s) | Val::BStr(s) => write_str(out, s),
                    _ => return Err(format!("object key {} is not a string", quote(k))),
                }
                out.push(b':');
                write_json(out, x, depth + 1)?;
            }
            out.push(b'}');
        }
    }
    Ok(())
}

/// Writes a number the way jq prints it, always as valid JSON.
fn write_num(out: &mut Vec<u8>, n: &Num) {
    use std::io::Write as _;
    // Writing into a Vec cannot fail.
    let _ = match n {
        Num::Int(i) => write!(out, "{i}"),
        Num::BigInt(i) => write!(out, "{i}"),
        Num::Float(f) if f.is_nan() => write!(out, "null"),
        Num::Float(f) if f.is_infinite() => {
            let sign = if *f < 0.0 { "-" } else { "" };
            write!(out, "{sign}1.7976931348623157e+308")
        }
        // Below 1e17 every integral f64 prints exactly as an integer, as jq does.
        Num::Float(f) if f.fract() == 0.0 && f.abs() < 1e17 => write!(out, "{}", *f as i64),
        Num::Float(_) => write!(out, "{n}"),
        // Literals keep their text (jq 1.7 does too) unless it is not valid JSON, e.g. "+1.5".
        Num::Dec(s) if is_json_number(s) => write!(out, "{s}"),
        Num::Dec(s) => match s.parse::<f64>() {
            Ok(f) => {
                write_num(out, &Num::Float(f));
                Ok(())
            }
            Err(_) => write!(out, "null"),
        },
    };
}

/// Strict JSON number grammar: `-?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?`.
fn is_json_number(s: &str) -> bool {
    fn digits(b: &[u8]) -> usize {
        b.iter().take_while(|c| c.is_ascii_digit()).count()
    }
    let b = s.as_bytes();
    let mut i = usize::from(b.first() == Some(&b'-'));
    match b.get(i) {
        Some(b'0') => i += 1,
        Some(b'1'..=b'9') => i += digits(&b[i..]),
        _ => return false,
    }
    if b.get(i) == Some(&b'.') {
        let n = digits(&b[i + 1..]);
        if n == 0 {
            return false;
        }
        i += 1 + n;
    }
    if matches!(b.get(i), Some(b'e' | b'E')) {
        i += 1;
        if matches!(b.get(i), Some(b'+' | b'-')) {
            i += 1;
        }
        let n = digits(&b[i..]);
        if n == 0 {
            return false;
        }
        i += n;
    }
    i == b.len()
}

/// Writes a JSON string, escaping like jq; invalid UTF-8 becomes U+FFFD.
fn write_str(out: &mut Vec<u8>, s: &[u8]) {
    let text = String::from_utf8_lossy(s);
    let s = text.as_bytes();
    out.reserve(s.len() + 2);
    out.push(b'"');
    let mut start = 0;
    for (i, &b) in s.iter().enumerate() {
        let escape: &[u8] = match b {
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
        out.extend_from_slice(&s[start..i]);
        if escape.is_empty() {
            const HEX: &[u8; 16] = b"0123456789abcdef";
            out.extend_from_slice(b"\\u00");
            out.push(HEX[usize::from(b >> 4)]);
            out.push(HEX[usize::from(b & 0xf)]);
        } else {
            out.extend_from_slice(escape);
        }
        start = i + 1;
    }
    out.extend_from_slice(&s[start..]);
    out.push(b'"');
}

fn encode_bytes(v: &Val) -> Result<Vec<u8>, FormatError> {
    match v {
        Val::TStr(s) | Val::BStr(s) => Ok(s.to_vec()),
        Val::Arr(a) => a
            .iter()
            .enumerate()
            .map(|(i, x)| {
                match x {
                    Val::Num(Num::Int(n)) => u8::try_from(*n).ok(),
                    _ => integer(x).ok().and_then(|n| u8::try_from(n).ok()),
                }
                .ok_or_else(|| {
                    let reason = format!("element {i} ({}) is not an integer in 0..=255", quote(x));
                    encode_error(v, Format::Bytes, reason)
                })
            })
            .collect(),
        _ => Err(encode_error(
            v,
            Format::Bytes,
            "expected an array of integers 0..=255 or a string",
        )),
    }
}

/// The value as an `i64`, or why not.
fn integer(v: &Val) -> Result<i64, &'static str> {
    let Val::Num(n) = v else {
        return Err("not a number");
    };
    if let Some(i) = crate::expr::as_i64(v) {
        return Ok(i);
    }
    let integral = match n {
        Num::Int(_) | Num::BigInt(_) => true,
        Num::Float(f) => f.fract() == 0.0,
        Num::Dec(s) => s.parse::<f64>().is_ok_and(|f| f.fract() == 0.0),
    };
    Err(if integral {
        "out of the i64 range"
    } else {
        "not an integer"
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::expr::{Expr, as_i64, from_i64};

    fn json(s: &str) -> Val {
        decode(Format::Json, s.as_bytes()).expect("test JSON")
    }

    fn str_val(s: &str) -> Val {
        Val::from(s.to_owned())
    }

    fn jq(src: &str) -> Val {
        let e = Expr::compile(src, &[]).expect("test expression");
        e.one(Val::Null, &[]).expect("test expression value")
    }

    fn enc(format: Format, v: &Val) -> String {
        String::from_utf8(encode(format, v).expect("encodes")).expect("UTF-8")
    }

    fn enc_err(format: Format, v: &Val) -> String {
        encode(format, v).expect_err("must not encode").to_string()
    }

    fn dec_err(format: Format, bytes: &[u8]) -> String {
        decode(format, bytes)
            .expect_err("must not decode")
            .to_string()
    }

    #[test]
    fn string_round_trip() {
        let v = decode(Format::String, "héllo \"w\"\n".as_bytes()).unwrap();
        assert_eq!(v, str_val("héllo \"w\"\n"));
        assert_eq!(enc(Format::String, &v), "héllo \"w\"\n");
        assert_eq!(decode(Format::String, b"").unwrap(), str_val(""));
    }

    #[test]
    fn string_writes_non_strings_as_json() {
        assert_eq!(enc(Format::String, &from_i64(5)), "5");
        assert_eq!(enc(Format::String, &Val::Null), "null");
        assert_eq!(enc(Format::String, &Val::Bool(true)), "true");
        assert_eq!(enc(Format::String, &jq("1.5 * 2")), "3");
        let v = json(r#"{"a": [1, "x"]}"#);
        assert_eq!(enc(Format::String, &v), r#"{"a":[1,"x"]}"#);
    }

    #[test]
    fn string_rejects_invalid_utf8() {
        assert_eq!(
            dec_err(Format::String, b"caf\xc3\xa9 \xff!"),
            "not valid UTF-8 at byte 6"
        );
        assert_eq!(
            dec_err(Format::String, b"1234567\x80"),
            "not valid UTF-8 at byte 7"
        );
        // A jq string holding invalid UTF-8 (from @base64d) is written with U+FFFD.
        assert_eq!(enc(Format::String, &jq(r#""/w==" | @base64d"#)), "\u{fffd}");
    }

    #[test]
    fn json_round_trip_is_compact() {
        let text = r#" { "a" : [1, -2, 2.5, 1.10, 1e3, "x\"y\\z\n\t\u0001é"], "b": null,
                        "c": {"d": true, "e": false}, "big": 123456789012345678901234567890 } "#;
        let v = decode(Format::Json, text.as_bytes()).unwrap();
        let compact = enc(Format::Json, &v);
        assert_eq!(
            compact,
            r#"{"a":[1,-2,2.5,1.10,1e3,"x\"y\\z\n\t\u0001é"],"b":null,"c":{"d":true,"e":false},"big":123456789012345678901234567890}"#
        );
        // Key order is kept, and the compact text decodes to the same value.
        assert_eq!(decode(Format::Json, compact.as_bytes()).unwrap(), v);
        assert_eq!(enc(Format::Json, &json(r#""plain""#)), r#""plain""#);
        assert_eq!(enc(Format::Json, &json("[]")), "[]");
        assert_eq!(enc(Format::Json, &json("{}")), "{}");
    }

    #[test]
    fn json_numbers_print_like_jq() {
        assert_eq!(enc(Format::Json, &jq("nan")), "null");
        assert_eq!(
            enc(Format::Json, &jq("infinite")),
            "1.7976931348623157e+308"
        );
        assert_eq!(
            enc(Format::Json, &jq("-infinite")),
            "-1.7976931348623157e+308"
        );
        assert_eq!(enc(Format::Json, &jq("1.5 * 2")), "3");
        assert_eq!(enc(Format::Json, &jq("0.1 + 0.2")), "0.30000000000000004");
        assert_eq!(enc(Format::Json, &jq("1e300 * 10")), "1e301");
        assert_eq!(enc(Format::Json, &jq("[1, 2.5, -3]")), "[1,2.5,-3]");
        assert_eq!(
            enc(Format::Json, &from_i64(i64::MIN)),
            "-9223372036854775808"
        );
        // jaq accepts "+1.5" as a literal; JSON does not, so it is normalised.
        assert_eq!(
            enc(Format::Json, &json("[+1.5, -0.0, 0.5e-3]")),
            "[1.5,-0.0,0.5e-3]"
        );
    }

    #[test]
    fn json_strings_escape_like_jq() {
        let v = str_val("q\" b\\ \u{8}\u{c}\n\r\t \u{0}\u{1f}\u{7f} é ☃ /");
        assert_eq!(
            enc(Format::Json, &v),
            r#""q\" b\\ \b\f\n\r\t \u0000\u001f\u007f é ☃ /""#
        );
        let bad = jq(r#""/w==" | @base64d"#);
        assert_eq!(enc(Format::Json, &bad), "\"\u{fffd}\"");
    }

    #[test]
    fn json_decode_errors() {
        assert_eq!(
            dec_err(Format::Json, b"{\"a\":"),
            "not valid JSON: value expected at line 1 column 6"
        );
        assert_eq!(
            dec_err(Format::Json, b"[1, ?]"),
            "not valid JSON: value expected at line 1 column 5"
        );
        let msg = dec_err(Format::Json, b"{\n  \"a\": 1,\n  \"b\" 2}");
        assert!(
            msg.starts_with("not valid JSON: ") && msg.ends_with("at line 3 column 7"),
            "{msg}"
        );
        let msg = dec_err(Format::Json, b"");
        assert!(
            msg.starts_with("not valid JSON: ") && msg.ends_with("at line 1 column 1"),
            "{msg}"
        );
        let msg = dec_err(Format::Json, b"1 2");
        assert!(msg.starts_with("not valid JSON: "), "{msg}");
        assert_eq!(
            dec_err(Format::Json, b"\"ab\xffc\""),
            "not valid UTF-8 at byte 3"
        );
    }

    #[test]
    fn json_nesting_is_bounded() {
        let nested = |n: usize| format!("{}{}", "[".repeat(n), "]".repeat(n));
        let ok = decode(Format::Json, nested(MAX_DEPTH).as_bytes()).unwrap();
        assert_eq!(enc(Format::Json, &ok), nested(MAX_DEPTH));
        for n in [MAX_DEPTH + 1, 100_000] {
            let err = dec_err(Format::Json, nested(n).as_bytes());
            assert_eq!(err, "not accepted as JSON: nested deeper than 256 levels");
        }
        // Brackets inside strings do not count.
        let in_string = format!(r#"["{}\"{}"]"#, "[".repeat(2000), "{".repeat(2000));
        assert!(decode(Format::Json, in_string.as_bytes()).is_ok());
        // jaq's reader skips `#` comments to the end of the line: a quote or brackets in one
        // must not hide the nesting around it (each of these once overflowed the stack).
        let quote_in_comment = format!("#\"\n{}", nested(100_000));
        let opened_per_line = "[#]\n".repeat(100_000);
        for text in [quote_in_comment, opened_per_line] {
            let err = dec_err(Format::Json, text.as_bytes());
            assert_eq!(err, "not accepted as JSON: nested deeper than 256 levels");
        }
        let commented = format!("# {}\n[1] # ]]\n", "[".repeat(1000));
        assert_eq!(
            enc(
                Format::Json,
                &decode(Format::Json, commented.as_bytes()).unwrap()
            ),
            "[1]"
        );
        // jq can build values deeper than any input; they fail to encode instead of crashing.
        let deep = jq(&format!("reduce range({}) as $i (1; [.])", MAX_DEPTH + 1));
        let err = enc_err(Format::Json, &deep);
        assert!(err.ends_with("nested deeper than 256 levels"), "{err}");
        assert!(err.starts_with("cannot write [[[["), "{err}");
    }

    #[test]
    fn max_depth_fits_a_worker_stack() {
        // The deepest accepted value must survive decoding, the most stack-hungry builtins,
        // encoding and dropping on a tokio worker's 2 MiB stack, even unoptimised.
        let text = "[{\"a\":".repeat(MAX_DEPTH / 2) + "1" + &"}]".repeat(MAX_DEPTH / 2);
        let run = move || {
            let v = decode(Format::Json, text.as_bytes()).unwrap();
            let e = Expr::compile("walk(.) == . and (tojson | length > 0)", &[]).unwrap();
            assert_eq!(e.one(v.clone(), &[]).unwrap(), Val::Bool(true));
            assert_eq!(encode(Format::Json, &v).unwrap(), text.as_bytes());
        };
        let worker = std::thread::Builder::new()
            .stack_size(2 << 20)
            .spawn(run)
            .unwrap();
        worker.join().unwrap();
    }

    #[test]
    fn json_input_superset_is_accepted() {
        // jaq's parser is lenient; these are read, and written back as valid JSON or refused.
        assert_eq!(enc(Format::Json, &json("NaN")), "null");
        assert_eq!(enc(Format::Json, &json("# comment\n[1]")), "[1]");
        let err = enc_err(Format::Json, &json("{1: 2}"));
        assert!(err.ends_with("object key 1 is not a string"), "{err}");
    }

    #[test]
    fn json_non_string_keys_are_refused() {
        let v = jq("{(1): 2}");
        assert_eq!(
            enc_err(Format::Json, &v),
            "cannot write {1:2} as json: object key 1 is not a string"
        );
        assert!(enc_err(Format::String, &v).starts_with("cannot write {1:2} as string:"));
    }

    #[test]
    fn json_byte_strings_are_written_as_text() {
        assert_eq!(enc(Format::Json, &jq(r#""a\"b" | tobytes"#)), r#""a\"b""#);
    }

    #[test]
    fn i64_bytes_match_kafka_long_serializer() {
        assert_eq!(
            encode(Format::I64, &from_i64(1)).unwrap(),
            [0, 0, 0, 0, 0, 0, 0, 1]
        );
        assert_eq!(encode(Format::I64, &from_i64(-1)).unwrap(), [0xff; 8]);
        assert_eq!(
            encode(Format::I64, &from_i64(0x0102_0304_0506_0708)).unwrap(),
            [1, 2, 3, 4, 5, 6, 7, 8]
        );
        assert_eq!(
            encode(Format::I64, &from_i64(i64::MIN)).unwrap(),
            [0x80, 0, 0, 0, 0, 0, 0, 0]
        );
        assert_eq!(
            decode(Format::I64, &[0, 0, 0, 0, 0, 0, 0, 1]).unwrap(),
            from_i64(1)
        );
        assert_eq!(decode(Format::I64, &[0xff; 8]).unwrap(), from_i64(-1));
        for n in [
            0,
            1,
            -1,
            255,
            256,
            -256,
            i64::MAX,
            i64::MIN,
            1_700_000_000_123,
        ] {
            let bytes = encode(Format::I64, &from_i64(n)).unwrap();
            assert_eq!(as_i64(&decode(Format::I64, &bytes).unwrap()), Some(n));
        }
        // Integral floats are integers.
        assert_eq!(
            encode(Format::I64, &jq("1.5 * 2")).unwrap(),
            [0, 0, 0, 0, 0, 0, 0, 3]
        );
        assert_eq!(
            encode(Format::I64, &json("2.0")).unwrap(),
            [0, 0, 0, 0, 0, 0, 0, 2]
        );
    }

    #[test]
    fn i64_errors() {
        assert_eq!(
            dec_err(Format::I64, b"12345"),
            "i64 needs exactly 8 bytes, got 5"
        );
        assert_eq!(
            dec_err(Format::I64, b""),
            "i64 needs exactly 8 bytes, got 0"
        );
        assert_eq!(
            dec_err(Format::I64, &[0; 9]),
            "i64 needs exactly 8 bytes, got 9"
        );
        assert_eq!(
            enc_err(Format::I64, &json("1.5")),
            "cannot write 1.5 as i64: not an integer"
        );
        assert_eq!(
            enc_err(Format::I64, &str_val("5")),
            r#"cannot write "5" as i64: not a number"#
        );
        assert_eq!(
            enc_err(Format::I64, &Val::Null),
            "cannot write null as i64: not a number"
        );
        assert_eq!(
            enc_err(Format::I64, &json("9223372036854775808")),
            "cannot write 9223372036854775808 as i64: out of the i64 range"
        );
        assert_eq!(
            enc_err(Format::I64, &jq("nan")),
            "cannot write NaN as i64: not an integer"
        );
    }

    #[test]
    fn bytes_round_trip_every_byte() {
        let all: Vec<u8> = (0..=255).collect();
        let v = decode(Format::Bytes, &all).unwrap();
        assert_eq!(v, jq("[range(256)]"));
        assert_eq!(encode(Format::Bytes, &v).unwrap(), all);
        assert_eq!(decode(Format::Bytes, b"").unwrap(), json("[]"));
        assert_eq!(encode(Format::Bytes, &json("[]")).unwrap(), b"");
        // jq can work on the array and the result is still bytes.
        let e = Expr::compile("map(. + 1)", &[]).unwrap();
        let v = e.one(decode(Format::Bytes, b"HAL").unwrap(), &[]).unwrap();
        assert_eq!(encode(Format::Bytes, &v).unwrap(), b"IBM");
    }

    #[test]
    fn bytes_from_strings_are_utf8() {
        assert_eq!(
            encode(Format::Bytes, &str_val("é!")).unwrap(),
            [0xc3, 0xa9, b'!']
        );
        assert_eq!(encode(Format::Bytes, &json("[1, 2.0]")).unwrap(), [1, 2]);
    }

    #[test]
    fn bytes_errors() {
        assert_eq!(
            enc_err(Format::Bytes, &json("[1, 256]")),
            "cannot write [1,256] as bytes: element 1 (256) is not an integer in 0..=255"
        );
        assert_eq!(
            enc_err(Format::Bytes, &json("[-1]")),
            "cannot write [-1] as bytes: element 0 (-1) is not an integer in 0..=255"
        );
        assert!(
            enc_err(Format::Bytes, &json("[1.5]"))
                .ends_with("element 0 (1.5) is not an integer in 0..=255")
        );
        assert!(
            enc_err(Format::Bytes, &json(r#"["a"]"#))
                .ends_with(r#"element 0 ("a") is not an integer in 0..=255"#)
        );
        assert_eq!(
            enc_err(Format::Bytes, &from_i64(5)),
            "cannot write 5 as bytes: expected an array of integers 0..=255 or a string"
        );
    }

    #[test]
    fn long_values_are_shortened_in_errors() {
        let long = jq("[range(100)] | map(tostring) | join(\"\")");
        let msg = enc_err(Format::I64, &long);
        assert!(msg.len() < 150, "{msg}");
        assert!(msg.contains("…"), "{msg}");
    }

    #[test]
    fn json_number_grammar() {
        for ok in ["0", "-0", "1", "10", "1.10", "-1.5e3", "1E+2", "0.5e-3"] {
            assert!(is_json_number(ok), "{ok}");
        }
        for bad in [
            "", "-", "+1", "01", "1.", ".5", "1e", "1e+", "NaN", "1.5x", "--1",
        ] {
            assert!(!is_json_number(bad), "{bad}");
        }
    }

    /// Rough cost of the hot path; run with
    /// `cargo test --release -- --ignored --nocapture hot_path_cost`.
    #[test]
    #[ignore]
    fn hot_path_cost() {
        use std::time::Instant;
        let record = br#"{"user":"alice","status":200,"amount":12.5,"tags":["a","b"],"ts":1700000000123,"ok":true,"n":null}"#;
        assert!((90..=110).contains(&record.len()), "{}", record.len());
        let n = 200_000;
        let time = |what: &str, f: &mut dyn FnMut()| {
            f();
            let start = Instant::now();
            for _ in 0..n {
                f();
            }
            let ns = start.elapsed().as_nanos() / n as u128;
            println!("{what}: {ns} ns");
        };
        let v = decode(Format::Json, record).unwrap();
        time("decode json ~100 B", &mut || {
            std::hint::black_box(decode(Format::Json, std::hint::black_box(record)).unwrap());
        });
        time("encode json ~100 B", &mut || {
            std::hint::black_box(encode(Format::Json, std::hint::black_box(&v)).unwrap());
        });
        time("decode string", &mut || {
            std::hint::black_box(decode(Format::String, std::hint::black_box(b"alice")).unwrap());
        });
        time("encode i64", &mut || {
            std::hint::black_box(encode(Format::I64, std::hint::black_box(&from_i64(7))).unwrap());
        });
        let vars = [str_val("k"), from_i64(0)];
        for src in [".status == 200", ".user", "$agg + .amount"] {
            let names: &[&str] = if src.contains("$agg") {
                &["key", "ts", "agg"]
            } else {
                &["key", "ts"]
            };
            let e = Expr::compile(src, names).unwrap();
            let vars: Vec<Val> = vars
                .iter()
                .cloned()
                .chain((names.len() == 3).then(|| from_i64(1)))
                .collect();
            time(&format!("run `{src}`"), &mut || {
                std::hint::black_box(e.run(v.clone(), &vars).unwrap());
            });
        }
        let start = Instant::now();
        for _ in 0..20 {
            std::hint::black_box(Expr::compile(".status == 200", &[]).unwrap());
        }
        println!("compile: {} µs", start.elapsed().as_micros() / 20);
    }
}
