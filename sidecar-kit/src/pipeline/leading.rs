//! Whether the controller running in this task leads: a warm standby
//! (`--leader-election-warm-standby`) runs its controllers before it wins the Lease, so that
//! their watches list and their indexes fill while another replica leads, and holds back only
//! what acts (workers, periodic work, the journal's replay) until it leads.
//!
//! The gate is a task-local set around a controller's run by the host, so that the sidecars
//! need not pass it through: a [`Pipeline`](super::Pipeline) made in that task waits on it
//! between its caches' sync and its start. Outside any gate a controller leads already (no
//! election, or one it won before it started).

use std::future::Future;

use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

tokio::task_local! {
    static LEADERSHIP: Leadership;
}

/// What a controller waits on before it acts.
#[derive(Clone, Debug)]
pub struct Leadership(Option<watch::Receiver<bool>>);

/// Opens the [`Leadership`] it was made with: the Lease is won.
#[derive(Debug)]
pub struct Gate(watch::Sender<bool>);

impl Gate {
    pub fn open(&self) {
        self.0.send_replace(true);
    }
}

impl Leadership {
    /// A closed gate and what waits on it.
    pub fn gated() -> (Gate, Self) {
        let (open, opened) = watch::channel(false);
        (Gate(open), Self(Some(opened)))
    }

    /// The leadership of the running task: leading, unless a host gated it.
    pub fn current() -> Self {
        LEADERSHIP.try_with(Clone::clone).unwrap_or(Self(None))
    }

    /// Runs `work` with this leadership as its task's.
    pub fn scope<F: Future>(self, work: F) -> impl Future<Output = F::Output> {
        LEADERSHIP.scope(self, work)
    }

    /// Whether the gate is open (or there is none).
    pub fn leads(&self) -> bool {
        self.0.as_ref().is_none_or(|opened| *opened.borrow())
    }

    /// Waits until the gate opens; `false` if `shutdown` came first (or the gate is gone).
    pub async fn wait(&mut self, shutdown: &CancellationToken) -> bool {
        let Some(opened) = self.0.as_mut() else {
            return true;
        };
        tokio::select! {
            _ = shutdown.cancelled() => false,
            open = opened.wait_for(|open| *open) => open.is_ok(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_task_outside_any_gate_leads() {
        let mut leadership = Leadership::current();
        assert!(leadership.leads());
        assert!(leadership.wait(&CancellationToken::new()).await);
    }

    #[tokio::test]
    async fn a_gated_task_waits_for_the_gate() {
        let (gate, leadership) = Leadership::gated();
        let shutdown = CancellationToken::new();
        let waiting = tokio::spawn(leadership.scope({
            let shutdown = shutdown.clone();
            async move {
                let mut current = Leadership::current();
                assert!(!current.leads());
                current.wait(&shutdown).await
            }
        }));
        tokio::task::yield_now().await;
        assert!(!waiting.is_finished());
        gate.open();
        assert_eq!(waiting.await.ok(), Some(true));
    }

    #[tokio::test]
    async fn a_shutdown_ends_the_wait() {
        let (_gate, mut leadership) = Leadership::gated();
        let shutdown = CancellationToken::new();
        shutdown.cancel();
        assert!(!leadership.wait(&shutdown).await);
    }
}
