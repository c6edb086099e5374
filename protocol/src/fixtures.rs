//! Deterministic sample messages for tests, benchmarks, fuzz seeds and the simulator.
//! Every value here is valid under [`crate::messages::Shape`].

use std::collections::BTreeMap;

use crate::envelope::NetworkId;
use crate::identity::PublicKey;
use crate::messages::{
    Attestation, BenchReport, CloseReason, ComputeCapability, GpuSpec, LeaseClose, LeaseTerms,
    NetworkPolicy, Offer, OfferedGpu, PaymentReceipt, ResourcesPerGpu, SandboxPolicy, UsageReport,
};
use crate::types::{Digest, LeaseId, OfferId, Timestamp};

/// A fixed point in time: 2026-01-01T00:00:00Z.
pub const T0: Timestamp = Timestamp(1_767_225_600_000);

/// A declared RTX 4090, index `i` giving it a distinct UUID digest.
pub fn gpu(i: u8) -> OfferedGpu {
    OfferedGpu {
        spec: GpuSpec {
            model: "NVIDIA GeForce RTX 4090".into(),
            vram_mib: 24_564,
            uuid_digest: Digest::of("fixture-gpu", &[i]),
            compute_capability: ComputeCapability { major: 8, minor: 9 },
            driver_version: "550.54.14".into(),
            cuda_version: "12.4".into(),
            pcie_gen: 4,
            pcie_width: 16,
            power_limit_w: 450,
        },
        bench: BenchReport {
            fp32_gflops: 82_600,
            fp16_gflops: 165_200,
            device_mem_mbps: 1_008_000,
            h2d_mbps: 25_000,
            tool_version: "gridlease-bench 0.1".into(),
            measured_at: T0,
            attestation: Attestation::Declared,
        },
    }
}

/// An offer of `gpus` GPUs at `price` micro-units per GPU-hour.
pub fn offer(provider: PublicKey, seq: u64, gpus: u8, price: u64) -> Offer {
    Offer {
        proof: Default::default(),
        provider,
        seq,
        created_at: T0,
        expires_at: T0.plus_secs(300),
        gpus: (0..gpus).map(gpu).collect(),
        per_gpu: ResourcesPerGpu {
            cpu_millicores: 8000,
            ram_mib: 32 * 1024,
            disk_gib: 100,
            net_mbps: 500,
        },
        price_per_gpu_hour: price,
        min_duration_s: 60,
        max_duration_s: 24 * 3600,
        min_billed_s: 60,
        usage_interval_s: 10,
        pay_ahead_s: 60,
        sandbox: SandboxPolicy {
            volumes: crate::VolumePolicy::default(),
            network: NetworkPolicy::None,
            image_prefixes: vec![],
            access: crate::access::AccessPolicy::ALL,
            isolation: crate::Isolation::Runc,
            output_retention_s: 0,
            upload_hold_s: 0,
            registries: vec!["docker.io".into()],
            local_images: Vec::new(),
        },
        addrs: vec!["/ip4/127.0.0.1/tcp/4001".into()],
        region: "eu-west".into(),
        free_gpus: u16::from(gpus),
        interruptible: false,
        settlement: None,
    }
}

/// Terms that take `gpu_count` GPUs of `offer` for `duration_s` seconds at the ask.
pub fn terms(
    offer_id: OfferId,
    offer: &Offer,
    renter: PublicKey,
    gpu_count: u16,
    duration_s: u32,
) -> LeaseTerms {
    LeaseTerms {
        volume: None,
        mounts: Vec::new(),
        verify_window_s: 0,
        network: NetworkId::devnet(),
        offer_id,
        offer_seq: offer.seq,
        provider: offer.provider,
        renter,
        gpu_count,
        per_gpu: offer.per_gpu,
        price_per_gpu_hour: offer.price_per_gpu_hour,
        duration_s,
        min_billed_s: offer.min_billed_s,
        usage_interval_s: offer.usage_interval_s,
        pay_ahead_s: offer.pay_ahead_s,
        grace_s: 30,
        max_total: 10_000_000,
        network_policy: NetworkPolicy::None,
        image: "gridlease-probe:0.1.0".into(),
        command: vec!["burn".into(), "--cpus".into(), "1".into()],
        env: BTreeMap::from([("MODE".to_string(), "test".to_string())]),
        nonce: 42,
        created_at: T0,
        output_retention_s: 0,
        upload_hold_s: 0,
        prepay_s: 0,
        settlement: None,
    }
}

/// The terms of a volume lease (issue 47) named `name`, `size_gib` at `price` per GiB-hour,
/// kept `keep_s` on `offer`: no GPUs, image or command.
pub fn volume_terms(
    offer_id: OfferId,
    offer: &Offer,
    renter: PublicKey,
    name: &str,
    size_gib: u32,
    price: u64,
    keep_s: u32,
) -> LeaseTerms {
    let mut t = terms(offer_id, offer, renter, 1, keep_s);
    t.gpu_count = 0;
    t.image = String::new();
    t.command.clear();
    t.env.clear();
    t.price_per_gpu_hour = 0;
    t.min_billed_s = 0;
    t.per_gpu = crate::ResourcesPerGpu::default();
    t.volume = Some(crate::VolumeTerms {
        name: name.into(),
        size_gib,
        price_per_gib_hour: price,
        adopts: None,
    });
    t
}

/// A usage report after `wall_ms` of running.
pub fn usage(lease_id: LeaseId, seq: u64, wall_ms: u64, gpus: u64) -> UsageReport {
    UsageReport {
        lease_id,
        seq,
        interval_start: T0.plus_ms(wall_ms.saturating_sub(10_000)),
        interval_end: T0.plus_ms(wall_ms),
        wall_ms,
        gpu_ms: wall_ms * gpus,
        cpu_ms: wall_ms / 2,
        energy_mj: wall_ms * 300,
        net_rx_bytes: 0,
        net_tx_bytes: 0,
        gpu_util_permille: 970,
        vram_peak_mib: 20_000,
        mem_peak_mib: 1024,
        amount_due: 0,
        exit_code: None,
    }
}

/// A cumulative receipt.
pub fn receipt(
    lease_id: LeaseId,
    seq: u64,
    total_paid: u64,
    covers_wall_ms: u64,
) -> PaymentReceipt {
    PaymentReceipt {
        lease_id,
        seq,
        total_paid,
        covers_wall_ms,
        usage_seq: seq,
        issued_at: T0.plus_ms(covers_wall_ms),
        voucher: None,
    }
}

/// A renter stop.
pub fn close(lease_id: LeaseId) -> LeaseClose {
    LeaseClose {
        lease_id,
        reason: CloseReason::RenterStop,
        at: T0,
        exit_code: None,
        failure: None,
    }
}
