//! Rewrites a parsed jq program (the user's expression and jq's standard library alike) so
//! that every loop passes through the budget check of [`super::budget`], and adds the natives
//! that guard what the rewrite cannot reach.
//!
//! jq loops in three ways, and each gets a tick:
//! - recursion (`until`, `while`, `repeat`, `recurse`, recursive user definitions): the body
//!   of every definition that may call itself, directly or not, starts with a tick;
//! - products, where a term runs once per output of another (`l | r`, `l as $x | r`,
//!   `l + r`, `reduce xs as $x (...; update)`, `if c then ...`, `{a: l, b: r}`, `"\(l)\(r)"`,
//!   `f(l; r)`, `l |= r`): the inner term gets a tick when the outer one may yield more than
//!   one output and the inner one is not constant work;
//! - native generators: `range/3` ticks for each output.
//!
//! So between two ticks an evaluation does at most one pass over the data per term of the
//! expression, and the clock, read every [`budget::CLOCK_EVERY`] ticks, is never far behind.
//!
//! A tick is a native filter named `!tick`, which user programs can neither call nor shadow
//! (`!` cannot start an identifier), placed as `!tick | t`. `|` keeps `t` in tail position, so
//! tail-call optimisation is unaffected, and the tick passes paths and updates through, so
//! `path(...)`, `|=` and friends behave as before.
//!
//! Replaced natives: `fromjson` and `tojson` refuse values nested deeper than
//! [`MAX_DEPTH`] (jaq-json's reader and writer recurse per level), and `*` refuses string
//! repetitions longer than [`MAX_REPEAT`] bytes (one allocation the time budget cannot stop).

use super::Data;
use super::budget::{self, Exceeded};
use crate::format::{self, MAX_DEPTH};
use jaq_core::box_iter::box_once;
use jaq_core::load::lex::StrPart;
use jaq_core::load::parse::{BinaryOp, Def, Pattern, Term};
use jaq_core::native::{Fun, v};
use jaq_core::ops::Math;
use jaq_core::path::{Opt, Part, Path};
use jaq_core::{Cv, Error, Exn, Native, ValX, ValXs};
use jaq_json::{Num, Val};
use std::collections::{HashMap, HashSet};

/// Name of the budget check.
pub const TICK: &str = "!tick";
/// Name of the guarded `*`.
const MUL: &str = "!mul";

/// Longest string `*` may build, in bytes.
pub const MAX_REPEAT: usize = 64 << 20;

/// The exit code of the exception a tick raises; [`super::Expr`] tells it from a user's
/// `halt` by the thread's budget state, not by the code.
pub const HALT_CODE: i32 = i32::MIN;

/// Natives of jaq's libraries replaced by [`natives`].
pub const REPLACED: &[(&str, usize)] = &[("range", 3), ("tojson", 0), ("fromjson", 0)];

/// Builtins known to yield at most one output: (name, arity, and whether that needs every
/// argument to yield at most one). A user definition of the same name hides the entry.
const SINGLE: &[(&str, usize, bool)] = &[
    ("null", 0, false),
    ("true", 0, false),
    ("false", 0, false),
    ("not", 0, false),
    ("empty", 0, false),
    ("error", 0, false),
    ("length", 0, false),
    ("utf8bytelength", 0, false),
    ("keys", 0, false),
    ("keys_unsorted", 0, false),
    ("tostring", 0, false),
    ("tonumber", 0, false),
    ("tojson", 0, false),
    ("type", 0, false),
    ("ascii_downcase", 0, false),
    ("ascii_upcase", 0, false),
    ("floor", 0, false),
    ("ceil", 0, false),
    ("round", 0, false),
    ("sqrt", 0, false),
    ("abs", 0, false),
    ("add", 0, false),
    ("min", 0, false),
    ("max", 0, false),
    ("sort", 0, false),
    ("reverse", 0, false),
    ("unique", 0, false),
    ("to_entries", 0, false),
    ("from_entries", 0, false),
    ("first", 0, false),
    ("last", 0, false),
    ("explode", 0, false),
    ("implode", 0, false),
    ("trim", 0, false),
    ("ltrim", 0, false),
    ("rtrim", 0, false),
    ("any", 0, false),
    ("all", 0, false),
    ("flatten", 0, false),
    ("now", 0, false),
    ("todate", 0, false),
    ("fromdate", 0, false),
    ("first", 1, false),
    ("last", 1, false),
    ("isempty", 1, false),
    ("map", 1, false),
    ("map_values", 1, false),
    ("with_entries", 1, false),
    ("del", 1, false),
    ("sort_by", 1, false),
    ("group_by", 1, false),
    ("unique_by", 1, false),
    ("min_by", 1, false),
    ("max_by", 1, false),
    ("any", 1, false),
    ("all", 1, false),
    ("error", 1, true),
    ("select", 1, true),
    ("has", 1, true),
    ("contains", 1, true),
    ("inside", 1, true),
    ("startswith", 1, true),
    ("endswith", 1, true),
    ("ltrimstr", 1, true),
    ("rtrimstr", 1, true),
    ("split", 1, true),
    ("join", 1, true),
    ("test", 1, true),
    ("test", 2, true),
    ("index", 1, true),
    ("rindex", 1, true),
    ("indices", 1, true),
    ("getpath", 1, true),
    ("setpath", 2, true),
    ("delpaths", 1, true),
    ("sub", 2, true),
    ("gsub", 2, true),
    (MUL, 2, true),
];

/// Builtins that are constant work and call nothing that loops.
const CONSTANT: &[&str] = &["null", "true", "false", "not", "empty"];

/// A definition by name and arity: calls are matched to definitions this way, ignoring
/// scopes, which can only find more recursion than there is.
type Key<'s> = (&'s str, usize);

/// Rewrites programs.
#[derive(Clone)]
pub struct Instrument<'s> {
    /// Names the user's program defines, which hide builtins of the same name.
    user_defs: HashSet<&'s str>,
    /// Definitions that may call themselves, directly, through others or through filter
    /// arguments (whose terms sit in the body of a caller, so the caller's calls include
    /// them): only their bodies need a tick, since any endless chain of calls runs through
    /// one of them.
    recursive: HashSet<Key<'s>>,
}

impl<'s> Instrument<'s> {
    /// For the user's program `main` and the library definitions `library`; returns the
    /// rewriter for the library and the one for `main`.
    pub fn new(library: &[Def<&'s str>], main: &Term<&'s str>) -> (Self, Self) {
        let mut calls: HashMap<Key<'s>, HashSet<Key<'s>>> = HashMap::new();
        // (definition, whether it is the user's, its body); `None` for the main term.
        let mut todo: Vec<(Option<Key<'s>>, bool, &Term<&'s str>)> = library
            .iter()
            .map(|d| (Some((d.name, d.args.len())), false, &d.body))
            .chain([(None, true, main)])
            .collect();
        let mut user_defs = HashSet::new();
        while let Some((owner, user, t)) = todo.pop() {
            let mut nested = Vec::new();
            let mut called = HashSet::new();
            references(t, &mut called, &mut nested);
            for d in nested {
                if user {
                    user_defs.insert(d.name);
                }
                todo.push((Some((d.name, d.args.len())), user, &d.body));
            }
            if let Some(owner) = owner {
                calls.entry(owner).or_default().extend(called);
            }
        }
        let recursive = calls
            .keys()
            .filter(|k| reaches(&calls, k, k))
            .copied()
            .collect();
        let library = Instrument {
            user_defs: HashSet::new(),
            recursive,
        };
        let user = Instrument {
            user_defs,
            ..library.clone()
        };
        (library, user)
    }

    pub fn def(&self, d: Def<&'s str>) -> Def<&'s str> {
        let tick = self.recursive.contains(&(d.name, d.args.len()));
        let body = self.term(d.body);
        Def {
            name: d.name,
            args: d.args,
            body: if tick { ticked(body) } else { body },
        }
    }

    /// The rewritten `t`. Decisions look at the original subterms (the rewrite turns `*`
    /// into a call, which would look like unknown work).
    pub fn term(&self, t: Term<&'s str>) -> Term<&'s str> {
        match t {
            Term::Id | Term::Recurse | Term::Num(_) | Term::Var(_) | Term::Break(_) => t,
            Term::Str(fmt, parts) => {
                let terms: Vec<&Term<_>> = parts
                    .iter()
                    .filter_map(|p| match p {
                        StrPart::Term(t) => Some(t),
                        _ => None,
                    })
                    .collect();
                // Parts run once per combination of the outputs of the parts before them:
                // the last interpolation runs once per combination.
                let product = terms
                    .split_last()
                    .is_some_and(|(_, before)| !before.iter().all(|t| self.single(t)));
                let last = parts.iter().rposition(|p| matches!(p, StrPart::Term(_)));
                let parts = parts
                    .into_iter()
                    .enumerate()
                    .map(|(i, p)| match p {
                        StrPart::Term(t) => {
                            let t = self.term(t);
                            StrPart::Term(if product && Some(i) == last {
                                ticked(t)
                            } else {
                                t
                            })
                        }
                        StrPart::Str(s) => StrPart::Str(s),
                        StrPart::Char(c) => StrPart::Char(c),
                    })
                    .collect();
                Term::Str(fmt, parts)
            }
            Term::Arr(t) => Term::Arr(t.map(|t| Box::new(self.term(*t)))),
            Term::Obj(entries) => {
                // Entries combine like the parts of a string: the last runs per combination.
                let product = entries.split_last().is_some_and(|(_, before)| {
                    !before
                        .iter()
                        .all(|(k, v)| self.single(k) && v.as_ref().is_none_or(|v| self.single(v)))
                });
                let n = entries.len();
                let entries = entries
                    .into_iter()
                    .enumerate()
                    .map(|(i, (k, v))| {
                        let (k, v) = explicit_entry(k, v);
                        let v = self.term(v);
                        let v = if product && i + 1 == n { ticked(v) } else { v };
                        (self.term(k), Some(v))
                    })
                    .collect();
                Term::Obj(entries)
            }
            Term::Neg(t) => Term::Neg(Box::new(self.term(*t))),
            Term::BinOp(l, op, r) => self.binop(*l, op, *r),
            Term::Label(x, t) => Term::Label(x, Box::new(self.term(*t))),
            Term::Fold(name, xs, pat, args) => {
                // `init` runs once; `update` (and `foreach`'s extract) once per element.
                let per_element = !self.single(&xs);
                let args = args
                    .into_iter()
                    .enumerate()
                    .map(|(i, a)| {
                        let tick = i > 0 && per_element && !self.constant(&a);
                        let a = self.term(a);
                        if tick { ticked(a) } else { a }
                    })
                    .collect();
                Term::Fold(name, Box::new(self.term(*xs)), self.pattern(pat), args)
            }
            Term::TryCatch(t, c) => {
                Term::TryCatch(Box::new(self.term(*t)), c.map(|c| Box::new(self.term(*c))))
            }
            Term::IfThenElse(branches, otherwise) => {
                // Every branch after a condition with several outputs may run once per output.
                let product = !branches.iter().all(|(c, _)| self.single(c));
                let tick = |t: Term<&'s str>| {
                    let constant = self.constant(&t);
                    let t = self.term(t);
                    if product && !constant { ticked(t) } else { t }
                };
                let branches = branches
                    .into_iter()
                    .enumerate()
                    .map(|(i, (c, t))| (if i == 0 { self.term(c) } else { tick(c) }, tick(t)))
                    .collect();
                Term::IfThenElse(branches, otherwise.map(|t| Box::new(tick(*t))))
            }
            Term::Def(defs, t) => Term::Def(
                defs.into_iter().map(|d| self.def(d)).collect(),
                Box::new(self.term(*t)),
            ),
            Term::Call(name, args) => {
                // Each argument bound to a `$` parameter runs once per combination of the
                // arguments before it.
                let product = args
                    .split_last()
                    .is_some_and(|(_, before)| !before.iter().all(|a| self.single(a)));
                let n = args.len();
                let args = args
                    .into_iter()
                    .enumerate()
                    .map(|(i, a)| {
                        let a = self.term(a);
                        if product && i + 1 == n { ticked(a) } else { a }
                    })
                    .collect();
                Term::Call(name, args)
            }
            Term::Path(head, path) => {
                let parts = path
                    .0
                    .into_iter()
                    .map(|(p, opt)| {
                        let p = match p {
                            Part::Index(i) => Part::Index(self.term(i)),
                            Part::Range(from, upto) => {
                                Part::Range(from.map(|t| self.term(t)), upto.map(|t| self.term(t)))
                            }
                        };
                        (p, opt)
                    })
                    .collect();
                Term::Path(Box::new(self.term(*head)), Path(parts))
            }
        }
    }

    fn binop(&self, l: Term<&'s str>, op: BinaryOp<&'s str>, r: Term<&'s str>) -> Term<&'s str> {
        match op {
            // `r` runs once per output of `l`.
            BinaryOp::Pipe(_)
            | BinaryOp::Math(_)
            | BinaryOp::Cmp(_)
            | BinaryOp::And
            | BinaryOp::Or
            | BinaryOp::Update => {
                let tick = !self.single(&l) && !self.constant(&r);
                let (l, r) = (self.term(l), self.term(r));
                let r = if tick { ticked(r) } else { r };
                match op {
                    BinaryOp::Math(Math::Mul) => Term::Call(MUL, vec![l, r]),
                    BinaryOp::Pipe(pat) => Term::BinOp(
                        Box::new(l),
                        BinaryOp::Pipe(pat.map(|p| self.pattern(p))),
                        Box::new(r),
                    ),
                    op => Term::BinOp(Box::new(l), op, Box::new(r)),
                }
            }
            // The path `l` is updated once per output of `r`.
            BinaryOp::Assign | BinaryOp::UpdateMath(_) | BinaryOp::UpdateAlt => {
                let tick = !self.single(&r) && !self.constant(&l);
                let (l, r) = (self.term(l), self.term(r));
                let l = if tick { ticked(l) } else { l };
                Term::BinOp(Box::new(l), op, Box::new(r))
            }
            BinaryOp::Comma | BinaryOp::Alt => {
                Term::BinOp(Box::new(self.term(l)), op, Box::new(self.term(r)))
            }
        }
    }

    fn pattern(&self, p: Pattern<&'s str>) -> Pattern<&'s str> {
        match p {
            Pattern::Var(x) => Pattern::Var(x),
            Pattern::Arr(ps) => Pattern::Arr(ps.into_iter().map(|p| self.pattern(p)).collect()),
            Pattern::Obj(kps) => Pattern::Obj(
                kps.into_iter()
                    .map(|(k, p)| (self.term(k), self.pattern(p)))
                    .collect(),
            ),
        }
    }

    fn builtin(&self, name: &str) -> bool {
        !self.user_defs.contains(name)
    }

    /// True if `t` yields at most one output. Calls count as several unless listed in
    /// [`SINGLE`]; wrong answers must only ever be "several" (costing a tick).
    fn single(&self, t: &Term<&'s str>) -> bool {
        match t {
            Term::Id | Term::Num(_) | Term::Var(_) | Term::Break(_) | Term::Arr(_) => true,
            Term::Recurse => false,
            Term::Str(_, parts) => parts.iter().all(|p| match p {
                StrPart::Term(t) => self.single(t),
                _ => true,
            }),
            Term::Obj(entries) => entries
                .iter()
                .all(|(k, v)| self.single(k) && v.as_ref().is_none_or(|v| self.single(v))),
            Term::Neg(t) | Term::Label(_, t) => self.single(t),
            Term::BinOp(_, BinaryOp::Comma, _) => false,
            Term::BinOp(l, _, r) => self.single(l) && self.single(r),
            Term::Fold(name, _, _, args) => {
                *name == "reduce" && args.iter().all(|a| self.single(a))
            }
            Term::TryCatch(t, c) => self.single(t) && c.as_ref().is_none_or(|c| self.single(c)),
            Term::IfThenElse(branches, otherwise) => {
                branches
                    .iter()
                    .all(|(c, t)| self.single(c) && self.single(t))
                    && otherwise.as_ref().is_none_or(|t| self.single(t))
            }
            Term::Def(_, t) => self.single(t),
            Term::Call(name, args) => {
                self.builtin(name)
                    && SINGLE.iter().any(|(n, arity, args_single)| {
                        n == name
                            && *arity == args.len()
                            && (!args_single || args.iter().all(|a| self.single(a)))
                    })
            }
            Term::Path(head, path) => {
                self.single(head)
                    && path.0.iter().all(|(p, _)| match p {
                        Part::Index(i) => self.single(i),
                        Part::Range(None, None) => false,
                        Part::Range(from, upto) => {
                            from.as_ref().is_none_or(|t| self.single(t))
                                && upto.as_ref().is_none_or(|t| self.single(t))
                        }
                    })
            }
        }
    }

    /// True if `t` is constant work with at most one output: no loop, no product, no call
    /// other than [`CONSTANT`] builtins.
    fn constant(&self, t: &Term<&'s str>) -> bool {
        match t {
            Term::Id | Term::Num(_) | Term::Var(_) | Term::Break(_) => true,
            Term::Recurse | Term::Def(..) | Term::Fold(..) | Term::Label(..) => false,
            Term::Str(fmt, parts) => {
                fmt.is_none()
                    && parts.iter().all(|p| match p {
                        StrPart::Term(t) => self.constant(t),
                        _ => true,
                    })
            }
            Term::Arr(t) => t.as_ref().is_none_or(|t| self.constant(t)),
            Term::Obj(entries) => entries
                .iter()
                .all(|(k, v)| self.constant(k) && v.as_ref().is_none_or(|v| self.constant(v))),
            Term::Neg(t) => self.constant(t),
            Term::BinOp(l, op, r) => {
                matches!(
                    op,
                    BinaryOp::Math(_)
                        | BinaryOp::Cmp(_)
                        | BinaryOp::And
                        | BinaryOp::Or
                        | BinaryOp::Alt
                        | BinaryOp::Pipe(None)
                ) && self.constant(l)
                    && self.constant(r)
            }
            Term::TryCatch(t, c) => self.constant(t) && c.as_ref().is_none_or(|c| self.constant(c)),
            Term::IfThenElse(branches, otherwise) => {
                branches
                    .iter()
                    .all(|(c, t)| self.constant(c) && self.constant(t))
                    && otherwise.as_ref().is_none_or(|t| self.constant(t))
            }
            Term::Call(name, args) => {
                args.is_empty() && self.builtin(name) && CONSTANT.contains(name)
            }
            Term::Path(head, path) => {
                self.constant(head)
                    && path.0.iter().all(|(p, _)| match p {
                        Part::Index(i) => self.constant(i),
                        Part::Range(None, None) => false,
                        Part::Range(from, upto) => {
                            from.as_ref().is_none_or(|t| self.constant(t))
                                && upto.as_ref().is_none_or(|t| self.constant(t))
                        }
                    })
            }
        }
    }
}

/// `!tick | t`.
fn ticked(t: Term<&str>) -> Term<&str> {
    Term::BinOp(
        Box::new(Term::Call(TICK, Vec::new())),
        BinaryOp::Pipe(None),
        Box::new(t),
    )
}

/// An object entry with its value spelled out, as jaq's compiler reads the shorthands:
/// `{$x}` is `{"x": $x}` and `{k}` is `{k: .[k]}`.
fn explicit_entry<'s>(
    k: Term<&'s str>,
    v: Option<Term<&'s str>>,
) -> (Term<&'s str>, Term<&'s str>) {
    match (k, v) {
        (k, Some(v)) => (k, v),
        (Term::Var(x), None) => (
            Term::Str(None, vec![StrPart::Str(x.strip_prefix('$').unwrap_or(x))]),
            Term::Var(x),
        ),
        (k, None) => {
            let index = Path(vec![(Part::Index(k.clone()), Opt::Essential)]);
            (k, Term::Path(Box::new(Term::Id), index))
        }
    }
}

/// True if `to` can be reached from the definitions `from` calls.
fn reaches<'s>(calls: &HashMap<Key<'s>, HashSet<Key<'s>>>, from: &Key<'s>, to: &Key<'s>) -> bool {
    let mut seen = HashSet::new();
    let mut todo: Vec<&Key<'s>> = calls.get(from).into_iter().flatten().collect();
    while let Some(k) = todo.pop() {
        if k == to {
            return true;
        }
        if seen.insert(k) {
            todo.extend(calls.get(k).into_iter().flatten());
        }
    }
    false
}

/// Collects the calls `t` makes outside nested definitions, and those definitions.
fn references<'a, 's>(
    t: &'a Term<&'s str>,
    calls: &mut HashSet<Key<'s>>,
    defs: &mut Vec<&'a Def<&'s str>>,
) {
    let mut todo = vec![t];
    while let Some(t) = todo.pop() {
        match t {
            Term::Id | Term::Recurse | Term::Num(_) | Term::Var(_) | Term::Break(_) => {}
            Term::Str(fmt, parts) => {
                if let Some(fmt) = fmt {
                    calls.insert((fmt, 0));
                }
                todo.extend(parts.iter().filter_map(|p| match p {
                    StrPart::Term(t) => Some(t),
                    _ => None,
                }))
            }
            Term::Arr(t) => todo.extend(t.as_deref()),
            Term::Obj(entries) => {
                for (k, v) in entries {
                    todo.push(k);
                    todo.extend(v.as_ref());
                }
            }
            Term::Neg(t) | Term::Label(_, t) => todo.push(t),
            Term::BinOp(l, op, r) => {
                todo.push(l);
                todo.push(r);
                if let BinaryOp::Pipe(Some(p)) = op {
                    pattern_terms(p, &mut todo);
                }
            }
            Term::Fold(_, xs, p, args) => {
                todo.push(xs);
                todo.extend(args);
                pattern_terms(p, &mut todo);
            }
            Term::TryCatch(t, c) => {
                todo.push(t);
                todo.extend(c.as_deref());
            }
            Term::IfThenElse(branches, otherwise) => {
                for (c, t) in branches {
                    todo.push(c);
                    todo.push(t);
                }
                todo.extend(otherwise.as_deref());
            }
            Term::Def(nested, t) => {
                defs.extend(nested);
                todo.push(t);
            }
            Term::Call(name, args) => {
                calls.insert((name, args.len()));
                todo.extend(args);
            }
            Term::Path(head, path) => {
                todo.push(head);
                for (p, _) in &path.0 {
                    match p {
                        Part::Index(i) => todo.push(i),
                        Part::Range(from, upto) => {
                            todo.extend(from.as_ref());
                            todo.extend(upto.as_ref());
                        }
                    }
                }
            }
        }
    }
}

fn pattern_terms<'a, 's>(p: &'a Pattern<&'s str>, todo: &mut Vec<&'a Term<&'s str>>) {
    match p {
        Pattern::Var(_) => {}
        Pattern::Arr(ps) => ps.iter().for_each(|p| pattern_terms(p, todo)),
        Pattern::Obj(kps) => {
            for (k, p) in kps {
                todo.push(k);
                pattern_terms(p, todo);
            }
        }
    }
}

fn halt<'a>() -> Exn<'a, Val> {
    Exn::halt(HALT_CODE)
}

fn checked<'a, T: 'a>(x: T) -> ValXs<'a, T, Val> {
    box_once(match budget::tick() {
        Ok(()) => Ok(x),
        Err(Exceeded::Time | Exceeded::Stack) => Err(halt()),
    })
}

fn fail<'a>(msg: String) -> ValXs<'a, Val> {
    box_once(Err(Exn::from(Error::new(Val::from(msg)))))
}

/// The natives the rewritten programs call, and the replacements listed in [`REPLACED`].
pub fn natives() -> impl Iterator<Item = Fun<Data>> {
    let tick = Native::<Data>::new(|cv| checked(cv.1))
        .with_paths(|cv| checked(cv.1))
        .with_update(|cv, f| match budget::tick() {
            Ok(()) => f(cv.1),
            Err(_) => box_once(Err(halt())),
        });
    [
        (TICK, v(0), tick),
        (MUL, v(2), Native::<Data>::new(mul)),
        ("range", v(3), Native::<Data>::new(range)),
        ("tojson", v(0), Native::<Data>::new(tojson)),
        ("fromjson", v(0), Native::<Data>::new(fromjson)),
    ]
    .into_iter()
}

/// `l * r`, refusing string repetitions longer than [`MAX_REPEAT`].
fn mul<'a>(mut cv: Cv<'a, Data>) -> ValXs<'a, Val> {
    let r = cv.0.pop_var();
    let l = cv.0.pop_var();
    let repeat = match (&l, &r) {
        (Val::TStr(s) | Val::BStr(s), Val::Num(n)) | (Val::Num(n), Val::TStr(s) | Val::BStr(s)) => {
            match n {
                Num::Int(i) if *i > 0 => Some((s.len(), s.len().saturating_mul(i.unsigned_abs()))),
                Num::BigInt(_) => Some((s.len(), usize::MAX)),
                _ => None,
            }
        }
        _ => None,
    };
    if let Some((len, total)) = repeat
        && total > MAX_REPEAT
    {
        return fail(format!(
            "cannot repeat a string of {len} bytes that often: the result would exceed {MAX_REPEAT} bytes"
        ));
    }
    box_once((l * r).map_err(Exn::from))
}

/// `range($from; $upto; $by)` as jaq-core defines it, with a tick per output: `range(0;
/// 10; 0)` never ends and `[range(1e9)]` would fill the memory before it did.
fn range<'a>(mut cv: Cv<'a, Data>) -> ValXs<'a, Val> {
    use std::cmp::Ordering::{Equal, Greater, Less};
    let by = cv.0.pop_var();
    let upto = cv.0.pop_var();
    let from = cv.0.pop_var();
    let direction = by.partial_cmp(&Val::Num(Num::Int(0))).unwrap_or(Equal);
    let mut next: ValX<'a, Val> = Ok(from);
    Box::new(std::iter::from_fn(move || {
        if budget::tick().is_err() {
            return Some(Err(halt()));
        }
        match next.clone() {
            Ok(x) => match direction {
                Greater => x < upto,
                Less => x > upto,
                Equal => x != upto,
            }
            .then(|| std::mem::replace(&mut next, (x + by.clone()).map_err(Exn::from))),
            e @ Err(_) => {
                next = Ok(upto.clone());
                Some(e)
            }
        }
    }))
}

/// `tojson`, refusing values nested deeper than [`MAX_DEPTH`] (jq can build them; the
/// writer recurses per level).
fn tojson<'a>(cv: Cv<'a, Data>) -> ValXs<'a, Val> {
    if format::depth_exceeds(&cv.1, MAX_DEPTH) {
        return fail(format!(
            "cannot write a value nested deeper than {MAX_DEPTH} levels as JSON"
        ));
    }
    let mut out = Vec::new();
    match jaq_json::write::write(&mut out, &jaq_json::write::Pp::default(), 0, &cv.1) {
        Ok(()) => box_once(Ok(Val::utf8_str(out))),
        Err(e) => fail(format!("cannot write a value as JSON: {e}")),
    }
}

/// `fromjson`, refusing text nested deeper than [`MAX_DEPTH`] (the reader recurses per
/// level, and the text comes from records).
fn fromjson<'a>(cv: Cv<'a, Data>) -> ValXs<'a, Val> {
    let text = match cv.1.try_as_utf8_bytes_owned() {
        Ok(text) => text,
        Err(e) => return box_once(Err(Exn::from(e))),
    };
    if format::nesting_exceeds(&text, MAX_DEPTH) {
        return fail(format!(
            "cannot parse a string nested deeper than {MAX_DEPTH} levels as JSON"
        ));
    }
    let input = cv.1;
    let values = jaq_json::bytes_valrs(text, move |s| {
        Box::new(jaq_json::read::parse_many(s).map(move |r| {
            r.map_err(|e| Error::str(format_args!("cannot parse {input} as JSON: {e}")))
        }))
    });
    Box::new(values.map(|r| r.map_err(Exn::from)))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn recursive(main: &str) -> (Vec<String>, Vec<String>) {
        let library: Vec<_> = jaq_core::defs()
            .chain(jaq_std::defs())
            .chain(jaq_json::defs())
            .collect();
        let tokens = jaq_core::load::Lexer::new(main).lex().expect("lexes");
        let main = jaq_core::load::Parser::new(&tokens)
            .parse(|p| p.term())
            .expect("parses");
        let (lib, user) = Instrument::new(&library, &main);
        let names = |i: &Instrument<'_>| {
            let mut v: Vec<String> = i
                .recursive
                .iter()
                .map(|(n, a)| format!("{n}/{a}"))
                .collect();
            v.sort();
            v
        };
        (
            names(&lib),
            user.user_defs.iter().map(|s| s.to_string()).collect(),
        )
    }

    /// Only definitions that can call themselves pay for a tick: `map`, `select` or `not`
    /// do not; the loops of `until`, `while`, `repeat` and `recurse` (each a local `rec`) do.
    #[test]
    fn only_recursive_definitions_tick() {
        let (rec, user_defs) = recursive(".");
        assert!(rec.contains(&"rec/0".to_string()), "{rec:?}");
        for plain in [
            "map/1",
            "select/1",
            "not/0",
            "to_entries/0",
            "add/0",
            "paths/0",
        ] {
            assert!(!rec.contains(&plain.to_string()), "{plain} in {rec:?}");
        }
        assert!(user_defs.is_empty());
        // Through filter arguments: `h` calls itself through `f`.
        let (rec, user_defs) = recursive("def f(g): g; def h: f(h); def k: 1; h, k");
        assert!(rec.contains(&"h/0".to_string()) && !rec.contains(&"k/0".to_string()));
        assert_eq!(user_defs.len(), 3);
        // Mutual recursion.
        let (rec, _) = recursive("def a: def b: a; b; a");
        assert!(rec.contains(&"a/0".to_string()) && rec.contains(&"b/0".to_string()));
    }
}
