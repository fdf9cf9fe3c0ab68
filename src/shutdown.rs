//! Graceful stop, passed down explicitly as in mini-redis: whoever starts a
//! task hands it a [`Shutdown`]; the owner of the [`ShutdownTrigger`] fires
//! it once. Also the one place that waits for SIGTERM or Ctrl-C.

use tokio::sync::watch;

/// Fires the shutdown every [`Shutdown`] made from it sees.
pub(crate) struct ShutdownTrigger {
    tx: watch::Sender<bool>,
}

/// Tells a task that the process is stopping. Cheap to clone.
#[derive(Clone)]
pub(crate) struct Shutdown {
    rx: watch::Receiver<bool>,
}

/// A new trigger and its first listener.
pub(crate) fn channel() -> (ShutdownTrigger, Shutdown) {
    let (tx, rx) = watch::channel(false);
    (ShutdownTrigger { tx }, Shutdown { rx })
}

impl ShutdownTrigger {
    /// Starts the shutdown; idempotent.
    pub(crate) fn fire(&self) {
        self.tx.send_replace(true);
    }

    /// Another listener.
    pub(crate) fn subscribe(&self) -> Shutdown {
        Shutdown {
            rx: self.tx.subscribe(),
        }
    }
}

impl Shutdown {
    /// Resolves once the shutdown was fired (at once if it already was).
    pub(crate) async fn recv(&mut self) {
        // An error means the trigger is gone: nobody can stop us any more,
        // which is treated as a stop too.
        let _ = self.rx.wait_for(|s| *s).await;
    }

    /// Whether the shutdown was fired.
    pub(crate) fn is_fired(&self) -> bool {
        *self.rx.borrow()
    }
}

/// Resolves on SIGTERM or SIGINT (Ctrl-C).
pub(crate) async fn signal() {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{signal, SignalKind};
        if let Ok(mut term) = signal(SignalKind::terminate()) {
            tokio::select! {
                _ = term.recv() => {}
                _ = tokio::signal::ctrl_c() => {}
            }
            return;
        }
    }
    let _ = tokio::signal::ctrl_c().await;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn every_listener_sees_the_fire() {
        let (trigger, mut a) = channel();
        let mut b = trigger.subscribe();
        assert!(!a.is_fired());
        trigger.fire();
        a.recv().await;
        b.recv().await;
        assert!(b.is_fired());
    }
}
