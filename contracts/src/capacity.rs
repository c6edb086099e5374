//! What an offer may promise per GPU, from what the provider's host has.
//!
//! Rule: the host's RAM, CPUs and free disk, minus a reserve for the OS, Docker and the node,
//! divided by the number of offered GPUs (rounded down). So every GPU leased at once, each
//! lease at its full limits, never adds up to more than the host minus the reserve.
//! Explicit per-GPU values from the provider may only lower the result, never raise it: to
//! offer more, the provider lowers the reserve.
//!
//! Pure: the host facts are parameters (the sandbox crate reads them).

use gridlease_protocol::ResourcesPerGpu;

/// Smallest RAM reserve, MiB (the default reserve is the larger of this and
/// [`DEFAULT_RAM_RESERVE_PERCENT`] of the host's RAM).
pub const DEFAULT_RAM_RESERVE_MIN_MIB: u64 = 2048;
/// Share of the host's RAM kept back by default, percent.
pub const DEFAULT_RAM_RESERVE_PERCENT: u64 = 10;
/// CPU kept back by default, millicores (one core for the OS, dockerd and the node).
pub const DEFAULT_CPU_RESERVE_MILLICORES: u64 = 1000;
/// Disk kept free by default, GiB. A flat amount: tenants' `/tmp` is a tmpfs (RAM), their
/// root filesystem is read-only and their logs are capped, so the disk an offer uses is
/// images and logs; 10 GiB keeps the provider's filesystem from filling up with them.
pub const DEFAULT_DISK_RESERVE_GIB: u64 = 10;
/// Least RAM per GPU worth offering, MiB.
pub const MIN_RAM_MIB_PER_GPU: u64 = 64;
/// Least CPU per GPU worth offering, millicores (Docker's smallest CPU quota is 0.01 CPU).
pub const MIN_CPU_MILLICORES_PER_GPU: u64 = 10;
/// Least disk per GPU worth offering, GiB: every lease gets a size-enforced `/workspace` of its
/// share, and a lease with none could not start.
pub const MIN_DISK_GIB_PER_GPU: u64 = 1;

/// What the host has, as the sandbox measured it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HostFacts {
    /// Total RAM, MiB.
    pub ram_mib: u64,
    /// CPUs usable by containers, millicores.
    pub cpu_millicores: u64,
    /// Space available now on the filesystem that holds container data, GiB.
    pub disk_free_gib: u64,
}

/// What the provider keeps for the OS, Docker and the node. `None` picks the default.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct HostReserve {
    /// RAM, MiB. Default: max([`DEFAULT_RAM_RESERVE_MIN_MIB`], [`DEFAULT_RAM_RESERVE_PERCENT`]
    /// of the total).
    pub ram_mib: Option<u64>,
    /// CPU, millicores. Default: [`DEFAULT_CPU_RESERVE_MILLICORES`].
    pub cpu_millicores: Option<u64>,
    /// Disk, GiB. Default: [`DEFAULT_DISK_RESERVE_GIB`].
    pub disk_gib: Option<u64>,
}

impl HostReserve {
    /// The RAM reserve for a host with `total_mib`.
    pub fn ram_for(&self, total_mib: u64) -> u64 {
        self.ram_mib.unwrap_or_else(|| {
            DEFAULT_RAM_RESERVE_MIN_MIB.max(total_mib / 100 * DEFAULT_RAM_RESERVE_PERCENT)
        })
    }

    /// The CPU reserve.
    pub fn cpu(&self) -> u64 {
        self.cpu_millicores
            .unwrap_or(DEFAULT_CPU_RESERVE_MILLICORES)
    }

    /// The disk reserve.
    pub fn disk(&self) -> u64 {
        self.disk_gib.unwrap_or(DEFAULT_DISK_RESERVE_GIB)
    }
}

/// Per-GPU values the provider asks for explicitly; each only lowers the derived value.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PerGpuLimit {
    /// RAM, MiB.
    pub ram_mib: Option<u32>,
    /// CPU, millicores.
    pub cpu_millicores: Option<u32>,
    /// Disk, GiB.
    pub disk_gib: Option<u32>,
}

/// The host cannot back an offer.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum CapacityError {
    /// Nothing to divide by.
    #[error("no GPUs to offer")]
    NoGpus,
    /// After the reserve, a GPU would get less than the least worth offering.
    #[error(
        "{resource}: {available} left after the reserve for {gpus} GPUs is below {minimum} per GPU; lower the reserve or offer fewer GPUs"
    )]
    TooLittle {
        /// `ram_mib`, `cpu_millicores` or `disk_gib`.
        resource: &'static str,
        /// What is left for all GPUs together.
        available: u64,
        /// GPUs offered.
        gpus: u64,
        /// The least per GPU.
        minimum: u64,
    },
}

fn clamp_u32(v: u64) -> u32 {
    u32::try_from(v).unwrap_or(u32::MAX)
}

/// The resources each of `gpus` offered GPUs comes with on `host`, keeping `reserve`, lowered
/// by `limit`. `net_mbps` is 0 (bandwidth is not enforced).
///
/// Guarantee: `gpus x result` is at most the host minus the reserve in RAM, CPU and disk.
/// RAM, CPU or disk below [`MIN_RAM_MIB_PER_GPU`] / [`MIN_CPU_MILLICORES_PER_GPU`] /
/// [`MIN_DISK_GIB_PER_GPU`] is an error: an offer whose leases could not start (a nearly full
/// disk leaves no `/workspace`) is not made.
pub fn per_gpu_resources(
    host: &HostFacts,
    reserve: &HostReserve,
    limit: &PerGpuLimit,
    gpus: usize,
) -> Result<ResourcesPerGpu, CapacityError> {
    let n = u64::try_from(gpus).unwrap_or(u64::MAX);
    if n == 0 {
        return Err(CapacityError::NoGpus);
    }
    let ram_left = host.ram_mib.saturating_sub(reserve.ram_for(host.ram_mib));
    let cpu_left = host.cpu_millicores.saturating_sub(reserve.cpu());
    let disk_left = host.disk_free_gib.saturating_sub(reserve.disk());
    let lowered = |derived: u64, asked: Option<u32>| match asked {
        Some(a) => clamp_u32(derived.min(u64::from(a))),
        None => clamp_u32(derived),
    };
    let per = ResourcesPerGpu {
        ram_mib: lowered(ram_left / n, limit.ram_mib),
        cpu_millicores: lowered(cpu_left / n, limit.cpu_millicores),
        disk_gib: lowered(disk_left / n, limit.disk_gib),
        net_mbps: 0,
    };
    for (resource, value, available, minimum) in [
        (
            "ram_mib",
            u64::from(per.ram_mib),
            ram_left,
            MIN_RAM_MIB_PER_GPU,
        ),
        (
            "cpu_millicores",
            u64::from(per.cpu_millicores),
            cpu_left,
            MIN_CPU_MILLICORES_PER_GPU,
        ),
        (
            "disk_gib",
            u64::from(per.disk_gib),
            disk_left,
            MIN_DISK_GIB_PER_GPU,
        ),
    ] {
        if value < minimum {
            return Err(CapacityError::TooLittle {
                resource,
                available,
                gpus: n,
                minimum,
            });
        }
    }
    Ok(per)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// The 24 GiB, 2-CPU machine issue 12 was reproduced on, with 100 GiB free.
    fn host() -> HostFacts {
        HostFacts {
            ram_mib: 24_105,
            cpu_millicores: 2000,
            disk_free_gib: 100,
        }
    }

    #[test]
    fn defaults_keep_max_2gib_or_10_percent_ram_one_core_and_10gib_disk() {
        let r = HostReserve::default();
        assert_eq!(r.ram_for(8 * 1024), 2048);
        assert_eq!(r.ram_for(64 * 1024), 64 * 1024 / 100 * 10);
        assert_eq!(r.cpu(), 1000);
        assert_eq!(r.disk(), 10);
    }

    #[test]
    fn a_two_gpu_offer_on_the_24_gib_host_fits_the_host_minus_the_reserve() {
        let per = per_gpu_resources(&host(), &HostReserve::default(), &PerGpuLimit::default(), 2)
            .unwrap();
        // 24105 - max(2048, 2410) = 21695 MiB for two GPUs.
        assert_eq!(per.ram_mib, 10_847);
        assert_eq!(per.cpu_millicores, 500);
        // 100 free - 10 = 90 GiB for two.
        assert_eq!(per.disk_gib, 45);
        assert_eq!(per.net_mbps, 0);
        // The old fixed 16 GiB per GPU promised 32 GiB on this 24 GiB host.
        assert!(2 * u64::from(per.ram_mib) <= host().ram_mib - 2410);
    }

    #[test]
    fn explicit_values_only_lower_and_the_reserve_is_the_knob_to_offer_more() {
        let limit = PerGpuLimit {
            ram_mib: Some(128),
            cpu_millicores: Some(1_000_000),
            disk_gib: None,
        };
        let per = per_gpu_resources(&host(), &HostReserve::default(), &limit, 1).unwrap();
        assert_eq!(per.ram_mib, 128);
        assert_eq!(
            per.cpu_millicores, 1000,
            "capped at the host minus the reserve"
        );
        let no_reserve = HostReserve {
            ram_mib: Some(0),
            cpu_millicores: Some(0),
            disk_gib: Some(0),
        };
        let per = per_gpu_resources(&host(), &no_reserve, &PerGpuLimit::default(), 1).unwrap();
        assert_eq!(
            (per.ram_mib, per.cpu_millicores, per.disk_gib),
            (24_105, 2000, 100)
        );
    }

    #[test]
    fn too_little_ram_cpu_or_disk_is_an_error() {
        let small = HostFacts {
            ram_mib: 2048,
            cpu_millicores: 1000,
            disk_free_gib: 5,
        };
        let err = per_gpu_resources(&small, &HostReserve::default(), &PerGpuLimit::default(), 1)
            .unwrap_err();
        assert!(
            matches!(
                err,
                CapacityError::TooLittle {
                    resource: "ram_mib",
                    ..
                }
            ),
            "{err}"
        );
        let reserve = HostReserve {
            ram_mib: Some(512),
            ..HostReserve::default()
        };
        let err = per_gpu_resources(&small, &reserve, &PerGpuLimit::default(), 1).unwrap_err();
        assert!(
            matches!(
                err,
                CapacityError::TooLittle {
                    resource: "cpu_millicores",
                    ..
                }
            ),
            "{err}"
        );
        let reserve = HostReserve {
            ram_mib: Some(512),
            cpu_millicores: Some(500),
            disk_gib: None,
        };
        let err = per_gpu_resources(&small, &reserve, &PerGpuLimit::default(), 1).unwrap_err();
        assert_eq!(
            err,
            CapacityError::TooLittle {
                resource: "disk_gib",
                available: 0,
                gpus: 1,
                minimum: 1,
            },
            "5 GiB free less the 10 GiB reserve leaves no /workspace: {err}"
        );
        let reserve = HostReserve {
            disk_gib: Some(4),
            ..reserve
        };
        let per = per_gpu_resources(&small, &reserve, &PerGpuLimit::default(), 1).unwrap();
        assert_eq!(per.disk_gib, 1);
        let two = per_gpu_resources(&small, &reserve, &PerGpuLimit::default(), 2).unwrap_err();
        assert!(
            matches!(
                two,
                CapacityError::TooLittle {
                    resource: "disk_gib",
                    ..
                }
            ),
            "1 GiB left for two GPUs: {two}"
        );
        assert_eq!(
            per_gpu_resources(&host(), &reserve, &PerGpuLimit::default(), 0),
            Err(CapacityError::NoGpus)
        );
    }

    proptest! {
        #[test]
        fn all_gpus_at_once_never_exceed_the_host_minus_the_reserve(
            ram in 0u64..4_000_000,
            cpu in 0u64..512_000,
            disk_free in 0u64..100_000,
            r_ram in proptest::option::of(0u64..200_000),
            r_cpu in proptest::option::of(0u64..8_000),
            r_disk in proptest::option::of(0u64..1_000),
            l_ram in proptest::option::of(0u32..1_000_000),
            gpus in 1usize..=16,
        ) {
            let host = HostFacts { ram_mib: ram, cpu_millicores: cpu, disk_free_gib: disk_free };
            let reserve = HostReserve { ram_mib: r_ram, cpu_millicores: r_cpu, disk_gib: r_disk };
            let limit = PerGpuLimit { ram_mib: l_ram, ..PerGpuLimit::default() };
            if let Ok(per) = per_gpu_resources(&host, &reserve, &limit, gpus) {
                let n = gpus as u64;
                prop_assert!(n * u64::from(per.ram_mib) <= ram.saturating_sub(reserve.ram_for(ram)));
                prop_assert!(n * u64::from(per.cpu_millicores) <= cpu.saturating_sub(reserve.cpu()));
                prop_assert!(n * u64::from(per.disk_gib) <= disk_free.saturating_sub(reserve.disk()));
                prop_assert!(u64::from(per.ram_mib) >= MIN_RAM_MIB_PER_GPU);
                prop_assert!(u64::from(per.cpu_millicores) >= MIN_CPU_MILLICORES_PER_GPU);
                prop_assert!(u64::from(per.disk_gib) >= MIN_DISK_GIB_PER_GPU);
                if let Some(l) = l_ram {
                    prop_assert!(per.ram_mib <= l);
                }
            }
        }
    }
}
