//! The signals of a term's end, per role (the handle local work holds is
//! `handles::TermWatch`): local work ends
//! no later than the term it was admitted under.
//!
//! Each term has two signals. *Ending*: a handover or a stop began, the drain
//! bound is running, wrap up. *Over*: stop now. `over` fires on a graceful end
//! at its drain bound, before the role is released, and whenever the loop
//! ends the term for another reason (the grant lost or revoked). A fail-close
//! needs no signal: the trust deadline is read from the published snapshot
//! and judged at the moment, so a stalled loop still ends the work on time.

use std::sync::{Arc, Mutex, OnceLock};

use tokio_util::sync::CancellationToken;

/// Why a term ended, as counted in `rolegate_streams_ended_total`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum TermEndReason {
    /// A graceful handover (partition balance) reached its drain bound.
    Handover,
    /// The instance stopped (`shutdown`) and its drain bound passed.
    Stop,
    /// The trust window ran out (store outage, pause): fail closed.
    FailClose,
    /// The grant is gone (taken over, revoked, released elsewhere).
    Lost,
    /// The partition's recorded definition changed (a resize) or no longer
    /// matches this instance's: the old meaning of its keys ends here.
    Redefined,
}

impl TermEndReason {
    /// The metric label.
    pub fn as_str(self) -> &'static str {
        match self {
            TermEndReason::Handover => "handover",
            TermEndReason::Stop => "stop",
            TermEndReason::FailClose => "fail-close",
            TermEndReason::Lost => "lost",
            TermEndReason::Redefined => "redefined",
        }
    }
}

/// The two signals of one term (one `Arc`, so local work stays small).
#[derive(Clone, Default)]
pub(super) struct TermSignals(Arc<SignalsInner>);

#[derive(Default)]
pub(super) struct SignalsInner {
    pub(super) ending: CancellationToken,
    pub(super) over: CancellationToken,
    pub(super) reason: OnceLock<TermEndReason>,
}

impl std::ops::Deref for TermSignals {
    type Target = SignalsInner;
    fn deref(&self) -> &SignalsInner {
        &self.0
    }
}

impl TermSignals {
    fn end(&self, reason: TermEndReason) {
        let _ = self.reason.set(reason);
        self.ending.cancel();
        self.over.cancel();
    }
}

/// The signals of a role's current term, and the newest token already ended.
#[derive(Default)]
pub(super) struct TermSlot {
    token: u64,
    signals: Option<TermSignals>,
    ended_through: u64,
    /// The token whose last end was a fail-close: only such a term may
    /// reopen (a stop or a loss after it is final).
    failed_closed: Option<u64>,
}

/// Per role, the slot of its current term.
pub(super) struct Terms {
    slots: Vec<Mutex<TermSlot>>,
}

impl Terms {
    pub(super) fn new(roles: usize) -> Self {
        Self {
            slots: (0..roles).map(|_| Mutex::default()).collect(),
        }
    }

    fn slot(&self, i: usize) -> std::sync::MutexGuard<'_, TermSlot> {
        self.slots[i].lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The signals of term `token` of role `i`, made on first use. A term
    /// that already ended gets signals that have fired: work admitted just as
    /// its term ended stops at once.
    pub(super) fn signals(&self, i: usize, token: u64, ending: bool) -> TermSignals {
        let mut slot = self.slot(i);
        // An ended term, or one older than the slot's (work admitted from a
        // snapshot taken just before a newer term was published): its work
        // stops at once, and the newer term's signals are left alone.
        if token <= slot.ended_through || token < slot.token {
            let s = TermSignals::default();
            s.end(TermEndReason::Lost);
            return s;
        }
        if token > slot.token || slot.signals.is_none() {
            if let Some(old) = slot.signals.take() {
                old.end(TermEndReason::Lost);
            }
            slot.token = token;
            slot.signals = Some(TermSignals::default());
        }
        let s = slot.signals.clone().unwrap_or_default();
        if ending {
            s.ending.cancel();
        }
        s
    }

    /// Tells the work of role `i`'s current term to wrap up.
    pub(super) fn begin_ending(&self, i: usize) {
        if let Some(s) = &self.slot(i).signals {
            s.ending.cancel();
        }
    }

    #[cfg(any(test, feature = "gateway"))]
    /// Ends the work of role `i`'s current term, whatever its token.
    pub(super) fn end_current(&self, i: usize, reason: TermEndReason) {
        let mut slot = self.slot(i);
        slot.ended_through = slot.ended_through.max(slot.token);
        slot.failed_closed = None;
        if let Some(s) = slot.signals.take() {
            s.end(reason);
        }
    }

    /// Lets term `token` of role `i` admit work again: it failed closed here
    /// and the store kept it, so the same term resumes. Work it admitted
    /// before the gap stays ended.
    pub(super) fn reopen(&self, i: usize, token: u64) {
        let mut slot = self.slot(i);
        if slot.failed_closed == Some(token) && slot.ended_through == token {
            slot.ended_through = token.saturating_sub(1);
            slot.failed_closed = None;
        }
    }

    /// Ends the work of term `token` of role `i` (and of any older term).
    pub(super) fn end(&self, i: usize, token: u64, reason: TermEndReason) {
        let mut slot = self.slot(i);
        slot.ended_through = slot.ended_through.max(token);
        slot.failed_closed = (reason == TermEndReason::FailClose).then_some(token);
        if slot.token <= token {
            if let Some(s) = slot.signals.take() {
                s.end(reason);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn work_of_an_older_term_never_ends_the_newer_terms_work() {
        let terms = Terms::new(1);
        let newer = terms.signals(0, 7, false);
        let older = terms.signals(0, 6, false);
        assert!(older.over.is_cancelled(), "the older term's work stops");
        assert!(!newer.over.is_cancelled(), "the newer term's work goes on");
        assert!(!terms.signals(0, 7, false).over.is_cancelled());
        terms.end(0, 7, TermEndReason::Handover);
        assert!(newer.over.is_cancelled());
        assert_eq!(newer.reason.get(), Some(&TermEndReason::Handover));
        assert!(
            terms.signals(0, 7, false).over.is_cancelled(),
            "ended stays ended"
        );
        assert!(
            !terms.signals(0, 8, false).over.is_cancelled(),
            "a new term starts fresh"
        );
    }

    #[test]
    fn a_resumed_term_admits_new_work_and_keeps_the_old_work_ended() {
        let terms = Terms::new(1);
        let before = terms.signals(0, 7, false);
        terms.end(0, 7, TermEndReason::FailClose);
        assert!(terms.signals(0, 7, false).over.is_cancelled());
        terms.reopen(0, 7);
        let after = terms.signals(0, 7, false);
        assert!(!after.over.is_cancelled(), "the resumed term admits work");
        assert!(
            before.over.is_cancelled(),
            "work from before the gap stays ended"
        );
        assert!(
            terms.signals(0, 6, false).over.is_cancelled(),
            "an older term stays ended"
        );
        terms.end(0, 8, TermEndReason::Lost);
        terms.reopen(0, 7);
        assert!(
            terms.signals(0, 7, false).over.is_cancelled(),
            "a term older than one already ended never reopens"
        );
        // A stop after the fail-close is final.
        terms.end(0, 9, TermEndReason::FailClose);
        terms.end_current(0, TermEndReason::Stop);
        terms.reopen(0, 9);
        assert!(
            terms.signals(0, 9, false).over.is_cancelled(),
            "a stopped term reopened"
        );
    }
}
