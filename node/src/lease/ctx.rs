//! [`Ctx`]: the shared, immutable context of the service and all its sessions.

use std::path::PathBuf;
use std::sync::Arc;

use gridlease_protocol::{Digest, LeaseId};
use gridlease_sandbox::Sandbox;
use tokio::sync::{mpsc, watch};
use tokio_util::sync::CancellationToken;

use super::config::LeaseServiceConfig;
use super::error::LeaseError;
use super::{hours, telemetry};
use crate::net::Client;
use crate::store::{StoreHandle, StoredLease};

/// Shared, immutable context of all sessions.
#[derive(Debug)]
pub(crate) struct Ctx {
    pub(crate) client: Client,
    pub(crate) store: StoreHandle,
    pub(crate) config: LeaseServiceConfig,
    pub(crate) sandbox: Option<Sandbox>,
    pub(crate) node_id: String,
    pub(crate) cancel: CancellationToken,
    /// Bounds the tasks answering peers' log requests ([`logs::LOG_READERS`]).
    pub(crate) log_reads: Arc<tokio::sync::Semaphore>,
    /// Provider: the GPUs (UUID digests) leases hold now, as the desk last published them;
    /// [`capacity::run`] turns each change into the offer's free count.
    pub(crate) holds: watch::Sender<std::collections::BTreeSet<Digest>>,
    /// Provider: GiB the kept volumes (issue 47) take, as the desk last published it;
    /// [`capacity::run`] takes it out of the offer's disk.
    pub(crate) volume_gib: watch::Sender<u64>,
    /// Provider: GiB the finished leases' kept outputs take on disk (their workspace images'
    /// allocated blocks, which no longer grow), as [`super::outputs::sweep`] last measured.
    pub(crate) kept_outputs_gib: watch::Sender<u64>,
    /// Provider: offered GPUs that are the owner's now ([`super::owner::run`]): in use by the owner
    /// (recently, or outside the offered hours: then all of them): not given to leases, not
    /// counted free.
    pub(crate) owner_busy: watch::Sender<std::collections::BTreeSet<Digest>>,
    /// Provider: the hours the GPUs are offered, as the last `provide` set them (or
    /// `<home>/provide.json` at start); [`super::owner::run`] withdraws the GPUs outside them.
    /// Written by [`LeaseService::provide`] only.
    pub(crate) hours: watch::Sender<Option<hours::Hours>>,
    /// Provider: a session whose GPUs are free says so here before it publishes its settled
    /// view, so that the desk has released them before anyone who saw the view can ask for
    /// them ([`Ctx::gpus_free`]). The session's end releases them too (idempotent).
    pub(super) released: mpsc::Sender<LeaseId>,
    /// Provider: a volume made of a lease's `/workspace` asks that lease's session to end
    /// ([`Ctx::hand_over`]).
    pub(super) handovers: mpsc::Sender<LeaseId>,
    /// A lease ended: [`retention::run`] sweeps finished leases' logs now, not only on its
    /// period.
    pub(crate) log_sweep: tokio::sync::Notify,
}

impl Ctx {
    /// An empty telemetry ring for a provider lease of `gpus` (digests, in the lease's order):
    /// their model names from the node's offer template, the source from its sampler.
    pub(super) fn telemetry_ring(&self, gpus: &[Digest]) -> telemetry::Ring {
        use gridlease_protocol::telemetry::TelemetrySource;
        let offered = self
            .config
            .base_template
            .as_ref()
            .map(|t| t.gpus.as_slice())
            .unwrap_or_default();
        let models = gpus
            .iter()
            .map(|d| {
                offered
                    .iter()
                    .find(|g| g.spec.uuid_digest == *d)
                    .map_or_else(|| "GPU".to_string(), |g| g.spec.model.clone())
            })
            .collect();
        let source = self
            .config
            .gpu_sampler
            .as_ref()
            .map_or(TelemetrySource::None, |s| s.source);
        telemetry::Ring::new(source, models)
    }

    /// The stored lease `id`, or [`LeaseError::Unknown`].
    pub(super) async fn stored_lease(&self, id: LeaseId) -> Result<StoredLease, LeaseError> {
        self.store
            .call(move |s| s.lease(&id))
            .await?
            .ok_or(LeaseError::Unknown(id))
    }
}

impl Ctx {
    pub(crate) fn log_path(&self, id: &LeaseId) -> PathBuf {
        self.config.data_dir.join(format!("{id}.log"))
    }

    /// Where the leases' workspace images live (`gridlease_sandbox::workspace`).
    pub(crate) fn workspace_dir(&self) -> PathBuf {
        gridlease_sandbox::workspace::dir(&self.config.data_dir)
    }

    /// Now, by the service's clock.
    pub(crate) fn now(&self) -> gridlease_protocol::Timestamp {
        self.config.clock.now()
    }

    /// Provider session: the lease's GPUs are free (its container is gone or stopped). Never
    /// waits: a full queue leaves the release to the session's end.
    pub(crate) fn gpus_free(&self, id: LeaseId) {
        let _ = self.released.try_send(id);
    }

    /// Provider: asks the session of lease `id` to end, its workspace kept for the volume
    /// that adopts it ([`SessionMsg::HandOver`]). Never waits: the volume's start asks again
    /// until the lease is over.
    pub(crate) fn hand_over(&self, id: LeaseId) {
        let _ = self.handovers.try_send(id);
    }
}
