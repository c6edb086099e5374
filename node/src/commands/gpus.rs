//! `gridlease gpus`: the GPUs the node found (NVML) or declares (`--dev-gpus`). Without a
//! running node, the local NVML inventory.

use clap::Args;

use crate::api::client::{ApiClient, ClientError};
use crate::api::types::{GpuView, GpusView};
use crate::output::Printer;

/// Arguments of `gridlease gpus`.
#[derive(Debug, Args)]
pub struct GpusArgs {}

/// The local NVML inventory as API views, or the reason there is none.
pub fn local_inventory() -> GpusView {
    use gridlease_sandbox::gpu::{GpuProbe, NvmlProbe};
    match NvmlProbe::new().and_then(|p| p.list()) {
        Ok(list) if !list.is_empty() => GpusView {
            gpus: list
                .iter()
                .map(|g| GpuView {
                    id: g.uuid.clone(),
                    model: g.name.clone(),
                    vram_mib: g.vram_mib,
                    source: "measured".into(),
                })
                .collect(),
            note: None,
        },
        Ok(_) => GpusView {
            gpus: vec![],
            note: Some("no NVIDIA GPU found; this node can rent but not provide".into()),
        },
        Err(e) => GpusView {
            gpus: vec![],
            note: Some(format!("{e}; this node can rent but not provide")),
        },
    }
}

/// Prints the GPUs.
pub async fn run(api: &ApiClient, out: &Printer, _args: &GpusArgs) -> anyhow::Result<u8> {
    let view = match api.get::<GpusView>("/v1/gpus").await {
        Ok(v) => v,
        Err(ClientError::NoNode { .. }) => local_inventory(),
        Err(e) => return Err(e.into()),
    };
    out.emit(&view, |p| {
        if view.gpus.is_empty() {
            p.line(view.note.as_deref().unwrap_or("no GPUs"));
            return;
        }
        let rows = view
            .gpus
            .iter()
            .map(|g| {
                vec![
                    g.id.clone(),
                    g.model.clone(),
                    format!("{} MiB", g.vram_mib),
                    if g.source == "declared" {
                        "declared (unverified)".into()
                    } else {
                        g.source.clone()
                    },
                ]
            })
            .collect();
        p.table(&["gpu", "model", "vram", "source"], rows, &[3, 2], false);
    });
    Ok(0)
}
