//! Retry pacing and error reporting of the publisher: capped exponential
//! backoff, and a log that reports each distinct error once (until things
//! recover) instead of once per retry.

use std::time::Duration;

/// Capped exponential backoff: `initial`, then doubling up to `max`.
#[derive(Debug, Clone)]
pub struct Backoff {
    initial: Duration,
    max: Duration,
    next: Duration,
}

impl Backoff {
    /// A backoff starting at `initial` and capped at `max`.
    pub fn new(initial: Duration, max: Duration) -> Self {
        Self {
            initial,
            max: max.max(initial),
            next: initial,
        }
    }

    /// The delay before the next retry; doubles the one after.
    pub fn next_delay(&mut self) -> Duration {
        let delay = self.next;
        self.next = (self.next * 2).min(self.max);
        delay
    }

    /// Back to the initial delay (after a success).
    pub fn reset(&mut self) {
        self.next = self.initial;
    }
}

/// Reports errors once per distinct message.
#[derive(Debug, Default)]
pub struct ErrorLog {
    last: Option<String>,
    repeats: u64,
}

impl ErrorLog {
    /// Records a failure of `what`. Logs a warning when the message differs
    /// from the previous failure's, a debug line otherwise. Returns whether it
    /// warned.
    pub fn failure(&mut self, what: &str, message: &str, retry_in: Duration) -> bool {
        if self.last.as_deref() == Some(message) {
            self.repeats += 1;
            tracing::debug!(what, error = message, retry_in = ?retry_in, repeats = self.repeats, "still failing");
            return false;
        }
        tracing::warn!(what, error = message, retry_in = ?retry_in, "failed, will retry with backoff");
        self.last = Some(message.to_owned());
        self.repeats = 0;
        true
    }

    /// Records a success; logs once that `what` recovered after failures.
    /// Returns whether it logged.
    pub fn success(&mut self, what: &str) -> bool {
        if self.last.take().is_some() {
            tracing::info!(what, retries = self.repeats + 1, "recovered");
            self.repeats = 0;
            return true;
        }
        false
    }

    /// The last error, while failing.
    pub fn last(&self) -> Option<&str> {
        self.last.as_deref()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_up_to_the_cap_and_resets() {
        let mut b = Backoff::new(Duration::from_millis(100), Duration::from_millis(700));
        let seq: Vec<u128> = (0..6).map(|_| b.next_delay().as_millis()).collect();
        assert_eq!(seq, [100, 200, 400, 700, 700, 700]);
        b.reset();
        assert_eq!(b.next_delay(), Duration::from_millis(100));
        // A cap below the start is raised to it.
        let mut b = Backoff::new(Duration::from_secs(2), Duration::from_secs(1));
        assert_eq!(b.next_delay(), Duration::from_secs(2));
        assert_eq!(b.next_delay(), Duration::from_secs(2));
    }

    #[test]
    fn each_distinct_error_is_reported_once() {
        let mut log = ErrorLog::default();
        let d = Duration::from_secs(1);
        assert!(log.failure("publish", "connection refused", d));
        assert!(!log.failure("publish", "connection refused", d));
        assert!(!log.failure("publish", "connection refused", d));
        assert!(log.failure("publish", "422 invalid", d));
        assert!(log.failure("publish", "connection refused", d));
        assert_eq!(log.last(), Some("connection refused"));
        assert!(log.success("publish"));
        assert!(!log.success("publish"));
        assert!(log.failure("publish", "connection refused", d));
    }
}
