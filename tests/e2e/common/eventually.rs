//! The one way a test waits for something it can read (an answer, a metric, a file,
//! a process's state): [`eventually`] tries again until the attempt succeeds, and
//! fails the test naming what it waited for once [`super::PATIENCE`] has passed.

use std::fmt::{Debug, Display};
use std::time::Duration;

/// How soon an attempt that did not succeed is made again.
const AGAIN: Duration = Duration::from_millis(20);

/// What one attempt says: done, with what it found, or not yet (with why, when the
/// attempt says).
pub trait Attempt {
    /// What a successful attempt gives the waiter.
    type Found;
    /// Done, or not yet with the attempt's reason.
    fn outcome(self) -> Result<Self::Found, Option<String>>;
}

impl Attempt for bool {
    type Found = ();
    fn outcome(self) -> Result<(), Option<String>> {
        if self { Ok(()) } else { Err(None) }
    }
}

impl<T> Attempt for Option<T> {
    type Found = T;
    fn outcome(self) -> Result<T, Option<String>> {
        self.ok_or(None)
    }
}

impl<T, E: Debug> Attempt for Result<T, E> {
    type Found = T;
    fn outcome(self) -> Result<T, Option<String>> {
        self.map_err(|e| Some(format!("{e:?}")))
    }
}

/// Waits until `attempt` succeeds (`true`, `Some`, `Ok`) and returns what it found;
/// fails the test naming `what`, with the last attempt's error when it gave one,
/// once [`super::PATIENCE`] has passed.
pub async fn eventually<A: Attempt>(
    what: impl Display,
    attempt: impl AsyncFnMut() -> A,
) -> A::Found {
    eventually_within(super::PATIENCE, what, attempt).await
}

/// [`eventually`], giving up after `patience`.
pub async fn eventually_within<A: Attempt>(
    patience: Duration,
    what: impl Display,
    mut attempt: impl AsyncFnMut() -> A,
) -> A::Found {
    let deadline = tokio::time::Instant::now() + patience;
    loop {
        let last = match attempt().await.outcome() {
            Ok(found) => return found,
            Err(last) => last,
        };
        if tokio::time::Instant::now() >= deadline {
            gave_up(&what, patience, last);
        }
        tokio::time::sleep(AGAIN).await;
    }
}

/// Fails the test: `what` did not happen within `patience`.
fn gave_up(what: &dyn Display, patience: Duration, last: Option<String>) -> ! {
    match last {
        Some(last) => panic!("{what}: not within {patience:?}; the last attempt: {last}"),
        None => panic!("{what}: not within {patience:?}"),
    }
}

/// [`eventually`] for a test's blocking parts (a thread reading a process's output,
/// a port a child process binds).
pub fn eventually_blocking<A: Attempt>(
    what: impl Display,
    mut attempt: impl FnMut() -> A,
) -> A::Found {
    let patience = super::PATIENCE;
    let deadline = std::time::Instant::now() + patience;
    loop {
        let last = match attempt().outcome() {
            Ok(found) => return found,
            Err(last) => last,
        };
        if std::time::Instant::now() >= deadline {
            gave_up(&what, patience, last);
        }
        std::thread::sleep(AGAIN);
    }
}

/// What was waited for, said with the log of the processes it was waited on: the log
/// is read when a wait fails, not on each attempt.
pub fn with_log<'a>(what: impl Display + 'a, log: &'a std::path::Path) -> impl Display + 'a {
    struct WithLog<'a, W>(W, &'a std::path::Path);
    impl<W: Display> Display for WithLog<'_, W> {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            write!(
                f,
                "{}; log {}:\n{}",
                self.0,
                self.1.display(),
                std::fs::read_to_string(self.1).unwrap_or_default()
            )
        }
    }
    WithLog(what, log)
}
