//! A direct evaluator for the jq expressions most steps use — field paths, variables,
//! literals, comparisons, `+ - *` and `and`/`or`, e.g. `.status == 200`, `.user`,
//! `$agg + .amount` — that reads the fields it needs straight from the record's JSON bytes
//! instead of decoding the whole value and running jaq's interpreter.
//!
//! It never changes an answer: whenever a value is outside what it handles exactly as jq
//! does (floats, big numbers, arrays, objects, strings with escapes, a type error, a missing
//! decode), it answers `None` and the caller runs jaq as before. The tests check it against
//! jaq on many inputs.

use super::Val;
use crate::format::MAX_DEPTH;
use hifijson::num::Lex as _;
use hifijson::str::Lex as _;
use hifijson::token::Lex as _;
use hifijson::{Read as _, SliceLexer};
use jaq_core::load::parse::{BinaryOp, Term};
use jaq_core::load::{Lexer, Parser};
use jaq_core::ops::{Cmp, Math};
use jaq_core::path::{Opt, Part};
use jaq_json::Num;
use std::cmp::Ordering;

/// What an expression runs on.
#[derive(Clone, Copy)]
pub enum Input<'a> {
    /// A JSON document not decoded yet.
    Json(&'a [u8]),
    Val(&'a Val),
    /// No value (a tombstone): `null` to jq.
    Null,
}

#[derive(Debug)]
pub enum Lit {
    Null,
    Bool(bool),
    Int(isize),
    Str(String),
}

impl Lit {
    fn val(&self) -> Val {
        match self {
            Lit::Null => Val::Null,
            Lit::Bool(b) => Val::Bool(*b),
            Lit::Int(i) => Val::Num(Num::Int(*i)),
            Lit::Str(s) => Val::from(s.clone()),
        }
    }
}

#[derive(Debug)]
pub enum Fast {
    /// `.a.b`: the field names, in order (empty for `.`).
    Path(Vec<String>),
    /// A global variable, by position.
    Var(usize),
    /// A literal, kept as plain data (a `Val` is not `Send`).
    Lit(Lit),
    Cmp(Cmp, Box<Fast>, Box<Fast>),
    Math(Math, Box<Fast>, Box<Fast>),
    And(Box<Fast>, Box<Fast>),
    Or(Box<Fast>, Box<Fast>),
    /// `if c then a elif c2 then b else d end`; without `else`, `.`.
    If(Vec<(Fast, Fast)>, Box<Fast>),
}

impl Fast {
    /// The direct form of `src`, if it is inside the subset; `vars` are the global variables
    /// without `$`, in order.
    pub fn compile(src: &str, vars: &[&str]) -> Option<Fast> {
        let tokens = Lexer::new(src).lex().ok()?;
        let term = Parser::new(&tokens).parse(|p| p.term()).ok()?;
        Self::from_term(&term, vars)
    }

    fn from_term(t: &Term<&str>, vars: &[&str]) -> Option<Fast> {
        let two = |l: &Term<&str>, r: &Term<&str>| {
            Some((
                Box::new(Self::from_term(l, vars)?),
                Box::new(Self::from_term(r, vars)?),
            ))
        };
        Some(match t {
            Term::Id => Fast::Path(Vec::new()),
            Term::Num(n) => Fast::Lit(Lit::Int(plain_int(n)?)),
            Term::Str(None, _) => Fast::Lit(Lit::Str(t_str(t)?.to_string())),
            Term::Call(name, args) if args.is_empty() => match *name {
                "true" => Fast::Lit(Lit::Bool(true)),
                "false" => Fast::Lit(Lit::Bool(false)),
                "null" => Fast::Lit(Lit::Null),
                _ => return None,
            },
            Term::Var(v) => Fast::Var(vars.iter().position(|x| Some(*x) == v.strip_prefix('$'))?),
            Term::Path(head, path) => {
                let Fast::Path(mut names) = Self::from_term(head, vars)? else {
                    return None;
                };
                for (part, opt) in &path.0 {
                    match (part, opt) {
                        (Part::Index(i), Opt::Essential) => names.push(t_str(i)?.to_string()),
                        _ => return None,
                    }
                }
                Fast::Path(names)
            }
            Term::BinOp(l, op, r) => {
                let (l, r) = two(l, r)?;
                match op {
                    BinaryOp::Cmp(c) => Fast::Cmp(*c, l, r),
                    BinaryOp::Math(m @ (Math::Add | Math::Sub | Math::Mul)) => Fast::Math(*m, l, r),
                    BinaryOp::And => Fast::And(l, r),
                    BinaryOp::Or => Fast::Or(l, r),
                    _ => return None,
                }
            }
            Term::IfThenElse(branches, otherwise) => Fast::If(
                branches
                    .iter()
                    .map(|(c, t)| Some((Self::from_term(c, vars)?, Self::from_term(t, vars)?)))
                    .collect::<Option<_>>()?,
                Box::new(match otherwise {
                    Some(e) => Self::from_term(e, vars)?,
                    None => Fast::Path(Vec::new()),
                }),
            ),
            _ => return None,
        })
    }

    /// True if every evaluation reads a field of the input, which checks the whole document.
    pub fn reads_input(&self) -> bool {
        match self {
            Fast::Path(names) => !names.is_empty(),
            Fast::Var(_) | Fast::Lit(_) => false,
            Fast::Cmp(_, l, r) | Fast::Math(_, l, r) => l.reads_input() || r.reads_input(),
            // The right side may not be evaluated.
            Fast::And(l, _) | Fast::Or(l, _) => l.reads_input(),
            Fast::If(branches, otherwise) => branches
                .first()
                .map_or(otherwise.reads_input(), |(c, _)| c.reads_input()),
        }
    }

    /// The one output of the expression, or `None` to say "ask jaq".
    pub fn eval(&self, input: Input<'_>, vars: &[Val]) -> Option<Val> {
        match self {
            Fast::Path(names) => path(input, names),
            Fast::Var(i) => vars.get(*i).cloned(),
            Fast::Lit(l) => Some(l.val()),
            Fast::Cmp(c, l, r) => {
                let (a, b) = (l.eval(input, vars)?, r.eval(input, vars)?);
                let o = order(&a, &b)?;
                Some(Val::Bool(match c {
                    Cmp::Lt => o.is_lt(),
                    Cmp::Le => o.is_le(),
                    Cmp::Gt => o.is_gt(),
                    Cmp::Ge => o.is_ge(),
                    Cmp::Eq => o.is_eq(),
                    Cmp::Ne => o.is_ne(),
                }))
            }
            Fast::Math(m, l, r) => math(*m, l.eval(input, vars)?, r.eval(input, vars)?),
            Fast::And(l, r) => Some(Val::Bool(
                truthy(&l.eval(input, vars)?) && truthy(&r.eval(input, vars)?),
            )),
            Fast::Or(l, r) => Some(Val::Bool(
                truthy(&l.eval(input, vars)?) || truthy(&r.eval(input, vars)?),
            )),
            Fast::If(branches, otherwise) => {
                for (c, then) in branches {
                    if truthy(&c.eval(input, vars)?) {
                        return then.eval(input, vars);
                    }
                }
                otherwise.eval(input, vars)
            }
        }
    }
}

fn truthy(v: &Val) -> bool {
    !matches!(v, Val::Null | Val::Bool(false))
}

/// A decimal integer literal without sign, point or exponent that fits a machine integer.
fn plain_int(s: &str) -> Option<isize> {
    if s.is_empty() || !s.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    s.parse().ok()
}

/// The text of a plain string term (`"user"` or the `user` of `.user`) without escapes.
fn t_str<'a>(t: &Term<&'a str>) -> Option<&'a str> {
    use jaq_core::load::lex::StrPart;
    match t {
        Term::Str(None, parts) => match &parts[..] {
            [StrPart::Str(s)] if !s.contains('\\') => Some(s),
            [] => Some(""),
            _ => None,
        },
        _ => None,
    }
}

/// jq's order on the values handled here: null < false < true < numbers < strings.
fn order(a: &Val, b: &Val) -> Option<Ordering> {
    fn rank(v: &Val) -> Option<u8> {
        Some(match v {
            Val::Null => 0,
            Val::Bool(false) => 1,
            Val::Bool(true) => 2,
            Val::Num(Num::Int(_)) => 3,
            Val::TStr(_) => 4,
            _ => return None,
        })
    }
    let (ra, rb) = (rank(a)?, rank(b)?);
    Some(match (a, b) {
        (Val::Num(Num::Int(x)), Val::Num(Num::Int(y))) => x.cmp(y),
        (Val::TStr(x), Val::TStr(y)) => x.as_ref().as_ref().cmp(y.as_ref().as_ref()),
        _ => ra.cmp(&rb),
    })
}

fn math(m: Math, a: Val, b: Val) -> Option<Val> {
    match (m, a, b) {
        (Math::Add, Val::Null, x) | (Math::Add, x, Val::Null) => Some(x),
        (m, Val::Num(Num::Int(x)), Val::Num(Num::Int(y))) => Some(Val::Num(Num::Int(match m {
            Math::Add => x.checked_add(y)?,
            Math::Sub => x.checked_sub(y)?,
            Math::Mul => x.checked_mul(y)?,
            _ => return None,
        }))),
        _ => None,
    }
}

/// `.a.b` on the input.
fn path(input: Input<'_>, names: &[String]) -> Option<Val> {
    match input {
        Input::Null => Some(Val::Null),
        Input::Val(v) => {
            let mut cur = v.clone();
            for n in names {
                cur = match &cur {
                    Val::Null => Val::Null,
                    Val::Obj(m) => m.get(&Val::from(n.clone())).cloned().unwrap_or(Val::Null),
                    _ => return None,
                };
            }
            Some(cur)
        }
        Input::Json(bytes) => {
            if names.is_empty() {
                // The whole document: decoding it is jaq_json's job.
                return None;
            }
            let mut cur: &[u8] = bytes;
            for n in names {
                match field(cur, n.as_bytes())? {
                    Some(v) => cur = v,
                    None => return Some(Val::Null),
                }
            }
            leaf(cur)
        }
    }
}

/// A scalar JSON value as jaq_json reads it; `None` for arrays, objects, numbers other than
/// plain integers and strings with escapes.
fn leaf(b: &[u8]) -> Option<Val> {
    match b.first()? {
        b'n' if b == b"null" => Some(Val::Null),
        b't' if b == b"true" => Some(Val::Bool(true)),
        b'f' if b == b"false" => Some(Val::Bool(false)),
        b'"' => {
            let inner = b.get(1..b.len() - 1)?;
            if inner.contains(&b'\\') {
                return None;
            }
            Some(Val::from(std::str::from_utf8(inner).ok()?.to_string()))
        }
        b'-' | b'0'..=b'9' => {
            let s = std::str::from_utf8(b).ok()?;
            let digits = s.strip_prefix('-').unwrap_or(s);
            // jaq_json reads integers with a leading zero or too many digits differently.
            if digits.len() > 1 && digits.starts_with('0') {
                return None;
            }
            let n = plain_int(digits)?;
            Some(Val::Num(Num::Int(if s.starts_with('-') { -n } else { n })))
        }
        _ => None,
    }
}

/// The raw bytes of field `name` of the JSON object `doc` (the last one if repeated, as
/// decoding does): `Some(None)` if `doc` is an object without it or `null`, `None` if `doc` is
/// not an object, is malformed or not UTF-8, nests deeper than [`MAX_DEPTH`] or has escaped
/// keys. The whole document is checked, so a malformed record still fails where jaq would
/// fail.
fn field<'a>(doc: &'a [u8], name: &[u8]) -> Option<Option<&'a [u8]>> {
    // Decoding refuses invalid UTF-8 anywhere, and so must this.
    std::str::from_utf8(doc).ok()?;
    let mut lx = SliceLexer::new(doc);
    match lx.ws_peek()? {
        b'{' => {}
        b'n' => {
            return (lx.null_or_bool() == Some(None) && rest_is_blank(&mut lx)).then_some(None);
        }
        _ => return None,
    }
    lx.take_next();
    let mut found = None;
    let mut next = lx.ws_peek()?;
    if next == b'}' {
        lx.take_next();
    } else {
        loop {
            if next != b'"' {
                return None;
            }
            let key = key(&mut lx)?;
            let start = lx.as_slice();
            skip_value(&mut lx, 1)?;
            if key == name {
                found = Some(&start[..start.len() - lx.as_slice().len()]);
            }
            match lx.ws_peek()? {
                b',' => {
                    lx.take_next();
                    next = lx.ws_peek()?;
                }
                b'}' => {
                    lx.take_next();
                    break;
                }
                _ => return None,
            }
        }
    }
    rest_is_blank(&mut lx).then_some(found)
}

/// Reads `"key":` (the lexer at the opening quote) and returns the key's raw bytes, leaving
/// the lexer before the value. `None` if malformed or the key has escapes.
fn key<'a>(lx: &mut SliceLexer<'a>) -> Option<&'a [u8]> {
    lx.take_next();
    let before = lx.as_slice();
    lx.str_ignore().ok()?;
    let key = &before[..before.len() - lx.as_slice().len() - 1];
    if key.contains(&b'\\') {
        return None;
    }
    lx.expect(SliceLexer::ws_peek, b':')?;
    Some(key)
}

/// Skips one JSON value, the lexer at or before its first byte, without recursion: a deeply
/// nested document must not overflow the stack. `depth` is the nesting the value sits at;
/// `None` if the value is malformed or nests deeper than [`MAX_DEPTH`] (then jaq's path
/// reports why).
#[inline]
fn skip_value(lx: &mut SliceLexer<'_>, depth: usize) -> Option<()> {
    match lx.ws_peek()? {
        b'[' | b'{' => skip_nested(lx, depth),
        b'"' => lx.discarded().str_ignore().ok(),
        b'0'..=b'9' | b'-' => lx.num_ignore().validate().ok().map(|_| ()),
        b'a'..=b'z' => lx.null_or_bool().map(|_| ()),
        _ => None,
    }
}

/// [`skip_value`] for an array or object.
fn skip_nested(lx: &mut SliceLexer<'_>, depth: usize) -> Option<()> {
    // One bit per open container: set for an object, clear for an array.
    let mut open = [0u64; MAX_DEPTH.div_ceil(64)];
    let mut depth_here = 0usize;
    let is_object = |open: &[u64], d: usize| open[d / 64] >> (d % 64) & 1 == 1;
    'value: loop {
        match lx.ws_peek()? {
            c @ (b'[' | b'{') => {
                if depth + depth_here >= MAX_DEPTH {
                    return None;
                }
                lx.take_next();
                let object = c == b'{';
                let d = depth_here;
                open[d / 64] = open[d / 64] & !(1 << (d % 64)) | u64::from(object) << (d % 64);
                depth_here += 1;
                match lx.ws_peek()? {
                    b']' if !object => lx.take_next().map(drop)?,
                    b'}' if object => lx.take_next().map(drop)?,
                    b'"' if object => {
                        key(lx)?;
                        continue 'value;
                    }
                    _ if object => return None,
                    _ => continue 'value,
                }
                depth_here -= 1;
            }
            b'"' => lx.discarded().str_ignore().ok()?,
            b'0'..=b'9' | b'-' => lx.num_ignore().validate().ok().map(|_| ())?,
            b'a'..=b'z' => drop(lx.null_or_bool()?),
            _ => return None,
        }
        // After a value: close the containers it ends, or go on with the next element.
        while depth_here > 0 {
            let object = is_object(&open, depth_here - 1);
            match lx.ws_peek()? {
                b',' => {
                    lx.take_next();
                    if object {
                        if lx.ws_peek()? != b'"' {
                            return None;
                        }
                        key(lx)?;
                    }
                    continue 'value;
                }
                b']' if !object => lx.take_next().map(drop)?,
                b'}' if object => lx.take_next().map(drop)?,
                _ => return None,
            }
            depth_here -= 1;
        }
        return Some(());
    }
}

/// True if `doc` is one well-formed JSON value in UTF-8 nested at most [`MAX_DEPTH`] deep
/// (what decoding accepts).
pub fn is_json(doc: &[u8]) -> bool {
    let mut lx = SliceLexer::new(doc);
    std::str::from_utf8(doc).is_ok() && skip_value(&mut lx, 0).is_some() && rest_is_blank(&mut lx)
}

fn rest_is_blank(lx: &mut SliceLexer<'_>) -> bool {
    lx.ws_peek().is_none()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::expr::{Expr, from_i64};

    fn json(s: &str) -> Val {
        jaq_json::read::parse_single(s.as_bytes()).expect("test JSON")
    }

    #[test]
    fn the_subset_compiles_and_the_rest_does_not() {
        let vars = ["key", "ts", "agg"];
        for src in [
            ".",
            ".status == 200",
            ".user",
            ".a.b",
            ".\"a\"",
            "$agg + .amount",
            "0",
            ".a > 1 and .b != \"x\" or .c",
            "$key",
            "null",
            "if . then 1 else 2 end",
            "if .a > $agg then .a elif .b then \"b\" end",
        ] {
            assert!(Fast::compile(src, &vars).is_some(), "{src}");
        }
        for src in [
            ".a[0]",
            ".a?",
            ".[]",
            "1.5",
            "$agg / 2",
            "length",
            "def f: 1; f",
            "\"a\\nb\"",
            "if . then 1 else length end",
            "$nope",
            ".a | .b",
            "-1",
        ] {
            assert!(Fast::compile(src, &vars).is_none(), "{src}");
        }
    }

    /// Every expression × every document: wherever the direct evaluator answers, on the
    /// bytes or on the decoded value, it answers what jaq answers.
    #[test]
    fn agrees_with_jaq() {
        let vars_names = ["key", "ts", "agg"];
        let exprs = [
            ".",
            ".status == 200",
            ".status != 200",
            ".status < 300",
            ".status >= 200",
            ".user",
            ".user == \"alice\"",
            ".user > \"al\"",
            ".a.b",
            ".a.b + 1",
            "$agg + .amount",
            "$agg - .amount",
            "$agg * .amount",
            ".amount + $agg",
            ".missing + 1",
            "null + .amount",
            ".user + \"-x\"",
            ".status == 200 and .amount > 3",
            ".status == 404 or .flag",
            ".flag == false",
            ".n == null",
            "$key",
            "$ts > 5",
            "true and .x",
            "if .amount > $agg then .amount else $agg end",
            "if .status == 200 then .user elif .flag then 1 end",
            "if .missing then 1 else .user end",
        ];
        let docs = [
            r#"{"user":"alice","status":200,"amount":5}"#,
            r#"{"user":"bob","status":404,"amount":-7,"flag":true}"#,
            r#" { "status" : 200 , "amount" : 9223372036854775807 } "#,
            r#"{"amount":1.5,"status":200.0}"#,
            r#"{"amount":"5","user":null}"#,
            r#"{"a":{"b":3},"a":{"b":4}}"#,
            r#"{"a":{"b":[1]}}"#,
            r#"{"a":1}"#,
            r#"{"user":"\u0061lice","n":null,"flag":false}"#,
            r#"{"us\u0065r":"x"}"#,
            r#"{"amount":007}"#,
            r#"{"amount":1e2}"#,
            r#"{"status":200,"x":{"y":[true,false,null,"s",{"z":1}]}}"#,
            "null",
            "[1,2]",
            "42",
            "\"s\"",
            r#"{"user":"é","amount":0}"#,
            r#"{}"#,
        ];
        let vars = [Val::from("k".to_string()), from_i64(7), from_i64(100)];
        let mut answered = 0;
        for src in exprs {
            let fast = Fast::compile(src, &vars_names).expect(src);
            let jaq = Expr::compile(src, &vars_names).expect(src);
            for doc in docs {
                let Ok(val) = jaq_json::read::parse_single(doc.as_bytes()) else {
                    continue;
                };
                let want = jaq.one(val.clone(), &vars).ok();
                for (how, got) in [
                    ("bytes", fast.eval(Input::Json(doc.as_bytes()), &vars)),
                    ("value", fast.eval(Input::Val(&val), &vars)),
                ] {
                    if let Some(got) = got {
                        answered += 1;
                        assert_eq!(Some(&got), want.as_ref(), "{src} on {doc} ({how})");
                    }
                }
            }
        }
        assert!(answered > 300, "only {answered} answers");
    }

    #[test]
    fn malformed_documents_are_left_to_jaq() {
        let f = Fast::compile(".status == 200", &[]).expect("subset");
        for doc in [
            r#"{"status":200"#,
            r#"{"status":200} x"#,
            r#"{"status":200,}"#,
            r#"{"status":20 0}"#,
            r#"{"status":200,"x":[1,}"#,
            "",
        ] {
            assert!(f.eval(Input::Json(doc.as_bytes()), &[]).is_none(), "{doc}");
        }
        assert_eq!(
            f.eval(Input::Json(br#"{"status":200}"#), &[]),
            Some(Val::Bool(true))
        );
        assert_eq!(
            Fast::compile(".a", &[])
                .expect("subset")
                .eval(Input::Json(b"null"), &[]),
            Some(Val::Null)
        );
        assert_eq!(json("1"), from_i64(1));
    }

    #[test]
    fn deep_documents_are_left_to_jaq_without_recursion() {
        let nested = |n: usize, open: &str, close: &str| {
            format!(
                r#"{{"deep":{}1{},"ok":true}}"#,
                open.repeat(n),
                close.repeat(n)
            )
        };
        // On a small stack: skipping must not recurse per level.
        let run = move || {
            let f = Fast::compile(".ok", &[]).expect("subset");
            let eval = |doc: &str| f.eval(Input::Json(doc.as_bytes()), &[]);
            for (open, close) in [("[", "]"), (r#"{"a":"#, "}")] {
                // The record's object is one level: 256 in all is the most decoding accepts.
                let most = nested(MAX_DEPTH - 1, open, close);
                assert_eq!(eval(&most), Some(Val::Bool(true)));
                assert!(is_json(most.as_bytes()));
                assert!(crate::format::decode(eddy_crds::Format::Json, most.as_bytes()).is_ok());
                let over = nested(MAX_DEPTH, open, close);
                assert_eq!(eval(&over), None);
                assert!(!is_json(over.as_bytes()));
                for n in [100_000, 1_000_000] {
                    assert_eq!(eval(&nested(n, open, close)), None);
                    assert_eq!(eval(&nested(n, open, "")), None, "unbalanced");
                    assert!(!is_json(open.repeat(n).as_bytes()));
                }
            }
            // Decoding refuses invalid UTF-8, and so does the direct evaluator.
            assert_eq!(
                eval("{\"ok\":true,\"s\":\"caf\u{e9}\"}"),
                Some(Val::Bool(true))
            );
            assert_eq!(
                f.eval(Input::Json(b"{\"ok\":true,\"s\":\"caf\xc3\"}"), &[]),
                None
            );
            assert!(!is_json(b"\"\xff\""));
        };
        std::thread::Builder::new()
            .stack_size(256 << 10)
            .spawn(run)
            .expect("thread")
            .join()
            .expect("no stack overflow");
    }

    /// Cost of reading a field straight from the bytes, against the recursive skipper used
    /// before; run with `cargo test --release -p eddy-worker -- --ignored --nocapture field_cost`.
    #[test]
    #[ignore]
    fn field_cost() {
        fn recursive(doc: &[u8], name: &[u8]) -> Option<Option<usize>> {
            use hifijson::Expect;
            let mut lx = SliceLexer::new(doc);
            let mut found = None;
            lx.ws_peek()?;
            let res: Result<(), hifijson::Error> = lx.discarded().seq(
                b'}',
                SliceLexer::ws_peek,
                |next, lx: &mut SliceLexer<'_>| {
                    lx.expect(|_| Some(next), b'"').ok_or(Expect::String)?;
                    let before = lx.as_slice();
                    lx.str_ignore().map_err(hifijson::Error::Str)?;
                    let key = &before[..before.len() - lx.as_slice().len() - 1];
                    lx.expect(SliceLexer::ws_peek, b':').ok_or(Expect::Colon)?;
                    let next = lx.ws_peek().ok_or(Expect::Value)?;
                    let start = lx.as_slice().len();
                    hifijson::ignore::parse(next, lx)?;
                    if key == name {
                        found = Some(start - lx.as_slice().len());
                    }
                    Ok(())
                },
            );
            (res.is_ok() && rest_is_blank(&mut lx)).then_some(found)
        }
        let record = br#"{"user":"alice","status":200,"amount":12.5,"tags":["a","b"],"ts":1700000000123,"ok":true,"n":null}"#;
        let nested =
            br#"{"user":"alice","a":{"b":[1,{"c":[2,3,{"d":4}]}],"e":{"f":{"g":5}}},"status":200}"#;
        let n = 100_000;
        let time = |f: &dyn Fn()| {
            let start = std::time::Instant::now();
            for _ in 0..n {
                f();
            }
            start.elapsed().as_nanos() / n
        };
        for (what, doc) in [("flat", &record[..]), ("nested", &nested[..])] {
            // The machine is shared: alternate the two and keep the best round of each.
            let (mut before, mut now, mut utf8) = (u128::MAX, u128::MAX, u128::MAX);
            for _ in 0..15 {
                before = before.min(time(&|| {
                    std::hint::black_box(recursive(std::hint::black_box(doc), b"status"));
                }));
                now = now.min(time(&|| {
                    std::hint::black_box(field(std::hint::black_box(doc), b"status"));
                }));
                utf8 = utf8.min(time(&|| {
                    std::hint::black_box(std::str::from_utf8(std::hint::black_box(doc)).is_ok());
                }));
            }
            println!(
                "{what} ~100 B: recursive skipper {before} ns, bounded skipper {now} ns \
                 (of which {utf8} ns checking UTF-8)"
            );
        }
    }
}
