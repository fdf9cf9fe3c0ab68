//! The change-feed plumbing every backend shares: a backend turns its own
//! notification source (a broadcast channel, `LISTEN`, pub/sub, a watch, a
//! polled counter) into a stream of notices that ends when the source is
//! lost; [`spawn`] forwards it into a [`ChangeFeed`].

use futures_util::{Stream, StreamExt};
use tokio::sync::mpsc;

use super::ChangeFeed;

/// Forwards `notices` into a new feed from a task of its own. Notices
/// coalesce (the feed holds at most one pending wake-up); the task ends when
/// the subscriber drops the feed, or when `notices` ends, which closes the
/// feed: the coordinator then polls and subscribes anew, so no gap goes
/// unnoticed.
pub(crate) fn spawn<S>(notices: S) -> ChangeFeed
where
    S: Stream<Item = ()> + Send + 'static,
{
    let (tx, feed) = mpsc::channel(1);
    tokio::spawn(async move {
        let mut notices = std::pin::pin!(notices);
        loop {
            tokio::select! {
                _ = tx.closed() => return,
                next = notices.next() => match next {
                    Some(()) => {
                        let _ = tx.try_send(());
                    }
                    None => return,
                },
            }
        }
    });
    feed
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use futures_util::stream;

    use super::*;

    #[tokio::test]
    async fn notices_coalesce_and_the_feed_closes_with_its_source() {
        let (tx, rx) = mpsc::unbounded_channel::<()>();
        let notices = stream::unfold(rx, |mut rx| async move { rx.recv().await.map(|n| (n, rx)) });
        let mut feed = spawn(notices);
        for _ in 0..3 {
            tx.send(()).unwrap();
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
        assert_eq!(feed.recv().await, Some(()));
        assert!(feed.try_recv().is_err(), "three notices woke once");
        drop(tx);
        assert_eq!(feed.recv().await, None, "the feed ends with its source");
    }
}
