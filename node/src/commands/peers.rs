//! `gridlease peers`: connected peers with their gossip scores.

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
                ]
            })
            .collect();
        p.table(&["peer", "score", "offer mesh"], rows, &[2, 1], false);
    });
    Ok(0)
}
