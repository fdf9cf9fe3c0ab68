//! Two futures polled in one task, each with a waker of its own: a turn of
//! the task polls only the futures whose wakers fired, and polls again,
//! within the same turn, while one wakes the other. A client connection and
//! the upstream connections it drives hand a request and its response back
//! and forth this way with no trip through the scheduler, and a turn for
//! one of them does not poll the other for nothing.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, Wake, Waker};

/// Polls again within one turn at most this often; beyond it, the task is
/// woken for another turn (so one busy pair cannot starve other tasks).
const MAX_INLINE_POLLS: usize = 16;

/// The wakers of a pair and what they have seen.
pub(crate) struct Turns {
    shared: Arc<Shared>,
    wakers: [Waker; 2],
}

struct Shared {
    /// Which of the two was woken since it was last polled.
    woken: [AtomicBool; 2],
    /// A turn is under way: it polls whatever is woken before it ends, so a
    /// wake need not wake the task.
    in_turn: AtomicBool,
    /// The task that polls the pair.
    task: Mutex<Option<Waker>>,
}

struct Flag {
    shared: Arc<Shared>,
    which: usize,
}

impl Wake for Flag {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        self.shared.woken[self.which].store(true, Ordering::SeqCst);
        if !self.shared.in_turn.load(Ordering::SeqCst) {
            let task = self.shared.task.lock().unwrap_or_else(|p| p.into_inner());
            if let Some(task) = task.as_ref() {
                task.wake_by_ref();
            }
        }
    }
}

impl Default for Turns {
    fn default() -> Self {
        let shared = Arc::new(Shared {
            // Both are polled on the first turn.
            woken: [AtomicBool::new(true), AtomicBool::new(true)],
            in_turn: AtomicBool::new(false),
            task: Mutex::new(None),
        });
        let waker = |which| {
            Waker::from(Arc::new(Flag {
                shared: shared.clone(),
                which,
            }))
        };
        let wakers = [waker(0), waker(1)];
        Self { shared, wakers }
    }
}

impl Turns {
    /// Marks both as woken, so the next turn polls them whatever woke the
    /// task: for a change made from outside that wakes nobody (hyper's
    /// `graceful_shutdown` only changes the connection's state).
    pub(crate) fn wake_both(&self) {
        for woken in &self.shared.woken {
            woken.store(true, Ordering::SeqCst);
        }
    }

    /// One turn of the task: polls `first` and `second`, each only if its
    /// waker fired (each gets its own), and again while either wakes.
    /// Returns what `second` returns.
    pub(crate) fn poll<T>(
        &self,
        cx: &mut Context<'_>,
        mut first: impl FnMut(&mut Context<'_>),
        mut second: impl FnMut(&mut Context<'_>) -> Poll<T>,
    ) -> Poll<T> {
        let shared = &self.shared;
        {
            let mut task = shared.task.lock().unwrap_or_else(|p| p.into_inner());
            if !task.as_ref().is_some_and(|t| t.will_wake(cx.waker())) {
                *task = Some(cx.waker().clone());
            }
        }
        shared.in_turn.store(true, Ordering::SeqCst);
        let mut out = Poll::Pending;
        for _ in 0..MAX_INLINE_POLLS {
            let mut polled = false;
            if shared.woken[0].swap(false, Ordering::SeqCst) {
                first(&mut Context::from_waker(&self.wakers[0]));
                polled = true;
            }
            if shared.woken[1].swap(false, Ordering::SeqCst) {
                out = second(&mut Context::from_waker(&self.wakers[1]));
                polled = true;
                if out.is_ready() {
                    break;
                }
            }
            if !polled {
                break;
            }
        }
        shared.in_turn.store(false, Ordering::SeqCst);
        // A wake that came while the turn was ending, or more work than one
        // turn takes: another turn.
        if out.is_pending() && shared.woken.iter().any(|w| w.load(Ordering::SeqCst)) {
            cx.waker().wake_by_ref();
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::{Cell, RefCell};
    use std::sync::atomic::AtomicUsize;

    #[derive(Default)]
    struct Counter(AtomicUsize);

    impl Wake for Counter {
        fn wake(self: Arc<Self>) {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
    }

    /// A task that counts its wake-ups, and its waker.
    fn counting_task() -> (Arc<Counter>, Waker) {
        let task = Arc::new(Counter::default());
        let waker = Waker::from(task.clone());
        (task, waker)
    }

    /// A pair whose members count their polls, keep their wakers, and on
    /// each poll wake the other while `bounces` lasts.
    struct Pair {
        polls: [Cell<usize>; 2],
        wakers: [RefCell<Option<Waker>>; 2],
        bounces: Cell<usize>,
    }

    impl Pair {
        fn new() -> Self {
            Pair {
                polls: Default::default(),
                wakers: Default::default(),
                bounces: Cell::new(0),
            }
        }

        fn poll(&self, which: usize, cx: &mut Context<'_>) {
            self.polls[which].set(self.polls[which].get() + 1);
            *self.wakers[which].borrow_mut() = Some(cx.waker().clone());
            if self.bounces.get() > 0 {
                self.bounces.set(self.bounces.get() - 1);
                if let Some(other) = self.wakers[1 - which].borrow().as_ref() {
                    other.wake_by_ref();
                }
            }
        }

        fn turn(&self, turns: &Turns, cx: &mut Context<'_>) -> [usize; 2] {
            let out: Poll<()> = turns.poll(
                cx,
                |cx| self.poll(0, cx),
                |cx| {
                    self.poll(1, cx);
                    Poll::Pending
                },
            );
            assert!(out.is_pending());
            self.polls.each_ref().map(Cell::get)
        }
    }

    #[test]
    fn a_turn_polls_only_what_was_woken() {
        let (turns, pair) = (Turns::default(), Pair::new());
        let (task, task_waker) = counting_task();
        let mut cx = Context::from_waker(&task_waker);
        assert_eq!(pair.turn(&turns, &mut cx), [1, 1], "both, at first");
        assert_eq!(pair.turn(&turns, &mut cx), [1, 1], "neither was woken");
        // Woken outside a turn: the task is woken, and the next turn polls
        // that one alone.
        pair.wakers[0].borrow().as_ref().unwrap().wake_by_ref();
        assert_eq!(task.0.load(Ordering::SeqCst), 1);
        assert_eq!(pair.turn(&turns, &mut cx), [2, 1]);
    }

    #[test]
    fn a_hand_off_between_the_two_stays_within_the_turn() {
        let (turns, pair) = (Turns::default(), Pair::new());
        let (task, task_waker) = counting_task();
        let mut cx = Context::from_waker(&task_waker);
        pair.turn(&turns, &mut cx);
        // Four wakes back and forth, all polled in one turn, none reaching
        // the task.
        pair.bounces.set(4);
        pair.wakers[0].borrow().as_ref().unwrap().wake_by_ref();
        let woken = task.0.load(Ordering::SeqCst);
        assert_eq!(pair.turn(&turns, &mut cx), [4, 3]);
        assert_eq!(
            task.0.load(Ordering::SeqCst),
            woken,
            "no wake for another turn"
        );
        // Endless ping-pong: the turn stops after its limit and asks for
        // another.
        pair.bounces.set(usize::MAX);
        pair.wakers[0].borrow().as_ref().unwrap().wake_by_ref();
        let before = task.0.load(Ordering::SeqCst);
        let [a, b] = pair.turn(&turns, &mut cx);
        assert_eq!(a + b, 4 + 3 + MAX_INLINE_POLLS * 2);
        assert_eq!(
            task.0.load(Ordering::SeqCst),
            before + 1,
            "another turn asked for"
        );
    }
}
