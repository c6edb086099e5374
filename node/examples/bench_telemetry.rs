//! What live telemetry (`gridlease top`, issue 18) costs a provider: CPU for 1 Hz sampling of
//! 8 leased GPUs, and bytes on the wire per minute for a renter watching.
//!
//! `cargo build --release -p gridlease-node --example bench_telemetry && target/release/examples/bench_telemetry [TICKS]`
//!
//! Per tick (what the provider does once a second per lease, besides the Docker stats it reads
//! for metering anyway): sample 8 GPUs from the scripted probe (`sandbox::meter::sample_gpus`,
//! the function the metering loop calls; NVML's own call cost is not measured here: no GPU),
//! turn them into a telemetry sample (`lease::telemetry::sample`), push it onto the lease's
//! ring; and once a second answer a renter's poll: the ring's samples after the last one sent
//! (`Ring::after`), encoded as the lease stream's response. CPU is this thread's CPU time over
//! `TICKS` (default 100,000) ticks, as a share of one core at 1 Hz. Bytes: the encoded
//! request and response bodies of one poll answering one sample, times 60, plus the lease
//! stream's 4-byte length prefix each way (noise/yamux framing not counted).

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::print_stdout)]

use cpu_time::ThreadTime;
use gridlease_node::lease::telemetry::{Ring, sample};
use gridlease_protocol::session::{
    LeaseRpc, LeaseRpcResponse, MAX_REQUEST_FRAME, MAX_RESPONSE_FRAME, SessionRequest,
    SessionResponse,
};
use gridlease_protocol::telemetry::TelemetrySource;
use gridlease_protocol::{Digest, LeaseId, Timestamp, codec};
use gridlease_sandbox::gpu::{GpuProbe, ScriptedProbe};
use gridlease_sandbox::meter::{LiveSample, StatsSample, sample_gpus};

const GPUS: usize = 8;

fn main() {
    let ticks: u64 = std::env::args()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(100_000);
    let mut probe = ScriptedProbe::from_dev_spec("8x RTX 4090:24GiB:0.40").unwrap();
    let curve = r#"{"util_percent":[17,83,45],"vram_used_mib":[1111,2222,20000],"power_w":[150,250],"temp_c":[41,62],"sm_clock_mhz":[1500,2100]}"#;
    probe
        .set_curves_json(&format!("[{}]", [curve; GPUS].join(",")))
        .unwrap();
    let uuids: Vec<String> = probe.list().unwrap().into_iter().map(|g| g.uuid).collect();
    let ring = Ring::new(
        TelemetrySource::Scripted,
        vec!["NVIDIA GeForce RTX 4090".into(); GPUS],
    );
    let lease_id = LeaseId(Digest::of("bench", b"lease"));
    let stats = |i: u64| StatsSample {
        at: Timestamp(1_000_000 + i * 1000),
        cpu_total_ns: i * 700_000_000,
        mem_bytes: 3 << 30,
        mem_limit_bytes: 64 << 30,
        ..Default::default()
    };

    let t = ThreadTime::now();
    let mut bytes = 0usize;
    for i in 1..=ticks {
        let gpus = sample_gpus(&uuids, &probe);
        let live = LiveSample {
            stats: stats(i),
            prev: Some(stats(i - 1)),
            gpus: &gpus,
        };
        ring.push(sample(&live, &uuids, GPUS));
        let answer = ring.after(stats(i - 1).at);
        let body = codec::encode::<LeaseRpcResponse, MAX_RESPONSE_FRAME>(
            &LeaseRpcResponse::Session(SessionResponse::Telemetry(answer)),
        )
        .unwrap();
        bytes = body.len();
        std::hint::black_box(&body);
    }
    let per_tick = t.elapsed().as_secs_f64() / ticks as f64;
    let request = codec::encode::<LeaseRpc, MAX_REQUEST_FRAME>(&LeaseRpc::Session(
        SessionRequest::Telemetry {
            lease_id,
            after: Timestamp(u64::from(u32::MAX) * 1000),
        },
    ))
    .unwrap()
    .len();
    println!(
        "{ticks} ticks, {GPUS} GPUs: {:.1} us CPU per tick = {:.4} % of one core at 1 Hz",
        per_tick * 1e6,
        per_tick * 100.0
    );
    println!(
        "one poll: request {request} B + response {bytes} B (+4 B length prefix each); \
         {} B per minute per watched lease at 1 Hz",
        60 * (request + bytes + 8)
    );
}
