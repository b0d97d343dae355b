//! Every task the server process starts, under one tracker: each runs in a span
//! naming it, and a shutdown waits for them all, with a deadline, naming those still
//! running when it passes. (The engine's own tasks, its clusters' and its Watch
//! producers, are under the engine's tracker, which `Engine::shutdown` waits for.)

use std::collections::BTreeMap;
use std::future::Future;
use std::sync::{LazyLock, Mutex};
use std::time::Duration;

use tokio::task::JoinHandle;
use tokio_util::task::TaskTracker;
use tracing::Instrument as _;

/// The process's tasks.
struct Tasks {
    tracker: TaskTracker,
    /// How many of each name run now.
    running: Mutex<BTreeMap<&'static str, usize>>,
}

static TASKS: LazyLock<Tasks> = LazyLock::new(|| Tasks {
    tracker: TaskTracker::new(),
    running: Mutex::new(BTreeMap::new()),
});

/// Counts a task of `name` as running until dropped (when the task ends, however).
struct Running(&'static str);

impl Running {
    fn start(name: &'static str) -> Self {
        *lock().entry(name).or_default() += 1;
        Self(name)
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        let mut running = lock();
        if let Some(n) = running.get_mut(self.0) {
            *n -= 1;
            if *n == 0 {
                running.remove(self.0);
            }
        }
    }
}

fn lock() -> std::sync::MutexGuard<'static, BTreeMap<&'static str, usize>> {
    TASKS.running.lock().unwrap_or_else(|e| e.into_inner())
}

/// Runs `future` as a task named `name` (its span, and its name in a shutdown that
/// finds it still running).
pub fn spawn<F>(name: &'static str, future: F) -> JoinHandle<F::Output>
where
    F: Future + Send + 'static,
    F::Output: Send + 'static,
{
    let running = Running::start(name);
    // Each task's span is its own root: a task started by another outlives it.
    let span = tracing::info_span!(parent: None, "task", task = name);
    TASKS.tracker.spawn(
        async move {
            let _running = running;
            future.await
        }
        .instrument(span),
    )
}

/// Runs `f` on the blocking threads as a task named `name` (in a shutdown that finds
/// it still running).
pub fn spawn_blocking<F, R>(name: &'static str, f: F) -> JoinHandle<R>
where
    F: FnOnce() -> R + Send + 'static,
    R: Send + 'static,
{
    let running = Running::start(name);
    // Not entered: what `f` starts (an engine's tasks) has spans of its own.
    TASKS.tracker.spawn_blocking(move || {
        let _running = running;
        f()
    })
}

/// The tasks running now, by name.
pub fn running() -> BTreeMap<&'static str, usize> {
    lock().clone()
}

/// Waits up to `within` for every task to end; `Err` names those still running then
/// (with how many of each), and says so in the log.
pub async fn shutdown(within: Duration) -> Result<(), BTreeMap<&'static str, usize>> {
    TASKS.tracker.close();
    let ended = tokio::time::timeout(within, TASKS.tracker.wait()).await;
    // The tracker stays usable: a later start (tests run several) tracks again.
    TASKS.tracker.reopen();
    match ended {
        Ok(()) => Ok(()),
        Err(_) => {
            let still = running();
            tracing::warn!(?within, running = ?still, "tasks still running at the end of the shutdown");
            Err(still)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn tasks_are_counted_by_name_and_a_shutdown_names_those_that_do_not_end() {
        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        let finite = spawn("test-finite", async move {
            let _ = rx.await;
        });
        let stuck = spawn("test-stuck", std::future::pending::<()>());
        assert_eq!(running().get("test-finite"), Some(&1));
        assert_eq!(running().get("test-stuck"), Some(&1));
        let _ = tx.send(());
        finite.await.unwrap();
        assert_eq!(running().get("test-finite"), None);
        let still = shutdown(Duration::from_millis(50)).await.unwrap_err();
        assert_eq!(still.get("test-stuck"), Some(&1));
        stuck.abort();
        let _ = stuck.await;
        assert_eq!(running().get("test-stuck"), None);
        let blocking = spawn_blocking("test-blocking", || 7);
        assert_eq!(blocking.await.unwrap(), 7);
        assert_eq!(running().get("test-blocking"), None);
    }
}
