//! Stopping a running operation from outside, only at step boundaries: a
//! park (the operation stays resumable) or a cancel (accepted only while no
//! destructive step has started). A daemon uses it for its cancel request
//! and to park operations when it shuts down.

use std::sync::{Arc, Mutex};

/// What was asked of a running operation.
#[derive(Debug, Default)]
struct StopState {
    park: bool,
    cancel: bool,
    destructive_started: bool,
}

/// A handle shared between a running operation and whoever may stop it;
/// cheap to clone. Give it to [`Ops::set_stop`](super::Ops::set_stop)
/// before [`Ops::run`](super::Ops::run) or [`Ops::resume`](super::Ops::resume).
#[derive(Debug, Clone, Default)]
pub struct StopHandle(Arc<Mutex<StopState>>);

/// Why a cancel was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("a destructive step has started: the operation can no longer be cancelled, only let run")]
pub struct CancelRefused;

impl StopHandle {
    /// A handle with nothing asked.
    pub fn new() -> StopHandle {
        StopHandle::default()
    }

    fn state(&self) -> std::sync::MutexGuard<'_, StopState> {
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Asks the operation to stop at its next step boundary and stay
    /// resumable. A destructive sequence already under way (forfeit, leave,
    /// reset) runs to its end first: nothing parks between a leave and its
    /// reset.
    pub fn park(&self) {
        self.state().park = true;
    }

    /// Asks the operation to end at its next step boundary as cancelled;
    /// refused once a destructive step has started.
    pub fn cancel(&self) -> Result<(), CancelRefused> {
        let mut state = self.state();
        if state.destructive_started {
            return Err(CancelRefused);
        }
        state.cancel = true;
        Ok(())
    }

    /// Whether a park or a cancel was asked.
    pub fn is_stopping(&self) -> bool {
        let state = self.state();
        state.park || state.cancel
    }

    /// Whether a destructive step has started (a cancel would be refused).
    pub fn destructive_started(&self) -> bool {
        self.state().destructive_started
    }

    /// Records that a destructive step starts, unless a cancel came first
    /// (then returns false and nothing may start).
    pub(crate) fn enter_destructive(&self) -> bool {
        let mut state = self.state();
        if state.cancel {
            return false;
        }
        state.destructive_started = true;
        true
    }

    /// What to do at a step boundary: `Some(true)` cancel, `Some(false)`
    /// park, `None` go on.
    pub(crate) fn at_boundary(&self) -> Option<bool> {
        let state = self.state();
        if state.cancel {
            Some(true)
        } else if state.park {
            Some(false)
        } else {
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cancel_is_refused_once_a_destructive_step_started() {
        let stop = StopHandle::new();
        assert!(stop.enter_destructive());
        assert_eq!(stop.cancel(), Err(CancelRefused));
        assert_eq!(stop.at_boundary(), None);
    }

    #[test]
    fn a_cancel_first_keeps_destructive_steps_from_starting() {
        let stop = StopHandle::new();
        stop.cancel().unwrap();
        assert!(!stop.enter_destructive());
        assert!(!stop.destructive_started());
        assert_eq!(stop.at_boundary(), Some(true));
    }

    #[test]
    fn park_stops_at_the_boundary() {
        let stop = StopHandle::new();
        assert_eq!(stop.at_boundary(), None);
        stop.park();
        assert!(stop.is_stopping());
        assert_eq!(stop.at_boundary(), Some(false));
    }
}
