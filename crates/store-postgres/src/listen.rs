//! The change listener: one connection of its own that `LISTEN`s on `quiver_definitions`
//! (the channel the definitions trigger notifies, with the new version as payload) and
//! publishes the newest version seen, and on `quiver_jobs` (notified in the transaction that
//! creates a job; a requeued job is a new one) and counts those announcements. It reconnects when the connection is lost,
//! and reads the version then, so a change made while it was away is not missed; a
//! reconnection also counts as a job announcement, since a job may have been queued
//! meanwhile.

use std::time::Duration;

use futures::StreamExt;
use tokio::sync::watch;
use tokio_postgres::AsyncMessage;

use crate::tls::Connector;

/// The channel the definitions trigger notifies.
pub(crate) const CHANNEL: &str = "quiver_definitions";

/// The channel a transaction that queues a job notifies.
pub(crate) const JOBS_CHANNEL: &str = "quiver_jobs";

/// Where the listener publishes what it hears.
pub(crate) struct Heard {
    /// The newest definitions version.
    pub(crate) versions: watch::Sender<u64>,
    /// How many job announcements came (and reconnections, which may have missed some).
    pub(crate) jobs: watch::Sender<u64>,
}

/// Publishes `v` when it is newer than the version held.
pub(crate) fn publish(tx: &watch::Sender<u64>, v: u64) {
    tx.send_if_modified(|held| {
        let newer = v > *held;
        if newer {
            *held = v;
        }
        newer
    });
}

/// The listener task: runs until the store drops it (it is aborted with the store).
pub(crate) async fn run(cfg: tokio_postgres::Config, tls: Connector, location: String, tx: Heard) {
    let mut pause = Duration::from_millis(100);
    let mut lost = false;
    loop {
        match listen_once(&cfg, &tls, &tx, &mut lost, &mut pause).await {
            Ok(()) => {}
            Err(e) => {
                if !lost {
                    tracing::warn!(%location, error = %crate::error::classify(&location, &e), "the change listener lost the server; reconnecting");
                }
                lost = true;
            }
        }
        tokio::time::sleep(pause).await;
        pause = (pause * 2).min(Duration::from_secs(5));
    }
}

/// One connection's life: connect, listen, read the version, publish every notification.
async fn listen_once(
    cfg: &tokio_postgres::Config,
    tls: &Connector,
    tx: &Heard,
    lost: &mut bool,
    pause: &mut Duration,
) -> Result<(), tokio_postgres::Error> {
    let (client, mut conn) = cfg.connect(tls.clone()).await?;
    let (ntx, mut nrx) = tokio::sync::mpsc::unbounded_channel();
    let driver = tokio::spawn(async move {
        let mut messages = futures::stream::poll_fn(move |cx| conn.poll_message(cx));
        while let Some(m) = messages.next().await {
            match m {
                Ok(AsyncMessage::Notification(n)) => {
                    if ntx.send(n).is_err() {
                        return Ok(());
                    }
                }
                Ok(_) => {}
                Err(e) => return Err(e),
            }
        }
        Ok(())
    });
    let setup = async {
        client
            .batch_execute(&format!("LISTEN {CHANNEL}; LISTEN {JOBS_CHANNEL}"))
            .await?;
        let row = client
            .query_one("SELECT version FROM definitions_version WHERE id = 1", &[])
            .await?;
        Ok::<i64, tokio_postgres::Error>(row.get(0))
    };
    let version = match setup.await {
        Ok(v) => v,
        Err(e) => {
            driver.abort();
            return Err(e);
        }
    };
    if *lost {
        tracing::info!("the change listener is connected again");
        *lost = false;
    }
    *pause = Duration::from_millis(100);
    publish(&tx.versions, u64::try_from(version).unwrap_or(0));
    tx.jobs.send_modify(|n| *n += 1);
    while let Some(n) = nrx.recv().await {
        if n.channel() == JOBS_CHANNEL {
            tx.jobs.send_modify(|n| *n += 1);
        } else if let Ok(v) = n.payload().parse::<u64>() {
            publish(&tx.versions, v);
        }
    }
    drop(client);
    match driver.await {
        Ok(result) => result,
        Err(_) => Ok(()),
    }
}
