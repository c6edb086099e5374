//! Optional Prometheus endpoint (`gridlease node --metrics ADDR`): `GET /metrics` in the
//! OpenMetrics text format. Values are read from the node when scraped, so nothing is added to
//! the network event loop's hot path.

use std::sync::Arc;
use std::sync::atomic::AtomicU64;
use std::time::Instant;

use axum::Router;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::IntoResponse;
use axum::routing::get;
use prometheus_client::collector::Collector;
use prometheus_client::encoding::text::encode;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use tokio_util::sync::CancellationToken;

use crate::lease::LeaseService;
use crate::net::{Client, GossipStats};

#[derive(Clone)]
struct MetricsState {
    client: Client,
    leases: LeaseService,
    started: Instant,
    registry: Arc<Registry>,
    running_leases: Gauge,
    active_leases: Gauge,
    earned: Gauge<f64, AtomicU64>,
    spent: Gauge<f64, AtomicU64>,
    peers: Gauge,
    offers: Gauge,
    providing_gpus: Gauge,
    price: Gauge<f64, AtomicU64>,
    uptime: Gauge,
    gossip: Arc<std::sync::Mutex<GossipStats>>,
}

/// Offer gossip counters, as OpenMetrics counters, from the snapshot taken at each scrape.
#[derive(Debug)]
struct GossipCollector(Arc<std::sync::Mutex<GossipStats>>);

impl Collector for GossipCollector {
    fn encode(&self, mut encoder: DescriptorEncoder<'_>) -> Result<(), std::fmt::Error> {
        let g = self.0.lock().map(|g| *g).unwrap_or_default();
        let rows: [(&str, &str, u64); 5] = [
            (
                "gossip_offers_accepted",
                "Gossiped offers accepted and forwarded",
                g.accepted,
            ),
            (
                "gossip_offers_rejected",
                "Gossiped offers rejected (the forwarding peer is penalised)",
                g.rejected,
            ),
            (
                "gossip_offers_ignored",
                "Gossiped offers dropped without penalty (rate limits, recent refresh, full book)",
                g.ignored,
            ),
            (
                "offer_signatures_checked",
                "Offer signatures verified (strict ed25519)",
                g.signatures_checked,
            ),
            (
                "offer_signatures_skipped",
                "Offers byte-identical to one verified before, accepted without a signature check",
                g.signatures_skipped,
            ),
        ];
        for (name, help, v) in rows {
            let c = ConstCounter::new(v);
            let m = encoder.encode_descriptor(name, help, None, c.metric_type())?;
            c.encode(m)?;
        }
        Ok(())
    }
}

/// Interactive access counters (`crate::access::AccessStats`), read at each scrape:
/// `access_streams_granted_total{kind}`, `access_streams_refused_total{kind}` and
/// `access_forwarded_bytes_total`.
#[derive(Debug)]
struct AccessCollector(crate::access::SharedStats);

impl Collector for AccessCollector {
    fn encode(&self, mut encoder: DescriptorEncoder<'_>) -> Result<(), std::fmt::Error> {
        let c = self.0.snapshot();
        for (name, help, values) in [
            (
                "access_streams_granted",
                "Shell, exec, forward and file-copy streams this provider granted to a lease's renter",
                c.granted,
            ),
            (
                "access_streams_refused",
                "Shell, exec, forward and file-copy streams this provider refused (not the renter, not running, not offered, port closed)",
                c.refused,
            ),
        ] {
            let mut family = encoder.encode_descriptor(
                name,
                help,
                None,
                prometheus_client::metrics::MetricType::Counter,
            )?;
            for (kind, v) in ["shell", "exec", "forward", "files"]
                .into_iter()
                .zip(values)
            {
                let labels = [("kind", kind)];
                let m = family.encode_family(&labels)?;
                ConstCounter::new(v).encode(m)?;
            }
        }
        let bytes = ConstCounter::new(c.forwarded_bytes);
        let m = encoder.encode_descriptor(
            "access_forwarded_bytes",
            "Bytes carried through forwarded ports, both ways",
            None,
            bytes.metric_type(),
        )?;
        bytes.encode(m)
    }
}

/// Serves metrics on `addr` until `cancel`. Returns once bound.
pub async fn serve(
    addr: &str,
    client: Client,
    leases: LeaseService,
    access: crate::access::SharedStats,
    cancel: CancellationToken,
) -> anyhow::Result<tokio::task::JoinHandle<()>> {
    let mut registry = Registry::with_prefix("gridlease");
    registry.register_collector(Box::new(AccessCollector(access)));
    let state = MetricsState {
        client,
        leases,
        started: Instant::now(),
        registry: Arc::new(Registry::default()),
        running_leases: Gauge::default(),
        active_leases: Gauge::default(),
        earned: Gauge::default(),
        spent: Gauge::default(),
        peers: Gauge::default(),
        offers: Gauge::default(),
        providing_gpus: Gauge::default(),
        price: Gauge::default(),
        uptime: Gauge::default(),
        gossip: Arc::default(),
    };
    registry.register_collector(Box::new(GossipCollector(state.gossip.clone())));
    registry.register(
        "connected_peers",
        "Peers connected now",
        state.peers.clone(),
    );
    registry.register(
        "offers_known",
        "Offers in the local book",
        state.offers.clone(),
    );
    registry.register(
        "own_offer_gpus",
        "GPUs in this node's own offer (0 when not providing)",
        state.providing_gpus.clone(),
    );
    registry.register(
        "own_offer_price_per_gpu_hour",
        "Asking price of this node's offer per GPU-hour",
        state.price.clone(),
    );
    registry.register(
        "uptime_seconds",
        "Seconds since the daemon started",
        state.uptime.clone(),
    );
    registry.register(
        "leases_running",
        "Leases whose container runs now (either role)",
        state.running_leases.clone(),
    );
    registry.register(
        "leases_active",
        "Leases not yet settled, rejected or failed (either role)",
        state.active_leases.clone(),
    );
    registry.register(
        "earned_total",
        "Total booked as provider, in units (from the ledger)",
        state.earned.clone(),
    );
    registry.register(
        "spent_total",
        "Total booked as renter, in units (from the ledger)",
        state.spent.clone(),
    );
    let state = MetricsState {
        registry: Arc::new(registry),
        ..state
    };
    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .map_err(|e| anyhow::anyhow!("cannot serve metrics on {addr}: {e}"))?;
    tracing::info!(%addr, "metrics endpoint listening");
    let app = Router::new()
        .route("/metrics", get(scrape))
        .with_state(state);
    Ok(tokio::spawn(async move {
        let _ = axum::serve(listener, app)
            .with_graceful_shutdown(async move { cancel.cancelled().await })
            .await;
    }))
}

async fn scrape(State(s): State<MetricsState>) -> impl IntoResponse {
    let gauge = |v: usize| i64::try_from(v).unwrap_or(i64::MAX);
    if let Ok(p) = s.client.connected_peers().await {
        s.peers.set(gauge(p.len()));
    }
    if let Ok(g) = s.client.gossip_stats().await
        && let Ok(mut held) = s.gossip.lock()
    {
        *held = g;
    }
    if let Ok(n) = s.client.book_len().await {
        s.offers.set(gauge(n));
    }
    match s.client.own_offer().await {
        Ok(Some(o)) => {
            s.providing_gpus.set(gauge(o.offer.gpus.len()));
            s.price.set(o.offer.price_per_gpu_hour as f64 / 1e6);
        }
        Ok(None) => {
            s.providing_gpus.set(0);
            s.price.set(0.0);
        }
        Err(_) => {}
    }
    // Live sessions and one aggregate: a scrape's cost does not grow with settled leases.
    if let Ok(views) = s.leases.live_leases().await {
        let running = views
            .iter()
            .filter(|v| v.state == gridlease_contracts::LeaseState::Running)
            .count();
        let active = views.iter().filter(|v| !v.is_terminal()).count();
        s.running_leases.set(gauge(running));
        s.active_leases.set(gauge(active));
    }
    if let Ok((earned, spent)) = s.leases.ledger_totals().await {
        s.earned.set(earned as f64 / 1e6);
        s.spent.set(spent as f64 / 1e6);
    }
    s.uptime
        .set(i64::try_from(s.started.elapsed().as_secs()).unwrap_or(i64::MAX));
    let mut body = String::new();
    match encode(&mut body, &s.registry) {
        Ok(()) => (
            StatusCode::OK,
            [(
                header::CONTENT_TYPE,
                "application/openmetrics-text; version=1.0.0; charset=utf-8",
            )],
            body,
        ),
        Err(e) => (
            StatusCode::INTERNAL_SERVER_ERROR,
            [(header::CONTENT_TYPE, "text/plain")],
            e.to_string(),
        ),
    }
}
