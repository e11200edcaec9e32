//! jq expressions, compiled once and evaluated per record through jaq.
//!
//! Topology steps (`filter`, `map`, `groupBy`, `aggregate`) are written in jq. Each expression
//! is parsed and compiled once, together with jq's standard library (jaq-core, jaq-std and
//! jaq-json definitions), into an [`Expr`] that tasks clone cheaply and run on every record with
//! named global variables such as `$key`, `$ts` or `$agg` bound by position. Compile errors quote
//! the expression and point at the offending column; runtime errors carry jq's own message.
//!
//! Deliberate differences from a stock jq/jaq: `env` is not available (expressions must not read
//! the worker's environment, which holds credentials), `input`/`inputs` do not exist (one record
//! in, outputs out), and `halt`/`halt_error` fail the expression instead of exiting the process.

mod fast;

pub use fast::Input;
use std::fmt::Write as _;
use std::sync::Arc;

use jaq_core::load::{self, Arena, File, Loader, lex};
use jaq_core::{Ctx, Vars, compile, data};
use jaq_json::Num;
pub use jaq_json::Val;

/// The data kind our filters run on: plain [`Val`]s, no inputs or other global data.
type Data = data::JustLut<Val>;
/// A compiled jq program.
type Filter = jaq_core::Filter<Data>;

/// Natives left out of the standard library, see the module documentation.
const EXCLUDED_NATIVES: &[&str] = &["env"];

/// Upper bound on the outputs of one evaluation: an accidental generator such as
/// `range(1e18)` must fail the record, not exhaust the worker's memory.
pub const MAX_OUTPUTS: usize = 1 << 20;

/// Longest runtime error message kept, in characters.
const MAX_MESSAGE: usize = 1000;

/// Why an expression could not be compiled or evaluated.
#[derive(Debug, thiserror::Error)]
pub enum ExprError {
    /// The expression does not parse or refers to something undefined.
    #[error("invalid jq expression `{expr}`: {message}")]
    Compile { expr: String, message: String },
    /// Evaluation raised a jq error (`error(...)`, a type error, `halt`, ...).
    #[error("jq expression `{expr}` failed: {message}")]
    Runtime { expr: String, message: String },
    /// [`Expr::one`] got an empty stream.
    #[error("jq expression `{expr}` produced no value")]
    NoValue { expr: String },
    /// [`Expr::one`] got more than one output.
    #[error("jq expression `{expr}` produced more than one value")]
    ManyValues { expr: String },
    /// [`Expr::run`] hit [`MAX_OUTPUTS`].
    #[error("jq expression `{expr}` produced more than {MAX_OUTPUTS} values")]
    TooManyValues { expr: String },
    /// The caller passed a different number of variable values than it declared at compile time.
    #[error("jq expression `{expr}` was compiled with {expected} variables but run with {got}")]
    VarCount {
        expr: String,
        expected: usize,
        got: usize,
    },
}

/// A compiled jq expression.
///
/// Cloning is a reference-count increment, so each task can own a copy. `Expr` is `Send + Sync`:
/// the compiled program holds only owned strings, term indices and function pointers.
#[derive(Clone)]
pub struct Expr(Arc<Compiled>);

struct Compiled {
    filter: Filter,
    /// The same expression for the direct evaluator, when it is inside its subset.
    fast: Option<fast::Fast>,
    source: String,
    vars: usize,
}

impl std::fmt::Debug for Expr {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("Expr").field(&self.0.source).finish()
    }
}

impl Expr {
    /// Compiles `src` with jq's standard library, declaring the global variables `vars`.
    ///
    /// vars: names without '$', e.g. &["key", "ts"] — each is bound when running, in that order.
    pub fn compile(src: &str, vars: &[&str]) -> Result<Expr, ExprError> {
        let fail = |message: String| ExprError::Compile {
            expr: src.to_owned(),
            message,
        };
        if let Some(bad) = vars.iter().find(|v| !is_ident(v)) {
            return Err(fail(format!("invalid variable name {bad:?}")));
        }
        let globals: Vec<String> = vars.iter().map(|v| format!("${v}")).collect();

        let defs = jaq_core::defs()
            .chain(jaq_std::defs())
            .chain(jaq_json::defs());
        let funs = jaq_core::funs::<Data>()
            .chain(jaq_std::funs())
            .chain(jaq_json::funs())
            .filter(|(name, _, _)| !EXCLUDED_NATIVES.contains(name));

        let arena = Arena::default();
        let modules = Loader::new(defs)
            .load(
                &arena,
                File {
                    code: src,
                    path: (),
                },
            )
            .map_err(|errs| fail(load_errors(src, errs)))?;
        let filter = jaq_core::Compiler::default()
            .with_funs(funs)
            .with_global_vars(globals.iter().map(String::as_str))
            .compile(modules)
            .map_err(|errs| fail(compile_errors(src, errs)))?;

        Ok(Expr(Arc::new(Compiled {
            filter,
            fast: fast::Fast::compile(src, vars),
            source: src.to_owned(),
            vars: vars.len(),
        })))
    }

    /// All outputs of the filter for `input`, with `vars` bound positionally; the first runtime error aborts.
    pub fn run(&self, input: Val, vars: &[Val]) -> Result<Vec<Val>, ExprError> {
        let mut out = Vec::new();
        self.each(input, vars, |v| {
            if out.len() == MAX_OUTPUTS {
                return Err(ExprError::TooManyValues {
                    expr: self.0.source.clone(),
                });
            }
            out.push(v);
            Ok(())
        })?;
        Ok(out)
    }

    /// Exactly one output expected (groupBy, aggregate): error if none ("produced no value") or if it errors.
    ///
    /// A second output is an error too: silently keeping the first would hide a bug in the
    /// expression (say `.tags[]` as a grouping key).
    pub fn one(&self, input: Val, vars: &[Val]) -> Result<Val, ExprError> {
        let mut first = None;
        self.each(input, vars, |v| {
            if first.is_some() {
                return Err(ExprError::ManyValues {
                    expr: self.0.source.clone(),
                });
            }
            first = Some(v);
            Ok(())
        })?;
        first.ok_or_else(|| ExprError::NoValue {
            expr: self.0.source.clone(),
        })
    }

    /// The one output computed directly from `input` (see [`fast`]), or `None` when the
    /// expression or the value needs jaq: then call [`Expr::one`] or [`Expr::run`].
    pub fn fast(&self, input: Input<'_>, vars: &[Val]) -> Option<Val> {
        if vars.len() != self.0.vars {
            return None;
        }
        let f = self.0.fast.as_ref()?;
        // A record that does not decode must fail as it does under jaq, even when the
        // expression would not look at it.
        if let Input::Json(doc) = input
            && !f.reads_input()
            && !fast::is_json(doc)
        {
            return None;
        }
        f.eval(input, vars)
    }

    /// The expression's source text, as given to [`Expr::compile`].
    pub fn source(&self) -> &str {
        &self.0.source
    }

    /// Feeds each output to `f` until the stream ends or `f` or the filter fails.
    ///
    /// Streaming (instead of collecting) spares [`Expr::one`] a `Vec` and lets it stop at the
    /// second output.
    fn each(
        &self,
        input: Val,
        vars: &[Val],
        mut f: impl FnMut(Val) -> Result<(), ExprError>,
    ) -> Result<(), ExprError> {
        let compiled = &*self.0;
        if vars.len() != compiled.vars {
            return Err(ExprError::VarCount {
                expr: compiled.source.clone(),
                expected: compiled.vars,
                got: vars.len(),
            });
        }
        let ctx = Ctx::<Data>::new(&compiled.filter.lut, Vars::new(vars.iter().cloned()));
        for y in compiled.filter.id.run((ctx, input)) {
            let v = y.map_err(|exn| ExprError::Runtime {
                expr: compiled.source.clone(),
                message: exception_message(exn),
            })?;
            f(v)?;
        }
        Ok(())
    }
}

/// jq truthiness: false and null are false, everything else (including 0 and "") is true.
pub fn truthy(v: &Val) -> bool {
    !matches!(v, Val::Null | Val::Bool(false))
}

/// An integer as a jq number.
pub fn from_i64(n: i64) -> Val {
    Val::Num(Num::from_integral(n))
}

/// The value as an `i64` if it is a number with an integral value that fits (`3` and `3.0`,
/// not `3.5`, `"3"` or `2^63`).
pub fn as_i64(v: &Val) -> Option<i64> {
    let Val::Num(n) = v else { return None };
    match n {
        Num::Int(_) | Num::BigInt(_) => n.as_isize().and_then(|i| i64::try_from(i).ok()),
        Num::Float(f) => f64_as_i64(*f),
        // Decimal literals that are not plain integers, e.g. `1.0` or `1e3`.
        Num::Dec(s) => s.parse::<f64>().ok().and_then(f64_as_i64),
    }
}

/// `f` as an `i64` if it is integral and in range; every such `f64` is exactly representable.
fn f64_as_i64(f: f64) -> Option<i64> {
    // -2^63 is representable exactly; 2^63 is the first value out of range.
    const LIMIT: f64 = 9_223_372_036_854_775_808.0;
    (f.fract() == 0.0 && (-LIMIT..LIMIT).contains(&f)).then_some(f as i64)
}

/// True for names usable as jq variables (`$` + identifier).
fn is_ident(name: &str) -> bool {
    let mut chars = name.chars();
    chars
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
}

/// The message of a jq exception the way jq prints it: a string error is shown raw, any other
/// error value as JSON followed by "(not a string)". Type errors quote the offending value,
/// which may be a whole record, so messages are cut at [`MAX_MESSAGE`] characters.
fn exception_message(exn: jaq_core::Exn<'_, Val>) -> String {
    let mut message = match exn.get_err() {
        Ok(err) => match err.into_val() {
            Val::TStr(s) | Val::BStr(s) => String::from_utf8_lossy(&s).into_owned(),
            v => format!("{v} (not a string)"),
        },
        Err(exn) => match exn.get_halt() {
            Ok(code) => format!("halt({code}) is not allowed in a stream expression"),
            // Break/tail-call exceptions never escape a well-formed main filter.
            Err(_) => "internal jaq control flow escaped the expression".to_owned(),
        },
    };
    if let Some((cut, _)) = message.char_indices().nth(MAX_MESSAGE) {
        message.truncate(cut);
        message.push('…');
    }
    message
}

/// Renders the position of `part`, a slice of `src`, as " at column C" (or " at line L, column
/// C" for multi-line expressions); empty if `part` does not point into `src`.
fn position(src: &str, part: &str) -> String {
    let (start, at) = (src.as_ptr() as usize, part.as_ptr() as usize);
    if at < start || at + part.len() > start + src.len() {
        return String::new();
    }
    let before = &src[..at - start];
    let column = before.rsplit('\n').next().map_or(0, |l| l.chars().count()) + 1;
    if src.contains('\n') {
        let line = before.matches('\n').count() + 1;
        format!(" at line {line}, column {column}")
    } else {
        format!(" at column {column}")
    }
}

/// Describes what the lexer or parser did not like; several errors are joined by "; ".
fn load_errors(src: &str, errs: load::Errors<&str, ()>) -> String {
    let mut out = Vec::new();
    for (_file, err) in errs {
        match err {
            load::Error::Io(errs) => out.extend(
                errs.into_iter()
                    .map(|(path, e)| format!("cannot import {path:?}: {e}")),
            ),
            load::Error::Lex(errs) => out.extend(errs.into_iter().map(|(expect, rest)| {
                let at = position(src, rest);
                match (&expect, rest.chars().next()) {
                    (lex::Expect::Delim(open), next) => {
                        let (what, open_at) = (expect.as_str(), position(src, open));
                        match next {
                            Some(c) => {
                                format!("expected {what} for `{open}`{open_at}, found `{c}`{at}")
                            }
                            None => format!(
                                "expected {what} for `{open}`{open_at}, but the expression ended"
                            ),
                        }
                    }
                    (lex::Expect::Token, Some(c)) => format!("unexpected character `{c}`{at}"),
                    _ => format!("expected {}{at}", expect.as_str()),
                }
            })),
            load::Error::Parse(errs) => out.extend(errs.into_iter().map(|(expect, found)| {
                if found.is_empty() {
                    format!("expected {}, but the expression ended", expect.as_str())
                } else {
                    let at = position(src, found);
                    format!("expected {} but found `{found}`{at}", expect.as_str())
                }
            })),
        }
    }
    out.join("; ")
}

/// Describes undefined variables and filters; several errors are joined by "; ".
fn compile_errors(src: &str, errs: compile::Errors<&str, ()>) -> String {
    let mut out = Vec::new();
    for (_file, errs) in errs {
        for (name, undefined) in errs {
            let mut msg = String::new();
            // Writing to a String cannot fail.
            let _ = match undefined {
                compile::Undefined::Filter(arity) => {
                    write!(msg, "undefined filter {name}/{arity}")
                }
                other => write!(msg, "undefined {} {name}", other.as_str()),
            };
            msg.push_str(&position(src, name));
            out.push(msg);
        }
    }
    out.join("; ")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn json(s: &str) -> Val {
        jaq_json::read::parse_single(s.as_bytes()).expect("test JSON")
    }

    fn str_val(s: &str) -> Val {
        Val::from(s.to_owned())
    }

    fn compile_err(src: &str, vars: &[&str]) -> String {
        match Expr::compile(src, vars) {
            Ok(_) => panic!("{src:?} compiled"),
            Err(e) => {
                assert!(matches!(e, ExprError::Compile { .. }), "{e:?}");
                e.to_string()
            }
        }
    }

    #[test]
    fn expr_is_send_sync_and_cheap_to_clone() {
        fn send_sync<T: Send + Sync + Clone + 'static>() {}
        send_sync::<Expr>();
        let e = Expr::compile(".", &[]).unwrap();
        let c = e.clone();
        assert!(Arc::ptr_eq(&e.0, &c.0));
        assert_eq!(c.source(), ".");
        assert_eq!(format!("{c:?}"), r#"Expr(".")"#);
    }

    #[test]
    fn filter_predicate() {
        let e = Expr::compile(".status == 200", &["key", "ts"]).unwrap();
        let vars = [str_val("k"), from_i64(0)];
        let ok = e.run(json(r#"{"status": 200, "x": 1}"#), &vars).unwrap();
        assert_eq!(ok, vec![Val::Bool(true)]);
        assert!(truthy(&ok[0]));
        let not = e.run(json(r#"{"status": 404}"#), &vars).unwrap();
        assert_eq!(not, vec![Val::Bool(false)]);
        assert!(!truthy(&not[0]));
    }

    #[test]
    fn aggregate_with_agg_bound() {
        let e = Expr::compile("$agg + .amount", &["key", "ts", "agg"]).unwrap();
        let vars = [str_val("k"), from_i64(1), from_i64(10)];
        let out = e.one(json(r#"{"amount": 5}"#), &vars).unwrap();
        assert_eq!(out, from_i64(15));
        // An absent amount is null, the neutral element of `+`.
        assert_eq!(e.one(json("{}"), &vars).unwrap(), from_i64(10));
    }

    #[test]
    fn rekey_by_user() {
        let e = Expr::compile(".user", &["key", "ts"]).unwrap();
        let vars = [Val::Null, from_i64(0)];
        let key = e.one(json(r#"{"user": "alice", "n": 1}"#), &vars).unwrap();
        assert_eq!(key, str_val("alice"));
    }

    #[test]
    fn key_and_ts_variables() {
        let vars = [str_val("user-7"), from_i64(1_700_000_000_123)];
        let key = Expr::compile("$key", &["key", "ts"]).unwrap();
        assert_eq!(key.one(Val::Null, &vars).unwrap(), str_val("user-7"));
        let ts = Expr::compile("$ts", &["key", "ts"]).unwrap();
        let got = ts.one(Val::Null, &vars).unwrap();
        assert_eq!(as_i64(&got), Some(1_700_000_000_123));
        let both = Expr::compile("{k: $key, t: ($ts / 1000 | floor)}", &["key", "ts"]).unwrap();
        let got = both.one(Val::Null, &vars).unwrap();
        assert_eq!(got, json(r#"{"k": "user-7", "t": 1700000000}"#));
    }

    #[test]
    fn compile_error_quotes_expression_and_position() {
        let msg = compile_err(".foo | bar(", &[]);
        assert_eq!(
            msg,
            "invalid jq expression `.foo | bar(`: expected closing parenthesis for `(` at \
             column 11, but the expression ended"
        );
        let msg = compile_err(".foo | bar(1)", &[]);
        assert_eq!(
            msg,
            "invalid jq expression `.foo | bar(1)`: undefined filter bar/1 at column 8"
        );
        let msg = compile_err("if . then 1", &[]);
        assert!(
            msg.ends_with("expected else or end, but the expression ended"),
            "{msg}"
        );
        let msg = compile_err(".a & 1", &[]);
        assert!(
            msg.ends_with("unexpected character `&` at column 4"),
            "{msg}"
        );
        let msg = compile_err("[1, 2)", &[]);
        assert!(msg.contains("expected"), "{msg}");
        let msg = compile_err("", &[]);
        assert!(
            msg.ends_with("expected term, but the expression ended"),
            "{msg}"
        );
    }

    #[test]
    fn undefined_variable_is_a_compile_error() {
        let msg = compile_err("$nope", &["key", "ts"]);
        assert_eq!(
            msg,
            "invalid jq expression `$nope`: undefined variable $nope at column 1"
        );
        let msg = compile_err(".a +\n  $nope", &[]);
        assert!(
            msg.ends_with("undefined variable $nope at line 2, column 3"),
            "{msg}"
        );
        // Declared variables resolve; `$agg` is only known where it is declared.
        assert!(Expr::compile("$agg", &["agg"]).is_ok());
        assert!(compile_err("$agg", &["key"]).contains("undefined variable $agg"));
    }

    #[test]
    fn invalid_variable_names_are_rejected() {
        let msg = compile_err(".", &["$key"]);
        assert!(msg.ends_with(r#"invalid variable name "$key""#), "{msg}");
        assert!(compile_err(".", &["1x"]).contains("invalid variable name"));
        assert!(compile_err(".", &[""]).contains("invalid variable name"));
    }

    #[test]
    fn runtime_error_carries_jq_message() {
        let e = Expr::compile(".a + 1", &[]).unwrap();
        let err = e.run(json(r#"{"a": "x"}"#), &[]).unwrap_err();
        assert!(matches!(err, ExprError::Runtime { .. }), "{err:?}");
        assert_eq!(
            err.to_string(),
            r#"jq expression `.a + 1` failed: cannot calculate "x" + 1"#
        );
        let e = Expr::compile(r#"error("boom")"#, &[]).unwrap();
        let err = e.one(Val::Null, &[]).unwrap_err();
        assert_eq!(
            err.to_string(),
            r#"jq expression `error("boom")` failed: boom"#
        );
        let e = Expr::compile("error({a: 1})", &[]).unwrap();
        let err = e.one(Val::Null, &[]).unwrap_err();
        assert!(
            err.to_string().ends_with(r#"{"a":1} (not a string)"#),
            "{err}"
        );
        // Errors caught inside the expression are not errors.
        let e = Expr::compile("try error(\"x\") catch .", &[]).unwrap();
        assert_eq!(e.one(Val::Null, &[]).unwrap(), str_val("x"));
    }

    #[test]
    fn runtime_errors_quoting_huge_values_are_cut() {
        let e = Expr::compile(". + 1", &[]).unwrap();
        let err = e.run(json(&format!(r#"{{"a": "{}"}}"#, "x".repeat(5000))), &[]);
        let msg = err.unwrap_err().to_string();
        assert!(msg.starts_with(r#"jq expression `. + 1` failed: cannot calculate {"a":"xxx"#));
        assert!(
            msg.ends_with('…') && msg.chars().count() < MAX_MESSAGE + 50,
            "{msg}"
        );
    }

    #[test]
    fn runtime_error_after_outputs_aborts() {
        let e = Expr::compile(".[] | 10 / .", &[]).unwrap();
        let err = e.run(json(r#"[1, 2, "x", 5]"#), &[]).unwrap_err();
        assert!(
            err.to_string().contains("cannot calculate 10 / \"x\""),
            "{err}"
        );
    }

    #[test]
    fn halt_fails_instead_of_exiting() {
        for src in ["halt", "halt_error", "halt_error(1)"] {
            let e = Expr::compile(src, &[]).unwrap();
            let err = e.run(str_val("bye"), &[]).unwrap_err();
            assert!(err.to_string().contains("is not allowed"), "{err}");
        }
    }

    #[test]
    fn multiple_outputs() {
        let e = Expr::compile(".[]", &[]).unwrap();
        let out = e.run(json(r#"[1, "two", {"three": 3}]"#), &[]).unwrap();
        assert_eq!(
            out,
            vec![from_i64(1), str_val("two"), json(r#"{"three": 3}"#)]
        );
        assert!(e.run(json("[]"), &[]).unwrap().is_empty());
        let err = e.one(json("[1, 2]"), &[]).unwrap_err();
        assert_eq!(
            err.to_string(),
            "jq expression `.[]` produced more than one value"
        );
        let err = e.one(json("[]"), &[]).unwrap_err();
        assert_eq!(err.to_string(), "jq expression `.[]` produced no value");
        let e = Expr::compile("select(.ok)", &[]).unwrap();
        assert!(matches!(
            e.one(json("{}"), &[]),
            Err(ExprError::NoValue { .. })
        ));
    }

    #[test]
    fn output_explosion_is_bounded() {
        let e = Expr::compile("repeat(1)", &[]).unwrap();
        let err = e.run(Val::Null, &[]).unwrap_err();
        assert!(matches!(err, ExprError::TooManyValues { .. }), "{err:?}");
    }

    #[test]
    fn wrong_number_of_variables() {
        let e = Expr::compile("$key", &["key", "ts"]).unwrap();
        let err = e.run(Val::Null, &[Val::Null]).unwrap_err();
        assert_eq!(
            err.to_string(),
            "jq expression `$key` was compiled with 2 variables but run with 1"
        );
    }

    #[test]
    fn standard_library_is_available() {
        let cases = [
            (".[] | select(. > 1)", "[1, 2, 3]", vec!["2", "3"]),
            ("map(. * 2)", "[1, 2]", vec!["[2, 4]"]),
            ("length", r#"{"a": 1, "b": 2}"#, vec!["2"]),
            ("tostring", "12", vec![r#""12""#]),
            ("ascii_downcase", r#""HeLLo""#, vec![r#""hello""#]),
            (r#".a // "x""#, "{}", vec![r#""x""#]),
            (r#".a // "x""#, r#"{"a": false}"#, vec![r#""x""#]),
            (r#"test("^a.c$")"#, r#""abc""#, vec!["true"]),
            ("keys", r#"{"b": 1, "a": 2}"#, vec![r#"["a", "b"]"#]),
            (
                "to_entries | from_entries",
                r#"{"a": 1}"#,
                vec![r#"{"a": 1}"#],
            ),
            ("add", "[1, 2, 3]", vec!["6"]),
            ("tojson | fromjson", "[1]", vec!["[1]"]),
            ("split(\",\") | join(\"-\")", r#""a,b""#, vec![r#""a-b""#]),
            ("@base64", r#""hi""#, vec![r#""aGk=""#]),
            (r#"sub("a"; "b")"#, r#""aa""#, vec![r#""ba""#]),
            ("has(\"a\")", r#"{"a": null}"#, vec!["true"]),
            ("[limit(2; .[])]", "[1, 2, 3]", vec!["[1, 2]"]),
            ("reduce .[] as $x (0; . + $x)", "[1, 2, 3]", vec!["6"]),
            (
                "ltrimstr(\"x\") | ascii_upcase",
                r#""xab""#,
                vec![r#""AB""#],
            ),
            ("type", "null", vec![r#""null""#]),
        ];
        for (src, input, expected) in cases {
            let e = Expr::compile(src, &[]).unwrap_or_else(|e| panic!("{e}"));
            let out = e.run(json(input), &[]).unwrap_or_else(|e| panic!("{e}"));
            let expected: Vec<Val> = expected.into_iter().map(json).collect();
            assert_eq!(out, expected, "{src} on {input}");
        }
    }

    #[test]
    fn environment_is_not_exposed() {
        assert!(compile_err("env", &[]).contains("undefined filter env/0"));
        assert!(compile_err("$ENV", &[]).contains("undefined variable $ENV"));
        assert!(compile_err("input", &[]).contains("undefined filter input/0"));
        assert!(compile_err(r#"import "x" as x; ."#, &[]).contains("cannot import"));
    }

    #[test]
    fn integers() {
        for n in [0, 1, -1, 42, i64::MAX, i64::MIN] {
            assert_eq!(as_i64(&from_i64(n)), Some(n));
        }
        assert_eq!(as_i64(&json("3.0")), Some(3));
        assert_eq!(as_i64(&json("1e3")), Some(1000));
        assert_eq!(as_i64(&Val::from(-7.0)), Some(-7));
        assert_eq!(as_i64(&json("3.5")), None);
        assert_eq!(as_i64(&Val::from(f64::NAN)), None);
        assert_eq!(as_i64(&Val::from(f64::INFINITY)), None);
        assert_eq!(as_i64(&json("9223372036854775808")), None);
        assert_eq!(as_i64(&json("-9223372036854775808")), Some(i64::MIN));
        assert_eq!(as_i64(&Val::from(2f64.powi(63))), None);
        assert_eq!(as_i64(&str_val("3")), None);
        assert_eq!(as_i64(&Val::Null), None);
        let e = Expr::compile(". * 2", &[]).unwrap();
        assert_eq!(as_i64(&e.one(from_i64(21), &[]).unwrap()), Some(42));
    }

    #[test]
    fn truthiness() {
        assert!(!truthy(&Val::Null));
        assert!(!truthy(&Val::Bool(false)));
        assert!(truthy(&Val::Bool(true)));
        assert!(truthy(&from_i64(0)));
        assert!(truthy(&str_val("")));
        assert!(truthy(&json("[]")));
    }
}
