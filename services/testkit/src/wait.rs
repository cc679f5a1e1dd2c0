//! Waiting on conditions instead of sleeping: poll until the condition holds, fail naming what was awaited
//! once the deadline passes. A deadline is a bound on a hang, never a timing assertion.

use std::time::{Duration, Instant};

use anyhow::{Result, bail};

/// Polls `f` every 100 ms until it returns `Some`; fails naming `what` after `secs` seconds.
pub async fn eventually<T>(what: &str, secs: u64, f: impl AsyncFnMut() -> Option<T>) -> Result<T> {
    eventually_every(what, secs, Duration::from_millis(100), f).await
}

/// [`eventually`], polling every `every` (for checks that are expensive to make, such as running a CLI).
pub async fn eventually_every<T>(
    what: &str,
    secs: u64,
    every: Duration,
    mut f: impl AsyncFnMut() -> Option<T>,
) -> Result<T> {
    until_every(what, secs, every, async || Ok(f().await)).await
}

/// Polls `f` every 100 ms until it returns `Ok(Some)`; an `Err` ends the wait at once (the condition can
/// no longer become true); fails naming `what` after `secs` seconds.
pub async fn until<T>(
    what: &str,
    secs: u64,
    f: impl AsyncFnMut() -> Result<Option<T>>,
) -> Result<T> {
    until_every(what, secs, Duration::from_millis(100), f).await
}

/// [`until`], polling every `every`.
pub async fn until_every<T>(
    what: &str,
    secs: u64,
    every: Duration,
    mut f: impl AsyncFnMut() -> Result<Option<T>>,
) -> Result<T> {
    let deadline = Instant::now() + Duration::from_secs(secs);
    loop {
        if let Some(t) = f().await? {
            return Ok(t);
        }
        if Instant::now() > deadline {
            bail!("timed out after {secs}s waiting for {what}");
        }
        tokio::time::sleep(every).await;
    }
}

/// Waits until the server has read everything `client` sent so far, its subscriptions included.
/// async-nats' `flush` only writes the socket: a message another connection publishes right after can
/// reach the server before the subscription does, and be missed. A message to itself on a fresh inbox
/// comes back only once the server has read all that came before it. (Its user must be allowed to
/// publish and subscribe on its inbox; for one that may not, publish until the subscriber receives.)
pub async fn round_trip(client: &async_nats::Client) -> Result<()> {
    let inbox = client.new_inbox();
    let mut echo = client.subscribe(inbox.clone()).await?;
    client.publish(inbox, "".into()).await?;
    client.flush().await?;
    match tokio::time::timeout(Duration::from_secs(10), futures::StreamExt::next(&mut echo)).await {
        Ok(Some(_)) => Ok(()),
        _ => bail!("no round trip to the server within 10s"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn waits_for_the_condition_and_names_it_when_it_never_holds() {
        let mut n = 0;
        let got = eventually("the third poll", 5, async || {
            n += 1;
            (n == 3).then_some(n)
        })
        .await
        .unwrap();
        assert_eq!(got, 3);
        let err = eventually_every("never", 0, Duration::from_millis(1), async || None::<()>)
            .await
            .unwrap_err();
        assert!(err.to_string().contains("never"), "{err}");
        let err = until("a failing check", 5, async || -> Result<Option<()>> {
            bail!("broken")
        })
        .await
        .unwrap_err();
        assert_eq!(err.to_string(), "broken");
    }
}
