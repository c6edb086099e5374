//! The command line: one file per subcommand. `main.rs` parses and dispatches.
//!
//! Exit codes: 0 success; 1 failure; 2 usage error or no GPU/CUDA for `bench`; 3 no node is
//! running for this home; 4 a lease (or an extension, `extend`) was refused (the reason is
//! printed); 5 the provider accepted a lease but could not start it (the reason is printed,
//! [`rent::EXIT_START_FAILED`]); `rent` without `--detach` exits with the container's exit
//! code, or 130 when Ctrl-C interrupted it ([`rent::EXIT_INTERRUPTED`]).

pub mod access;
pub mod bench;
pub mod cp;
pub mod dashboard;
pub mod devnet;
pub mod doctor;
pub mod extend;
pub mod gpus;
pub mod init;
pub mod job;
pub mod leases;
pub mod ledger;
pub mod logs;
pub mod node;
pub mod offer;
pub mod peers;
pub mod provide;
pub mod rent;
pub mod search;
pub mod service;
pub mod ssh;
pub mod statement;
pub mod status;
pub mod stop;
pub mod top;
pub mod verify_gpu;
pub mod volume;
pub mod wallet;
pub mod watchdog;

use std::path::PathBuf;

use clap::{Parser, Subcommand};

use crate::env_vars;

/// gridlease: a peer-to-peer GPU rental market.
#[derive(Debug, Parser)]
#[command(
    name = "gridlease",
    version,
    about = "A peer-to-peer GPU market: offer your GPUs, rent others', run containers on them"
)]
pub struct Cli {
    /// Node home directory (identity, database, API socket). Defaults to ~/.gridlease.
    #[arg(long, global = true, env = env_vars::GRIDLEASE_HOME, value_name = "DIR")]
    pub home: Option<PathBuf>,

    /// Print machine-readable JSON instead of tables.
    #[arg(long, global = true)]
    pub json: bool,

    /// Print nothing but errors.
    #[arg(long, short, global = true)]
    pub quiet: bool,

    /// What to do.
    #[command(subcommand)]
    pub command: Command,
}

impl Cli {
    /// The home directory to use.
    pub fn home_dir(&self) -> PathBuf {
        self.home.clone().unwrap_or_else(crate::home::default_home)
    }
}

/// Subcommands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Create a node identity and database; refuses to overwrite an existing identity.
    Init(init::InitArgs),
    /// Run the node daemon in the foreground (Ctrl-C or SIGTERM to stop).
    Node(Box<node::NodeArgs>),
    /// Identity, addresses, reachability, peers and offers known.
    Status(status::StatusArgs),
    /// Connected peers and their gossip scores.
    Peers(peers::PeersArgs),
    /// GPUs this node found (NVML) or declares (--dev-gpus).
    Gpus(gpus::GpusArgs),
    /// Benchmark a local GPU (GEMM fp32/fp16, memory and PCIe bandwidth).
    Bench(bench::BenchArgs),
    /// Search the offer book, e.g. `gridlease search 'gpu~4090 price<=0.5' --sort price`.
    #[command(after_help = format!("Fields:\n{}", gridlease_contracts::query::Field::help_table()))]
    Search(search::SearchArgs),
    /// One offer whole: GPUs and benchmarks, price and billing, resources, network, access.
    Offer(offer::OfferArgs),
    /// Offer this node's GPUs at a price, or stop offering (--off).
    Provide(provide::ProvideArgs),
    /// Rent an offer and run a container on it: `rent OFFER --minutes 30 --image IMG -- CMD`.
    ///
    /// Without --detach it follows the output and prints the bill. Ctrl-C stops the lease and
    /// waits for the bill; a second Ctrl-C detaches (exit code 130 either way).
    Rent(rent::RentArgs),
    /// This node's leases with live usage, cost and time left.
    Leases(leases::LeasesArgs),
    /// Jobs: one spec file fans a batch of tasks over many providers, retries elsewhere when
    /// a provider fails, carries checkpoints, and never spends past its budget.
    ///
    /// `job run SPEC` (docs/jobs.md), `job status`, `job logs JOB TASK -f`, `job cancel`,
    /// `job list`.
    Job(job::JobArgs),
    /// Volumes: storage kept on a provider beyond any lease, paid per GiB-hour.
    ///
    /// `volume create NAME --offer OFFER --size 50GiB --keep 7d`, `volume ls`, `volume cp`,
    /// `volume extend`, `volume rm`; mount one with `rent --volume NAME:/data`
    /// (docs/volumes.md).
    Volume(volume::VolumeArgs),
    /// A lease's container output (-f to follow).
    Logs(logs::LogsArgs),
    /// End a lease now.
    Stop(stop::StopArgs),
    /// Make a running lease longer: `extend LEASE --minutes 30` (the provider must accept).
    ///
    /// Prints the new deadline and budget cap; a refusal exits 4 with the reason.
    Extend(extend::ExtendArgs),
    /// Check a running lease's GPUs again (the check `rent` runs at the start; billed as usage).
    ///
    /// Exits 0 when it passed, 7 when it failed (the part and by how much are printed; the
    /// lease runs on).
    VerifyGpu(verify_gpu::VerifyGpuArgs),
    /// A running lease's GPUs and container, live (utilisation, VRAM, power, temperature,
    /// CPU, memory, cost, time left); `q` to quit.
    ///
    /// `--json` streams one sample per line; `--once` prints the view once.
    Top(top::TopArgs),
    /// An interactive shell in a running lease's container (a terminal over the P2P link).
    ///
    /// Keys (Ctrl-C, Ctrl-D too) go to the remote terminal; exits with the shell's exit code.
    Shell(access::ShellArgs),
    /// Run a command in a running lease's container: `exec LEASE -- CMD ARGS`.
    ///
    /// stdin, stdout and stderr are piped (works in scripts); exits with the command's code.
    Exec(access::ExecArgs),
    /// Forward local TCP ports to ports in a running lease's container: `forward LEASE 8888`.
    ///
    /// Listens on 127.0.0.1 (--bind to change) until Ctrl-C or the lease ends.
    Forward(access::ForwardArgs),
    /// Write `Host gl-<lease>` entries so OpenSSH tools reach running leases: `ssh gl-<lease>`,
    /// scp, sftp, `rsync -e ssh`, `ssh -L`, VS Code Remote-SSH.
    ///
    /// Entries go to <home>/ssh/config (with known hosts: no prompt), included from
    /// ~/.ssh/config by one added line; no sshd in the image, no key upload, no open port.
    SshConfig(ssh::SshConfigArgs),
    /// Run the system `ssh` on a running lease: `ssh LEASE` (a shell) or `ssh LEASE -- CMD`.
    Ssh(ssh::SshArgs),
    /// The SSH server OpenSSH runs as a lease's ProxyCommand (written by `ssh-config`), on
    /// stdin and stdout.
    SshProxy(ssh::SshProxyArgs),
    /// Copy files and directories into or out of a running lease's /workspace.
    ///
    /// `cp ./data LEASE:/workspace/data` or `cp LEASE:/workspace/out ./out`: streamed,
    /// checksummed, resumable (run it again after an interruption), with a progress bar.
    Cp(cp::CpArgs),
    /// A local web page for this node: GPUs, offer, leases, earnings, settings.
    ///
    /// Listens on 127.0.0.1 only and prints the URL with the access token
    /// (`<home>/dashboard.token`); Ctrl-C to stop.
    Dashboard(dashboard::DashboardArgs),
    /// Earnings and spend, per lease and in total.
    Ledger(ledger::LedgerArgs),
    /// The settlement wallet: its address, the chain it settles on, and the last on-chain
    /// voucher of each lease (what the channel contract's redeem takes).
    Wallet(wallet::WalletArgs),
    /// Redeem now: a settlement pass (queue settled leases, redeem their vouchers, watch for
    /// closes), then the wallet. Needs `chain_rpc`.
    ///
    /// `settle LEASE` shows that lease only, and exits 1 when its voucher is not redeemed.
    Settle(wallet::SettleArgs),
    /// Write a lease's statement: every signed message that says what is owed, in one file.
    ///
    /// `statement LEASE --out FILE`; anyone checks it with `gridlease verify FILE`.
    Statement(statement::StatementArgs),
    /// Check a statement file (signatures and arithmetic) and print what is owed.
    ///
    /// Needs no node and no network; an invalid statement exits 1 naming what is wrong.
    Verify(statement::VerifyArgs),
    /// A whole local market in one command: bootstrap, providers, renter, one real lease.
    Devnet(devnet::DevnetArgs),
    /// Check this machine for providing: Docker, disk quotas, cgroups, the NVIDIA driver and
    /// container toolkit, gVisor, free disk, the clock, ports, reachability, the home.
    ///
    /// Prints ok / warn / fail per item with one line on how to fix it; exits 0 when all is
    /// ok, 1 with warnings, 2 with failures.
    Doctor(doctor::DoctorArgs),
    /// Run the node as a systemd service: `service install` (a user unit; --system for a
    /// system one), `service uninstall`, `service status`.
    Service(service::ServiceArgs),
    /// Print shell completions: `gridlease completions bash > /etc/bash_completion.d/gridlease`.
    Completions(service::CompletionsArgs),
    /// Print the man page (`gridlease man | man -l -`), or write all of them with --out DIR.
    Man(service::ManArgs),
    /// Stop one tenant container at its deadline (spawned by the node per container, not for
    /// users).
    #[command(name = "__watchdog", hide = true)]
    Watchdog(watchdog::WatchdogArgs),
}

/// Parses an amount argument (`--max-total`): GLU with at most 6 decimals. A negative one is
/// named as such (clap would otherwise take `-1` for an unknown flag).
pub fn parse_amount(s: &str) -> Result<gridlease_contracts::Money, String> {
    if s.starts_with('-') {
        return Err("an amount cannot be negative (GLU, 0 or more, e.g. 2.50)".into());
    }
    s.parse()
        .map_err(|e: gridlease_contracts::MoneyError| e.to_string())
}
