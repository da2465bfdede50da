//! Waiting out AWS's eventual consistency, in one place.
//!
//! EC2 and ELB are eventually consistent: an object created moments ago can
//! be missing from describes, and a call naming it can get `*.NotFound`,
//! for a few seconds. Two things wait for it, both bounded by
//! [`super::ClientOptions::consistency_patience`]:
//! - [`until_visible`]: a read after a create's duplicate answer (the object
//!   exists, maybe made by an attempt whose answer was lost) that must find
//!   it;
//! - [`Patience`]: a plan step that named an object this same apply created
//!   and got `*.NotFound`; the step is sent again after a backoff.

use std::future::Future;
use std::time::Duration;

use tokio::time::Instant;

use super::AwsClient;
use super::errors::AwsError;
use super::operations::Operation;

/// First and largest pause between two tries.
const FIRST_PAUSE: Duration = Duration::from_millis(200);
const MAX_PAUSE: Duration = Duration::from_secs(2);

/// A bounded, growing wait for an object to become visible.
#[derive(Debug)]
struct Patience {
    until: Instant,
    pause: Duration,
}

impl Patience {
    /// Patience of the client's `consistency_patience`, from now.
    pub(crate) fn new(aws: &AwsClient) -> Patience {
        Patience::for_duration(aws.options().consistency_patience)
    }

    /// Patience of `total`, from now.
    fn for_duration(total: Duration) -> Patience {
        Patience {
            until: Instant::now() + total,
            pause: FIRST_PAUSE,
        }
    }

    /// Sleeps before the next try; false (without sleeping) when that would
    /// pass the bound.
    pub(crate) async fn wait(&mut self) -> bool {
        let now = Instant::now();
        if now + self.pause > self.until {
            return false;
        }
        tokio::time::sleep(self.pause).await;
        self.pause = (self.pause * 2).min(MAX_PAUSE);
        true
    }

    /// Whether a step that failed with `error` should be sent again: it met
    /// `*.NotFound` and the patience is not spent (then it has slept).
    async fn retry_not_found(&mut self, error: &AwsError) -> bool {
        if !error.is_not_found() {
            return false;
        }
        tracing::info!(error = %error, "an object created moments ago may not be visible yet; trying again");
        self.wait().await
    }
}

/// The window an apply opens when one of its steps creates something: a
/// later step that meets `*.NotFound` is sent again with [`Patience`]
/// (it may name the new object before describes see it). Before any
/// create, a not-found answer is final.
#[derive(Debug, Default)]
pub(crate) struct AfterCreate(Option<Patience>);

impl AfterCreate {
    /// A step created something: open the window (once).
    pub(crate) fn created(&mut self, aws: &AwsClient) {
        self.0.get_or_insert_with(|| Patience::new(aws));
    }

    /// Whether a step that failed with `error` should be sent again (then
    /// it has slept).
    pub(crate) async fn retry(&mut self, error: &AwsError) -> bool {
        match self.0.as_mut() {
            Some(patience) => patience.retry_not_found(error).await,
            None => false,
        }
    }
}

/// Runs `read` until it finds what it looks for, within the client's
/// consistency patience; [`AwsError::NotFound`] naming `what` (as found by
/// `operation`) when it never does.
pub(crate) async fn until_visible<T, F, Fut>(
    aws: &AwsClient,
    operation: Operation,
    what: &str,
    mut read: F,
) -> Result<T, AwsError>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<Option<T>, AwsError>>,
{
    let mut patience = Patience::new(aws);
    loop {
        if let Some(found) = read().await? {
            return Ok(found);
        }
        if !patience.wait().await {
            return Err(AwsError::NotFound {
                operation,
                what: what.to_string(),
            });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn patience_grows_its_pauses_and_ends_at_its_bound() {
        let start = Instant::now();
        let mut patience = Patience::for_duration(Duration::from_secs(5));
        let mut tries = 0;
        while patience.wait().await {
            tries += 1;
        }
        // 0.2 + 0.4 + 0.8 + 1.6 + 2 (the cap) = 5 s; one more would pass it.
        assert_eq!(tries, 5);
        assert_eq!(start.elapsed(), Duration::from_secs(5));
    }

    #[tokio::test(start_paused = true)]
    async fn only_a_not_found_is_retried() {
        let not_found = AwsError::NotFound {
            operation: Operation::Ec2AuthorizeSecurityGroupIngress,
            what: "sg-1".to_string(),
        };
        let other = AwsError::Stopped {
            operation: Operation::Ec2AuthorizeSecurityGroupIngress,
            attempts: 0,
        };
        let mut patience = Patience::for_duration(Duration::from_secs(5));
        assert!(!patience.retry_not_found(&other).await);
        assert!(patience.retry_not_found(&not_found).await);
    }
}
