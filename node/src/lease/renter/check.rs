//! The renter's GPU checks in its session (issue 44): the check in the provider's unbilled
//! verification window at the start, and a re-check of the running lease on demand
//! (`gridlease verify-gpu`); the exchange itself is `crate::lease::gpu_check`.

use gridlease_protocol::{CloseReason, Timestamp};

use super::{Flow, Liveness, Session};

impl Session {
    /// The GPU check in the provider's verification window (until `until`, its clock): run
    /// here, before anything else; a pass lets the start go on, anything else closes the
    /// lease unbilled ([`super::gpu_check`]).
    pub(super) async fn verify(&mut self, w: &mut Liveness, until: Timestamp) -> Flow {
        let ctx = self.ctx.clone();
        let (Some(peer), true) = (self.provider_peer, self.check.is_none() && !w.heard_any) else {
            return Flow::Continue;
        };
        let window = std::time::Duration::from_millis(
            until
                .ms_since(ctx.now())
                .min(u64::from(self.lease.terms.verify_window_s) * 1000),
        );
        self.check = Some(crate::lease::check_view::GpuCheckView::verifying());
        self.publish();
        let outcome = crate::lease::gpu_check::run(&ctx, peer, &self.lease.terms, window).await;
        w.last_heard = ctx.now();
        let (passed, reason) = match outcome {
            Some(o) => {
                self.check = Some(o.view);
                (o.passed, CloseReason::GpuCheckFailed)
            }
            None => {
                self.check = None;
                (false, CloseReason::RenterStop)
            }
        };
        self.publish();
        if passed {
            return Flow::Continue;
        }
        // Nothing was billed: the command never started.
        self.send_close(reason);
        self.settle(reason).await;
        Flow::End
    }

    /// Re-checks the running lease's GPUs (`gridlease verify-gpu`): the same check as at the
    /// start, billed as usage (the lease runs on either way; the record is kept, a failure
    /// never replaced).
    pub(super) async fn recheck(
        &mut self,
    ) -> Result<crate::lease::check_view::GpuCheckView, String> {
        if self.lease.state != gridlease_contracts::LeaseState::Running {
            return Err(format!("the lease is {}", self.lease.state.as_str()));
        }
        let Some(peer) = self.provider_peer else {
            return Err("the provider's peer id is unknown".into());
        };
        let window = std::time::Duration::from_secs(120);
        match crate::lease::gpu_check::run(&self.ctx, peer, &self.lease.terms, window).await {
            Some(o) => {
                if self.check.as_ref().is_none_or(|c| c.state != "failed") {
                    self.check = Some(o.view.clone());
                    self.publish();
                }
                Ok(o.view)
            }
            None => Err("the lease's offer has no GPU check (or is not kept here)".into()),
        }
    }
}
