//! The network loop's periodic work ([`Timers`]): one timer per [`Tick`], delayed (not
//! bunched) when the loop was busy. The loop hands each tick to the child whose work it is.

use std::time::Duration;

use super::NodeConfig;

/// How often admitted offers are written to the store.
const OFFER_FLUSH_PERIOD: Duration = Duration::from_secs(1);

/// The loop's periodic work, one timer each.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Tick {
    /// The announce round (`EventLoop::announce`).
    Announce,
    /// The book's reputation scores follow the records.
    Rescore,
    /// Own completion records go out again; a completion anti-entropy round.
    Republish,
    /// An offer anti-entropy round.
    Resync,
    /// Admitted offers go to the store.
    Flush,
    /// A DHT random walk.
    KadWalk,
    /// Liveness, relayed connections to retire, a paced re-sign.
    Live,
}

/// The timers behind [`Tick`]s (delayed, not bunched, when the loop was busy).
pub(super) struct Timers {
    announce: tokio::time::Interval,
    rescore: tokio::time::Interval,
    republish: tokio::time::Interval,
    resync: tokio::time::Interval,
    flush: tokio::time::Interval,
    kad_walk: tokio::time::Interval,
    live: tokio::time::Interval,
}

impl Timers {
    /// The periods `config` sets.
    pub(super) fn new(config: &NodeConfig) -> Self {
        let delayed = |mut i: tokio::time::Interval| {
            i.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            i
        };
        Self {
            announce: delayed(tokio::time::interval(config.announce_period)),
            rescore: delayed(tokio::time::interval(super::reputation::RESCORE_PERIOD)),
            republish: delayed(tokio::time::interval(config.completions_republish)),
            resync: delayed(tokio::time::interval_at(
                tokio::time::Instant::now() + config.offer_resync,
                config.offer_resync,
            )),
            flush: delayed(tokio::time::interval(OFFER_FLUSH_PERIOD)),
            kad_walk: delayed(tokio::time::interval(Duration::from_secs(300))),
            live: delayed(tokio::time::interval(Duration::from_millis(250))),
        }
    }

    /// The next tick due, in this order when several are.
    pub(super) async fn next(&mut self) -> Tick {
        tokio::select! {
            biased;
            _ = self.announce.tick() => Tick::Announce,
            _ = self.rescore.tick() => Tick::Rescore,
            _ = self.republish.tick() => Tick::Republish,
            _ = self.resync.tick() => Tick::Resync,
            _ = self.flush.tick() => Tick::Flush,
            _ = self.kad_walk.tick() => Tick::KadWalk,
            _ = self.live.tick() => Tick::Live,
        }
    }
}
