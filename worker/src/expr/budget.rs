//! Bounds on one evaluation of a jq expression: a time budget and a share of the native stack.
//!
//! jaq has no fuel of its own and interprets filters recursively, so one record can make an
//! expression loop forever (`until(. > 10; . + .step)` with `.step == 0`) or recurse until the
//! thread's stack overflows, which aborts the whole worker. [`super::instrument`] rewrites each
//! program so that every loop passes through [`tick`], a cheap native check: it compares the
//! stack pointer with a floor set when the evaluation started, and reads the clock every
//! [`CLOCK_EVERY`] ticks. Once a bound is exceeded, the tick and every later one raise an
//! exception that jq code cannot catch (`try`, `?` and `//` only catch errors), so the
//! evaluation unwinds and [`super::Expr`] reports a budget error for the record.
//!
//! The state is thread-local: an evaluation runs on one thread from start to end, and each
//! thread (the processing thread, a test) has its own clock and stack.

use std::cell::Cell;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

/// The clock is read once per this many ticks: a tick is a few nanoseconds, a clock read
/// about twenty, and the budget is counted in milliseconds.
pub const CLOCK_EVERY: u32 = 64;

/// Stack left free below the deepest point an evaluation may reach: room for the frames jaq
/// runs between two ticks, and for natives that recurse over a value without ticking
/// (printing, comparing, dropping it).
pub const STACK_MARGIN: usize = 512 << 10;

/// Most native stack one evaluation may use, however large the thread's stack: deep
/// non-tail recursion in jq (`def f: 1 + f; f`) touches every page it uses, and those stay
/// resident.
pub const MAX_EVAL_STACK: usize = 64 << 20;

/// Which bound an evaluation exceeded.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Exceeded {
    Time,
    Stack,
}

#[derive(Clone, Copy)]
struct State {
    /// `None` outside an evaluation: ticks then do nothing.
    deadline: Option<Instant>,
    countdown: u32,
    /// Lowest stack address the evaluation may reach (stacks grow down on every platform
    /// the worker supports).
    stack_floor: usize,
    stack_room: usize,
    exceeded: Option<Exceeded>,
}

impl State {
    const IDLE: State = State {
        deadline: None,
        countdown: 0,
        stack_floor: 0,
        stack_room: 0,
        exceeded: None,
    };
}

thread_local! {
    static STATE: Cell<State> = const { Cell::new(State::IDLE) };
}

/// An address in the current stack frame.
#[inline(always)]
fn stack_pointer() -> usize {
    let marker = 0u8;
    std::hint::black_box(&marker) as *const u8 as usize
}

/// The bounds of the evaluation running on this thread, from [`Evaluation::start`] until
/// dropped.
pub struct Evaluation {
    previous: State,
}

impl Evaluation {
    /// Starts the clock (and the stack count) for an evaluation of expression `id` (see
    /// [`register`]) that may run for `budget`.
    pub fn start(budget: Duration, id: usize) -> Evaluation {
        let now = Instant::now();
        // A thread whose stack size is unknown is assumed to have the Rust default (2 MiB)
        // from here.
        let room = stacker::remaining_stack()
            .unwrap_or(2 << 20)
            .saturating_sub(STACK_MARGIN)
            .min(MAX_EVAL_STACK);
        let state = State {
            deadline: Some(
                now.checked_add(budget)
                    .unwrap_or(now + Duration::from_secs(86_400)),
            ),
            countdown: CLOCK_EVERY,
            stack_floor: stack_pointer().saturating_sub(room),
            stack_room: room,
            exceeded: None,
        };
        current::enter(id, now);
        Evaluation {
            previous: STATE.replace(state),
        }
    }

    /// The bound this evaluation exceeded, if any.
    pub fn exceeded(&self) -> Option<Exceeded> {
        STATE.get().exceeded
    }

    /// Bytes of stack this evaluation may use.
    pub fn stack_room(&self) -> usize {
        STATE.get().stack_room
    }
}

impl Drop for Evaluation {
    fn drop(&mut self) {
        STATE.set(self.previous);
        current::leave();
    }
}

/// The budget check: `Err` once the running evaluation exceeded a bound (and for every tick
/// after that), `Ok` outside evaluations.
#[inline]
pub fn tick() -> Result<(), Exceeded> {
    let mut s = STATE.get();
    if s.deadline.is_none() {
        return Ok(());
    }
    if let Some(e) = s.exceeded {
        return Err(e);
    }
    if stack_pointer() < s.stack_floor {
        s.exceeded = Some(Exceeded::Stack);
    } else if s.countdown == 0 {
        s.countdown = CLOCK_EVERY;
        if s.deadline.is_some_and(|d| Instant::now() >= d) {
            s.exceeded = Some(Exceeded::Time);
        }
    } else {
        s.countdown -= 1;
    }
    STATE.set(s);
    s.exceeded.map_or(Ok(()), Err)
}

/// What the processing thread is evaluating, for `/healthz` when it stops making progress.
///
/// Only a thread that called [`report_this_thread`] is tracked (the worker's processing
/// thread): two relaxed atomic stores per evaluation there, nothing elsewhere. The source
/// text is looked up only when asked.
pub mod current {
    use super::*;

    thread_local! {
        static REPORTED: Cell<bool> = const { Cell::new(false) };
    }

    /// Makes evaluations on this thread visible to [`evaluating`].
    pub fn report_this_thread() {
        REPORTED.set(true);
    }

    /// Sources of compiled expressions, by id; an expression compiled twice keeps its id.
    static SOURCES: Mutex<Vec<String>> = Mutex::new(Vec::new());
    /// Id + 1 of the expression being evaluated, 0 for none.
    static EXPR: AtomicUsize = AtomicUsize::new(0);
    /// Microseconds since [`epoch`] when that evaluation started.
    static STARTED: AtomicU64 = AtomicU64::new(0);

    fn epoch() -> Instant {
        static EPOCH: OnceLock<Instant> = OnceLock::new();
        *EPOCH.get_or_init(Instant::now)
    }

    /// The id under which evaluations of `source` are reported.
    pub fn register(source: &str) -> usize {
        let Ok(mut sources) = SOURCES.lock() else {
            return usize::MAX;
        };
        match sources.iter().position(|s| s == source) {
            Some(id) => id,
            None => {
                sources.push(source.to_owned());
                sources.len() - 1
            }
        }
    }

    pub(super) fn enter(id: usize, now: Instant) {
        if !REPORTED.get() {
            return;
        }
        let since = now.saturating_duration_since(epoch()).as_micros();
        STARTED.store(u64::try_from(since).unwrap_or(u64::MAX), Ordering::Relaxed);
        EXPR.store(id.wrapping_add(1), Ordering::Relaxed);
    }

    pub(super) fn leave() {
        if REPORTED.get() {
            EXPR.store(0, Ordering::Relaxed);
        }
    }

    /// The expression being evaluated right now and for how long, if any.
    pub fn evaluating() -> Option<(String, Duration)> {
        let id = EXPR.load(Ordering::Relaxed).checked_sub(1)?;
        let started = Duration::from_micros(STARTED.load(Ordering::Relaxed));
        let source = SOURCES.lock().ok()?.get(id)?.clone();
        let elapsed = Instant::now()
            .saturating_duration_since(epoch())
            .saturating_sub(started);
        Some((source, elapsed))
    }
}

pub use current::{register, report_this_thread};

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ticks_outside_an_evaluation_pass() {
        for _ in 0..1000 {
            assert_eq!(tick(), Ok(()));
        }
    }

    #[test]
    fn time_runs_out_and_stays_out() {
        // The clock starts before the evaluation's, so the budget cannot look short.
        let start = Instant::now();
        let eval = Evaluation::start(Duration::from_millis(20), register("test"));
        while tick().is_ok() {
            assert!(
                start.elapsed() < Duration::from_secs(5),
                "the budget never ran out"
            );
        }
        assert!(start.elapsed() >= Duration::from_millis(20));
        assert_eq!(tick(), Err(Exceeded::Time));
        assert_eq!(eval.exceeded(), Some(Exceeded::Time));
        drop(eval);
        assert_eq!(tick(), Ok(()), "the next evaluation starts afresh");
    }

    #[test]
    fn deep_native_recursion_is_caught_before_the_stack_ends() {
        fn recurse(n: usize) -> usize {
            let pad = std::hint::black_box([0u8; 512]);
            match tick() {
                Ok(()) => recurse(n + 1) + usize::from(pad[0]),
                Err(e) => {
                    assert_eq!(e, Exceeded::Stack);
                    n
                }
            }
        }
        let depth = std::thread::Builder::new()
            .stack_size(2 << 20)
            .spawn(|| {
                let _eval = Evaluation::start(Duration::from_secs(60), register("test"));
                recurse(0)
            })
            .expect("thread")
            .join()
            .expect("no overflow");
        assert!(depth > 100, "{depth}");
    }

    #[test]
    fn the_current_evaluation_is_visible_from_other_threads() {
        let id = register("until(false; .)");
        assert_eq!(register("until(false; .)"), id);
        let (tx, rx) = std::sync::mpsc::channel();
        let (done_tx, done_rx) = std::sync::mpsc::channel::<()>();
        let t = std::thread::spawn(move || {
            current::report_this_thread();
            let _eval = Evaluation::start(Duration::from_secs(60), id);
            tx.send(()).expect("send");
            done_rx.recv().expect("recv");
        });
        rx.recv().expect("started");
        let (src, _) = current::evaluating().expect("an evaluation is running");
        assert_eq!(src, "until(false; .)");
        done_tx.send(()).expect("send");
        t.join().expect("join");
        assert_eq!(current::evaluating(), None);
    }
}
