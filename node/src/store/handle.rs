//! [`StoreHandle`]: the [`Store`] on its own thread behind a bounded queue, for async code.

use std::sync::mpsc;
use std::thread;

use tokio::sync::oneshot;

use super::{Store, StoreError};

type Job = Box<dyn FnOnce(&mut Store) + Send>;

/// Queue depth of the store thread.
pub const STORE_QUEUE: usize = 1024;

/// An async handle to a [`Store`] running on its own thread. Cloneable; the thread stops when
/// the last handle is dropped.
#[derive(Clone, Debug)]
pub struct StoreHandle {
    tx: mpsc::SyncSender<Job>,
}

impl StoreHandle {
    /// Moves `store` onto a new thread.
    pub fn spawn(mut store: Store) -> Self {
        let (tx, rx) = mpsc::sync_channel::<Job>(STORE_QUEUE);
        let name = format!("store:{}", store.path.display());
        let spawned = thread::Builder::new()
            .name("gridlease-store".into())
            .spawn(move || {
                let span = tracing::info_span!("store", db = %name);
                let _guard = span.enter();
                while let Ok(job) = rx.recv() {
                    job(&mut store);
                }
            });
        if let Err(err) = spawned {
            tracing::error!(error = %err, "cannot spawn the store thread");
        }
        Self { tx }
    }

    /// Runs `f` on the store thread and awaits its result. Waits for room in the queue on a
    /// blocking-pool thread, so a full queue never blocks an async worker.
    pub async fn call<R, F>(&self, f: F) -> Result<R, StoreError>
    where
        F: FnOnce(&mut Store) -> Result<R, StoreError> + Send + 'static,
        R: Send + 'static,
    {
        let (reply, rx) = oneshot::channel();
        let job: Job = Box::new(move |s| {
            let _ = reply.send(f(s));
        });
        match self.tx.try_send(job) {
            Ok(()) => {}
            Err(mpsc::TrySendError::Full(job)) => {
                let tx = self.tx.clone();
                tokio::task::spawn_blocking(move || tx.send(job))
                    .await
                    .map_err(|_| StoreError::Closed)?
                    .map_err(|_| StoreError::Closed)?;
            }
            Err(mpsc::TrySendError::Disconnected(_)) => return Err(StoreError::Closed),
        }
        rx.await.map_err(|_| StoreError::Closed)?
    }

    /// Queues `f` without waiting; returns false (and drops the job) when the queue is full.
    /// For best-effort writes such as caching gossiped offers.
    pub fn try_submit<F>(&self, f: F) -> bool
    where
        F: FnOnce(&mut Store) + Send + 'static,
    {
        self.tx.try_send(Box::new(f)).is_ok()
    }
}
