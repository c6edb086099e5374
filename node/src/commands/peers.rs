//! `gridlease peers`: connected peers with their gossip scores and how they are connected
//! (direct, through a relay, or both while a relayed connection is being replaced).

use clap::Args;

use crate::api::client::ApiClient;
use crate::api::types::PeerView;
use crate::output::Printer;

/// Arguments of `gridlease peers`.
#[derive(Debug, Args)]
pub struct PeersArgs {}

/// Prints connected peers.
pub async fn run(api: &ApiClient, out: &Printer, _args: &PeersArgs) -> anyhow::Result<u8> {
    let peers: Vec<PeerView> = api.get("/v1/peers").await?;
    out.emit(&peers, |p| {
        if peers.is_empty() {
            p.line("no peers connected");
            return;
        }
        let rows = peers
            .iter()
            .map(|v| {
                vec![
                    v.peer_id.clone(),
                    v.score.map_or("-".into(), |s| format!("{s:.2}")),
                    if v.in_mesh { "yes".into() } else { "no".into() },
                    via(v),
                ]
            })
            .collect();
        p.table(
            &["peer", "score", "offer mesh", "via"],
            rows,
            &[2, 1],
            false,
        );
    });
    Ok(0)
}

/// `direct`, `relay` or `direct+relay`.
fn via(v: &PeerView) -> String {
    let relayed = v.connections.iter().any(|c| c.relayed);
    let direct = v.connections.iter().any(|c| !c.relayed);
    match (direct, relayed) {
        (true, true) => "direct+relay",
        (false, true) => "relay",
        _ => "direct",
    }
    .into()
}
