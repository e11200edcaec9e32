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
//! in, outputs out), `import`/`include`/`module` directives are refused, and `halt`/`halt_error`
//! fail the expression instead of exiting the process.
//!
//! Evaluation is bounded, so that one hostile record cannot hang or crash the worker: each
//! evaluation has a time budget ([`Expr::with_time_budget`], default [`DEFAULT_TIME_BUDGET`])
//! and a share of the thread's native stack (see [`budget`] and [`instrument`]), JSON text is
//! nested at most [`crate::format::MAX_DEPTH`] levels (records, `fromjson`, `tojson`), and
//! one evaluation yields at most [`MAX_OUTPUTS`] values. Exceeding any of them is an error
//! for that record, which `onError` handles.

pub mod budget;
mod fast;
mod instrument;

pub use fast::Input;
use std::fmt::Write as _;
use std::sync::Arc;
use std::time::Duration;

use jaq_core::load::parse::{Def, Term};
use jaq_core::load::{self, Arena, File, Lexer, Loader, Parser, lex};
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

/// Time one evaluation of an expression may take unless the app says otherwise
/// (`spec.expressionTimeoutMs`).
pub const DEFAULT_TIME_BUDGET: Duration = Duration::from_secs(1);

/// The definition the user's (rewritten) expression becomes; the program calls it.
const MAIN: &str = "__eddy_expression";

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
    /// Evaluation ran longer than the expression's time budget.
    #[error(
        "jq expression `{expr}` exceeded its time budget of {budget_ms} ms on this record: it \
         loops on this data, or needs more work than the budget allows (if the work is \
         legitimate, raise spec.expressionTimeoutMs)"
    )]
    TimeBudget { expr: String, budget_ms: u128 },
    /// Evaluation recursed deeper than its share of the native stack.
    #[error(
        "jq expression `{expr}` recursed too deeply on this record (it needed more than \
         {stack_kib} KiB of native stack): a recursion that does not end, or one as deep as \
         the data"
    )]
    StackBudget { expr: String, stack_kib: usize },
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
pub struct Expr {
    compiled: Arc<Compiled>,
    budget: Duration,
}

struct Compiled {
    filter: Filter,
    /// The same expression for the direct evaluator, when it is inside its subset.
    fast: Option<fast::Fast>,
    source: String,
    vars: usize,
    /// How evaluations of this expression are reported (see [`budget::current`]).
    id: usize,
}

impl std::fmt::Debug for Expr {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("Expr").field(&self.compiled.source).finish()
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

        // The expression is parsed here rather than by jaq's loader, so that it can be
        // rewritten for the budget (see `instrument`) before it is compiled. It becomes the
        // last definition of the standard library, and the program calls it.
        let main = parse_term(src).map_err(|()| fail(parse_errors(src)))?;
        let library: Vec<_> = jaq_core::defs()
            .chain(jaq_std::defs())
            .chain(jaq_json::defs())
            .collect();
        let (lib, user) = instrument::Instrument::new(&library, &main);
        let defs = library.into_iter().map(|d| lib.def(d)).chain([Def {
            name: MAIN,
            args: Vec::new(),
            body: user.term(main),
        }]);
        let funs = jaq_core::funs::<Data>()
            .chain(jaq_std::funs())
            .chain(jaq_json::funs())
            .filter(|(name, args, _)| {
                !EXCLUDED_NATIVES.contains(name)
                    && !instrument::REPLACED.contains(&(*name, args.len()))
            })
            .chain(instrument::natives());

        let arena = Arena::default();
        let modules = Loader::new(defs)
            .load(
                &arena,
                File {
                    code: MAIN,
                    path: (),
                },
            )
            .map_err(|errs| fail(load_errors(src, errs)))?;
        let filter = jaq_core::Compiler::default()
            .with_funs(funs)
            .with_global_vars(globals.iter().map(String::as_str))
            .compile(modules)
            .map_err(|errs| fail(compile_errors(src, errs)))?;

        Ok(Expr {
            compiled: Arc::new(Compiled {
                filter,
                fast: fast::Fast::compile(src, vars),
                source: src.to_owned(),
                vars: vars.len(),
                id: budget::register(src),
            }),
            budget: DEFAULT_TIME_BUDGET,
        })
    }

    /// The same expression with `budget` as the time one evaluation may take.
    pub fn with_time_budget(mut self, budget: Duration) -> Expr {
        self.budget = budget;
        self
    }

    /// The time one evaluation may take.
    pub fn time_budget(&self) -> Duration {
        self.budget
    }

    /// All outputs of the filter for `input`, with `vars` bound positionally; the first runtime error aborts.
    pub fn run(&self, input: Val, vars: &[Val]) -> Result<Vec<Val>, ExprError> {
        let mut out = Vec::new();
        self.each(input, vars, |v| {
            if out.len() == MAX_OUTPUTS {
                return Err(ExprError::TooManyValues {
                    expr: self.compiled.source.clone(),
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
                    expr: self.compiled.source.clone(),
                });
            }
            first = Some(v);
            Ok(())
        })?;
        first.ok_or_else(|| ExprError::NoValue {
            expr: self.compiled.source.clone(),
        })
    }

    /// The one output computed directly from `input` (see [`fast`]), or `None` when the
    /// expression or the value needs jaq: then call [`Expr::one`] or [`Expr::run`].
    pub fn fast(&self, input: Input<'_>, vars: &[Val]) -> Option<Val> {
        if vars.len() != self.compiled.vars {
            return None;
        }
        let f = self.compiled.fast.as_ref()?;
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
        &self.compiled.source
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
        let compiled = &*self.compiled;
        if vars.len() != compiled.vars {
            return Err(ExprError::VarCount {
                expr: compiled.source.clone(),
                expected: compiled.vars,
                got: vars.len(),
            });
        }
        let eval = budget::Evaluation::start(self.budget, compiled.id);
        let ctx = Ctx::<Data>::new(&compiled.filter.lut, Vars::new(vars.iter().cloned()));
        let mut result = Ok(());
        for y in compiled.filter.id.run((ctx, input)) {
            result = match y {
                Ok(v) => f(v),
                Err(exn) => Err(ExprError::Runtime {
                    expr: compiled.source.clone(),
                    message: exception_message(exn),
                }),
            };
            if result.is_err() {
                break;
            }
        }
        // A bound beats whatever the evaluation made of the exception that stopped it.
        match eval.exceeded() {
            Some(budget::Exceeded::Time) => Err(ExprError::TimeBudget {
                expr: compiled.source.clone(),
                budget_ms: self.budget.as_millis(),
            }),
            Some(budget::Exceeded::Stack) => Err(ExprError::StackBudget {
                expr: compiled.source.clone(),
                stack_kib: eval.stack_room() >> 10,
            }),
            None => result,
        }
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
/// which may be a whole record (or a value jq nested deeper than any record), so messages are
/// rendered only up to [`MAX_MESSAGE`] characters.
fn exception_message(exn: jaq_core::Exn<'_, Val>) -> String {
    use crate::format::shorten;
    match exn.get_err() {
        // `error(v)` carries `v`; jaq's own errors are text with values inside, which
        // `into_val` would render in full.
        Ok(err) if shorten(&format_args!("{err:?}"), 10).starts_with("Error(Val(") => {
            match err.into_val() {
                Val::TStr(s) | Val::BStr(s) => shorten(&String::from_utf8_lossy(&s), MAX_MESSAGE),
                v => format!("{} (not a string)", shorten(&v, MAX_MESSAGE)),
            }
        }
        Ok(err) => shorten(&err, MAX_MESSAGE),
        Err(exn) => match exn.get_halt() {
            Ok(code) => format!("halt({code}) is not allowed in a stream expression"),
            // Break/tail-call exceptions never escape a well-formed main filter.
            Err(_) => "internal jaq control flow escaped the expression".to_owned(),
        },
    }
}

/// The expression as a term, or `Err` if it does not lex or parse as one (a term cannot
/// start with `import`, `include` or `module` either).
fn parse_term(src: &str) -> Result<Term<&str>, ()> {
    let tokens = Lexer::new(src).lex().map_err(drop)?;
    Parser::new(&tokens).parse(|p| p.term()).map_err(drop)
}

/// Why [`parse_term`] refused `src`, in the words of jaq's loader.
fn parse_errors(src: &str) -> String {
    let arena = Arena::default();
    match Loader::new([]).load(
        &arena,
        File {
            code: src,
            path: (),
        },
    ) {
        Err(errs) => load_errors(src, errs),
        Ok(_) => "`import`, `include` and `module` directives are not supported".to_owned(),
    }
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
        assert!(Arc::ptr_eq(&e.compiled, &c.compiled));
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
        let e = Expr::compile("repeat(1)", &[])
            .unwrap()
            .with_time_budget(Duration::from_secs(600));
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

    /// The expression compiled the way jaq's own loader does, without the budget rewrite.
    fn reference(src: &str) -> Filter {
        let defs = jaq_core::defs()
            .chain(jaq_std::defs())
            .chain(jaq_json::defs());
        let funs = jaq_core::funs::<Data>()
            .chain(jaq_std::funs())
            .chain(jaq_json::funs());
        let arena = Arena::default();
        let modules = Loader::new(defs)
            .load(
                &arena,
                File {
                    code: src,
                    path: (),
                },
            )
            .expect("reference parses");
        jaq_core::Compiler::default()
            .with_funs(funs)
            .compile(modules)
            .expect("reference compiles")
    }

    /// Outputs and the first error, as text.
    fn outputs(results: impl Iterator<Item = Result<Val, String>>) -> Vec<Result<Val, String>> {
        let mut out = Vec::new();
        for r in results {
            let stop = r.is_err();
            out.push(r);
            if stop || out.len() > 1000 {
                break;
            }
        }
        out
    }

    /// The rewrite for the budget changes no answer: paths, updates, tail calls, errors and
    /// their messages are what jaq gives without it.
    #[test]
    fn instrumented_programs_answer_as_jaq_does() {
        let exprs = [
            ".",
            ".a",
            ".[] | select(. > 1)",
            "map(. * 2)",
            "[.[] | . * 2]",
            "to_entries | from_entries",
            "with_entries(.value |= tostring)",
            "path(..)",
            "[paths]",
            "[paths(type == \"number\")]",
            "[leaf_paths]",
            "getpath([\"a\", \"b\"])",
            "setpath([\"a\", \"b\"]; 5)",
            "del(.a)",
            "delpaths([[\"a\"]])",
            "to_entries",
            ".a |= . + 1",
            ".[] |= . + 1",
            ".[] += 1",
            ".a.b //= 7",
            ".a = (1, 2)",
            "(.a, .b) = 3",
            "walk(if type == \"number\" then . + 1 else . end)",
            "[recurse]",
            "[recurse(.[]?; . != 3)]",
            "[limit(3; repeat(1))]",
            "first(range(10; 0; -3))",
            "[range(0; 10; 3)]",
            "[range(5)]",
            "[range(1; 2; 0.25)]",
            "[range(\"a\"; \"b\")]",
            "until(. > 100; . * 2)",
            "[while(. < 100; . * 2)]",
            "reduce .[] as $x (0; . + $x)",
            "[foreach .[] as $x (0; . + $x; [$x, .])]",
            "[.[] as [$a, $b] | {a: $a, b: $b}]",
            ". as {a: $x} | $x",
            "{a: .[], b: .[]}",
            "{(.[] | tostring): 1}",
            "{$__loc__}",
            "{a, \"b\", $__loc__}",
            "{(.[]?): .[]?}",
            "@base64 \"x\\(.)y\"",
            "@json \"\\(.[]?)\\(.[]?)\"",
            "getpath([\"a\"]) = 5",
            "[limit(2; .[]? | select(. != 1))]",
            "reduce .[]? as [$a, $b] (0; . + ($a // 0))",
            "[.[]? as [$a] | $a]",
            "if . then (.[]? // 0) end",
            "def f: def g: 3; g * 2; f",
            "[.[]?] | sort_by(tostring) | map(tojson)",
            "\"\\(.[]) and \\(.[])\"",
            "[.[] + .[]]",
            "[.[] as $x | .[] | select(. == $x)]",
            "if .[] then 1 elif . then 2 else 3 end",
            "[.[] | if . > 1 then \"big\" else \"small\" end]",
            "def f: if . > 3 then . else . + 1 | f end; f",
            "def fac: if . <= 1 then 1 else . * (. - 1 | fac) end; fac",
            "def f(g): [g, g]; f(.[])",
            "def f($a; $b): $a + $b; [f(.[]; .[])]",
            "try error(\"x\") catch .",
            "try (1, error(\"x\"), 3) catch .",
            "[.[] | try (if . == 2 then error(\"two\") else . end) catch \"caught\"]",
            ".a?",
            "[.[]?]",
            "(.a // 1), (null // 2)",
            "label $out | 1, break $out, 2",
            "[limit(2; .[])]",
            "isempty(empty)",
            "any(.[]; . > 2)",
            "all(. > 0)",
            "add",
            "join(\",\")",
            "tojson",
            "tojson | fromjson",
            "\"[1, 2] [3]\" | [fromjson]",
            "\"[1,\" | fromjson",
            "\"ab\" * 3",
            "3 * \"ab\"",
            "\"ab\" * 0",
            "\"ab\" * -1",
            "2 * 3",
            "{a: 1} * {b: 2}",
            ". * 2",
            "[splits(\", *\")]",
            "sub(\"a\"; \"b\")",
            "[match(\"a\"; \"g\").offset]",
            "ascii_downcase",
            "length",
            "keys",
            "[.[] | tostring]",
            "combinations",
            "[combinations(2)]",
            "transpose",
            "flatten",
            "unique_by(length)",
            "group_by(. % 2)",
            "min_by(.), max_by(.)",
            "indices(1)",
            "@base64",
            "@text \"v: \\(.)\"",
            "$__prog_args",
            ".a.b.c",
            ".[1:]",
            ".[-1]",
            "[.[] | numbers]",
            "splits(\"a\")",
            "error",
            "error(null)",
            "{} | .a.b |= 3",
            "[paths] | length",
            "pick(.a)",
            "[limit(0; 1, 2)]",
            "[skip(1; .[])]",
            "nth(1; .[])",
            "[.[] | ltrimstr(\"a\")]",
            "input_line_number",
            "now | type",
            "halt_error",
        ];
        let inputs = [
            "null",
            "1",
            "\"abc, a\"",
            "[1, 2, 3]",
            "[[1, 2], [3, 4]]",
            r#"{"a": {"b": 1}, "c": [1, {"d": 2}]}"#,
            r#"{"a": 1, "b": "x"}"#,
            "[\"a1\", \"b2\", \"a\"]",
        ];
        let mut compared = 0;
        for src in exprs {
            // Expressions our build refuses, or that read the clock, are not compared.
            let Ok(ours) = Expr::compile(src, &[]) else {
                continue;
            };
            if src.contains("now") {
                continue;
            }
            let theirs = reference(src);
            for input in inputs {
                let input = json(input);
                let ctx = Ctx::<Data>::new(&theirs.lut, Vars::new([]));
                let want = outputs(
                    theirs
                        .id
                        .run((ctx, input.clone()))
                        .map(|r| r.map_err(exception_message)),
                );
                let mut got = Vec::new();
                let result = ours.each(input.clone(), &[], |v| {
                    got.push(Ok(v));
                    if got.len() > 1000 {
                        return Err(ExprError::TooManyValues { expr: src.into() });
                    }
                    Ok(())
                });
                match result {
                    Ok(()) => {}
                    Err(ExprError::Runtime { message, .. }) => got.push(Err(message)),
                    Err(ExprError::TooManyValues { .. }) => {}
                    Err(e) => panic!("{src} on {input}: {e}"),
                }
                assert_eq!(got, want, "{src} on {input}");
                compared += 1;
            }
        }
        assert!(compared > 800, "{compared}");
    }

    fn over_budget(src: &str, input: &Val) -> ExprError {
        let e = Expr::compile(src, &[])
            .unwrap_or_else(|e| panic!("{e}"))
            .with_time_budget(Duration::from_millis(200));
        // `one`, not `run`: the output count must not stop an endless stream first.
        match e.one(input.clone(), &[]) {
            Err(e @ (ExprError::TimeBudget { .. } | ExprError::StackBudget { .. })) => e,
            other => panic!("{src} must exceed its budget, got {other:?}"),
        }
    }

    #[test]
    fn loops_on_a_record_exceed_the_time_budget() {
        // Cubic work on `big` and quadratic work on `huge` take far longer than the budget.
        let big = Val::from_iter((0..3000).map(|i| from_i64(i % 10)));
        let huge = Val::from_iter((0..100_000).map(|i| from_i64(i % 10)));
        let cases: &[(&str, Val)] = &[
            (
                ".step as $s | .n | until(. > 10; . + $s)",
                json(r#"{"n": 0, "step": 0}"#),
            ),
            ("[range(0; 10; 0)] | length", Val::Null),
            ("last(range(0; 10; 0))", Val::Null),
            ("last(repeat(.))", from_i64(1)),
            ("def f: f; f", Val::Null),
            ("def f: ., f; last(f)", Val::Null),
            ("last(range(1e12))", Val::Null),
            ("[range(1e9)] | length", Val::Null),
            ("[limit(1e9; repeat(1))] | length", Val::Null),
            ("last(recurse(. + 1))", from_i64(0)),
            ("last(while(true; .))", from_i64(0)),
            ("last(.[] as $a | .[] as $b | .[] | $a + $b)", big.clone()),
            ("last(.[] + .[] + .[])", big.clone()),
            ("last(.[] == .[] and .[] != null)", big.clone()),
            ("reduce (.[] as $a | .[]) as $b (0; . + $b)", huge.clone()),
            ("last(\"\\(.[])\\(.[])\\(.[])\")", big.clone()),
            ("last({a: .[], b: .[], c: .[]})", big.clone()),
            ("last(if .[] then .[] else 0 end)", huge.clone()),
            (". as $x | last($x[] as $y | $x[] | $y)", huge.clone()),
            ("def f($a; $b; $c): 1; last(f(.[]; .[]; .[]))", big.clone()),
            ("last(.[] as $x | .[] as $y | .[] |= $x + $y)", big.clone()),
            ("last(.[] as $x | .[] += .[])", big.clone()),
            // jq code cannot catch the budget.
            ("try until(false; .) catch \"caught\"", from_i64(1)),
            ("(repeat(1) | select(false))?", from_i64(1)),
            ("[.[] | try (0 | until(false; .)) catch 0]", json("[1, 2]")),
            ("first(repeat(1) | select(false)) // 1", Val::Null),
            ("label $out | repeat(1) | select(false)", Val::Null),
            ("def f: try f catch f; f", Val::Null),
            ("def f: (f)? // 1; f", Val::Null),
            ("[paths] as $p | until(false; $p)", big.clone()),
        ];
        for (src, input) in cases {
            let err = over_budget(src, input);
            if let ExprError::TimeBudget { .. } = err {
                let msg = err.to_string();
                assert!(
                    msg.contains("exceeded its time budget of 200 ms on this record"),
                    "{msg}"
                );
            }
        }
    }

    #[test]
    fn deep_recursion_is_an_error_not_a_crash() {
        for stack in [2 << 20, 256 << 20] {
            let run = move || {
                for src in [
                    "def f: 1 + f; f",
                    "def f: [f]; f",
                    "def f: f | f; f",
                    "def f: {a: f}; f",
                    "def f: try (1 + f) catch f; f",
                ] {
                    let e = Expr::compile(src, &[])
                        .expect("compiles")
                        .with_time_budget(Duration::from_secs(20));
                    assert!(
                        matches!(
                            e.one(Val::Null, &[]),
                            Err(ExprError::StackBudget { .. } | ExprError::TimeBudget { .. })
                        ),
                        "{src}"
                    );
                }
                // Legitimate recursion works as deep as the stack allows.
                let sum = Expr::compile(
                    "def s: if length == 0 then 0 else .[0] + (.[1:] | s) end; s",
                    &[],
                )
                .expect("compiles")
                .with_time_budget(Duration::from_secs(60));
                let input = Val::from_iter((0..100).map(|_| from_i64(1)));
                assert_eq!(sum.one(input, &[]).expect("sums"), from_i64(100));
                let mut deepest = 0;
                for n in [300, 1000, 3000, 10_000] {
                    let input = Val::from_iter((0..n).map(|_| from_i64(1)));
                    match sum.one(input, &[]) {
                        Ok(v) => {
                            assert_eq!(v, from_i64(n));
                            deepest = n;
                        }
                        Err(e) => {
                            assert!(matches!(e, ExprError::StackBudget { .. }), "{e}");
                            break;
                        }
                    }
                }
                // About 3 KiB a level: the processing thread's 64 MiB go 20000 deep.
                assert!(stack < 256 << 20 || deepest == 10_000, "{deepest}");
            };
            std::thread::Builder::new()
                .stack_size(stack)
                .spawn(run)
                .expect("thread")
                .join()
                .expect("no crash");
        }
    }

    #[test]
    fn deep_json_text_is_refused_by_fromjson() {
        let e = Expr::compile("fromjson", &[]).unwrap();
        let deep = "[".repeat(100_000) + &"]".repeat(100_000);
        let err = e.one(Val::from(deep), &[]).unwrap_err().to_string();
        assert!(
            err.ends_with("nested deeper than 256 levels as JSON"),
            "{err}"
        );
        let ok = "[".repeat(256) + &"]".repeat(256);
        assert!(e.one(Val::from(ok), &[]).is_ok());
    }

    #[test]
    fn deep_values_built_by_jq_are_refused_by_tojson_and_quoted_briefly() {
        // Dropping a value recurses per level: run where the worker runs expressions, on a
        // stack as large as the processing thread's.
        let run = || {
            let e = Expr::compile("reduce range(100000) as $i (0; [.]) | tojson", &[]).unwrap();
            let err = e.one(Val::Null, &[]).unwrap_err().to_string();
            assert!(
                err.ends_with("nested deeper than 256 levels as JSON"),
                "{err}"
            );
            // Error messages render at most MAX_MESSAGE characters of any value.
            let e = Expr::compile("reduce range(100000) as $i (0; [.]) | . + 1", &[]).unwrap();
            let err = e.one(Val::Null, &[]).unwrap_err().to_string();
            assert!(
                err.contains("cannot calculate [[[[") && err.ends_with('…'),
                "{err}"
            );
            assert!(err.chars().count() < MAX_MESSAGE + 100, "{err}");
        };
        std::thread::Builder::new()
            .stack_size(256 << 20)
            .spawn(run)
            .expect("thread")
            .join()
            .expect("no crash");
    }

    #[test]
    fn huge_string_repetition_is_refused() {
        let e = Expr::compile(". * .n | length", &[]).unwrap();
        let err = e.one(json(r#"{"n": 1}"#), &[]);
        assert!(
            err.is_err(),
            "an object times an object is an error: {err:?}"
        );
        let e = Expr::compile(r#""ab" * .n | length"#, &[]).unwrap();
        assert_eq!(e.one(json(r#"{"n": 3}"#), &[]).unwrap(), from_i64(6));
        for n in ["1000000000000", "100000000000000000000000000000"] {
            let err = e.one(json(&format!(r#"{{"n": {n}}}"#)), &[]).unwrap_err();
            assert!(
                err.to_string()
                    .contains("cannot repeat a string of 2 bytes that often"),
                "{err}"
            );
        }
    }

    #[test]
    fn module_directives_are_refused() {
        let msg = compile_err(r#"import "x" as $x; ."#, &[]);
        assert!(msg.contains("directives are not supported"), "{msg}");
        assert!(compile_err(r#"include "x"; ."#, &[]).contains("cannot import"));
        // The names the rewrite adds are not reachable.
        let msg = compile_err("!tick", &[]);
        assert!(msg.starts_with("invalid jq expression `!tick`"), "{msg}");
    }

    /// Rough cost of the budget on jaq's path; run with
    /// `cargo test --release -p eddy-worker -- --ignored --nocapture budget_cost`.
    #[test]
    #[ignore]
    fn budget_cost() {
        use std::time::Instant;
        let input = json(
            r#"{"user":"alice","status":200,"amount":12.5,"tags":["a","b","c"],"items":[{"p":1},{"p":2},{"p":3}],"ok":true}"#,
        );
        for src in [
            ".status == 200 and (.tags | length) > 1",
            "{user, total: (.items | map(.p) | add)}",
            "[.tags[] | ascii_upcase] | join(\",\")",
            ".items | map(select(.p > 1)) | length",
            "reduce .items[] as $i (0; . + $i.p)",
            "to_entries | map(select(.value != null)) | from_entries",
            "[range(1000)] | length",
            "def f: if . >= 1000 then . else . + 1 | f end; 0 | f",
        ] {
            let ours = Expr::compile(src, &[]).unwrap();
            let theirs = reference(src);
            // The machine is shared: alternate the two and keep the best round of each.
            let n = 2_000;
            let time = |f: &mut dyn FnMut()| {
                let start = Instant::now();
                for _ in 0..n {
                    f();
                }
                start.elapsed().as_nanos() / n
            };
            let (mut with, mut without) = (u128::MAX, u128::MAX);
            for _ in 0..15 {
                with = with.min(time(&mut || {
                    std::hint::black_box(ours.run(input.clone(), &[]).unwrap());
                }));
                without = without.min(time(&mut || {
                    let ctx = Ctx::<Data>::new(&theirs.lut, Vars::new([]));
                    let out: Vec<_> = theirs.id.run((ctx, input.clone())).collect();
                    std::hint::black_box(out);
                }));
            }
            let extra = (with as f64 / without as f64 - 1.0) * 100.0;
            println!("{src}: {without} ns plain jaq, {with} ns with the budget ({extra:+.0}%)");
        }
    }

    /// How deep jq builds a value within the default budget, and what dropping it costs;
    /// run with `cargo test --release -p eddy-worker -- --ignored --nocapture nesting_rate`.
    #[test]
    #[ignore]
    fn nesting_rate() {
        let hwm = || {
            std::fs::read_to_string("/proc/self/status")
                .unwrap_or_default()
                .lines()
                .find(|l| l.starts_with("VmHWM"))
                .unwrap_or_default()
                .to_string()
        };
        let e = Expr::compile("reduce range(.) as $i (0; [.]) | length", &[]).unwrap();
        let start = std::time::Instant::now();
        std::thread::Builder::new()
            .stack_size(1 << 30)
            .spawn(move || drop(e.one(from_i64(1_000_000), &[]).unwrap()))
            .unwrap()
            .join()
            .unwrap();
        println!("1M levels built and dropped in {:?}", start.elapsed());
        for stack in [2usize << 20, 8 << 20, 32 << 20] {
            for depth in [10_000, 30_000, 100_000, 300_000] {
                let e = Expr::compile("reduce range(.) as $i (0; [.]) | length", &[]).unwrap();
                let ok = std::process::Command::new(std::env::current_exe().unwrap())
                    .args([
                        "--ignored",
                        "--exact",
                        "expr::tests::drop_child",
                        "--nocapture",
                    ])
                    .env("DROP_DEPTH", depth.to_string())
                    .env("DROP_STACK", stack.to_string())
                    .output()
                    .unwrap()
                    .status
                    .success();
                drop(e);
                println!(
                    "stack {} MiB, depth {depth}: {}",
                    stack >> 20,
                    if ok { "ok" } else { "overflow" }
                );
            }
        }
        for src in [
            "def f(g): f(g + 1); f(1)",
            "[range(1e9)] | length",
            "reduce range(1e9) as $i (0; [.]) | length",
            "def f(n): if n > 100000000 then . else f(n + 1) end; f(0)",
        ] {
            let e = Expr::compile(src, &[]).unwrap();
            let start = std::time::Instant::now();
            let r = std::thread::Builder::new()
                .stack_size(256 << 20)
                .spawn(move || e.one(Val::Null, &[]).map(drop).map_err(|e| e.to_string()))
                .unwrap()
                .join();
            println!(
                "{src}: {:?} in {:?}, {}",
                r.map(|r| r.err()),
                start.elapsed(),
                hwm()
            );
        }
    }

    #[test]
    #[ignore]
    fn drop_child() {
        let depth: i64 = std::env::var("DROP_DEPTH").map_or(0, |d| d.parse().unwrap());
        let stack: usize = std::env::var("DROP_STACK").map_or(0, |d| d.parse().unwrap());
        let e = Expr::compile("reduce range(.) as $i (0; [.]) | length", &[]).unwrap();
        std::thread::Builder::new()
            .stack_size(stack)
            .spawn(move || drop(e.one(from_i64(depth), &[]).unwrap()))
            .unwrap()
            .join()
            .unwrap();
    }
}
