//! The `gridlease` binary: parse, set up tracing, dispatch. Logic lives in the library.

use std::io::{IsTerminal, Write};
use std::process::ExitCode;

use clap::Parser;
use gridlease_node::api::client::{ApiClient, ClientError};
use gridlease_node::commands::{self, Cli, Command};
use gridlease_node::config::{Config, LogFormat};
use gridlease_node::output::Printer;
use tracing_subscriber::EnvFilter;

fn init_tracing(format: LogFormat, default: &str) {
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(default));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    match format {
        LogFormat::Json => builder.json().init(),
        LogFormat::Text => builder.with_ansi(std::io::stderr().is_terminal()).init(),
    }
}

fn runtime() -> anyhow::Result<tokio::runtime::Runtime> {
    Ok(tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?)
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let out = Printer {
        json: cli.json,
        quiet: cli.quiet,
    };
    let home = cli.home_dir();
    let api = ApiClient::new(&home);
    let result: anyhow::Result<u8> = match cli.command {
        Command::Init(args) => {
            init_tracing(LogFormat::Text, "warn");
            commands::init::run(&home, &args).map(|text| {
                out.line(&text);
                0
            })
        }
        Command::Node(args) => match match &args.config {
            Some(file) => Config::load_file(file, true, &args.settings),
            None => Config::load(&home, &args.settings),
        } {
            Err(e) => Err(e.into()),
            Ok(config) if args.dump_config => {
                let _ = write!(std::io::stdout(), "{}", config.to_toml());
                Ok(0)
            }
            Ok(config) => {
                init_tracing(config.log_format, "info");
                runtime()
                    .and_then(|rt| rt.block_on(commands::node::run(&home, config)))
                    .map(|()| 0)
            }
        },
        Command::Service(args) => commands::service::run(&out, &home, &args),
        Command::Completions(args) => commands::service::completions(&args),
        Command::Man(args) => commands::service::man(&out, &args),
        Command::Watchdog(args) => {
            // Its stderr is the lease's watchdog log: say what it did.
            init_tracing(LogFormat::Text, "info");
            runtime().and_then(|rt| rt.block_on(commands::watchdog::run(&args)))
        }
        command => {
            init_tracing(LogFormat::Text, "warn");
            runtime().and_then(|rt| {
                rt.block_on(async {
                    match command {
                        Command::Status(a) => commands::status::run(&api, &out, &a).await,
                        Command::Peers(a) => commands::peers::run(&api, &out, &a).await,
                        Command::Gpus(a) => commands::gpus::run(&api, &out, &a).await,
                        Command::Bench(a) => commands::bench::run(&out, &a).await,
                        Command::Search(a) => commands::search::run(&api, &out, &a).await,
                        Command::Offer(a) => commands::offer::run(&api, &out, &a).await,
                        Command::Provide(a) => commands::provide::run(&api, &out, &a).await,
                        Command::Rent(a) => commands::rent::run(&api, &out, &a).await,
                        Command::Leases(a) => commands::leases::run(&api, &out, &a).await,
                        Command::Logs(a) => commands::logs::run(&api, &out, &a).await,
                        Command::Top(a) => commands::top::run(&api, &out, &a).await,
                        Command::Stop(a) => commands::stop::run(&api, &out, &a).await,
                        Command::Extend(a) => commands::extend::run(&api, &out, &a).await,
                        Command::VerifyGpu(a) => commands::verify_gpu::run(&api, &out, &a).await,
                        Command::Ledger(a) => commands::ledger::run(&api, &out, &a).await,
                        Command::Wallet(a) => commands::wallet::run(&api, &out, &a).await,
                        Command::Settle(a) => commands::wallet::settle(&api, &out, &a).await,
                        Command::Job(a) => commands::job::run(&api, &out, &a).await,
                        Command::Doctor(a) => commands::doctor::run(&home, &api, &out, &a).await,
                        Command::Volume(a) => commands::volume::run(&api, &out, &a).await,
                        Command::Dashboard(a) => commands::dashboard::run(&home, &out, &a).await,
                        Command::Statement(a) => {
                            commands::statement::run_statement(&api, &out, &a).await
                        }
                        Command::Verify(a) => commands::statement::run_verify(&out, &a),
                        Command::Cp(a) => commands::cp::run(&api, &out, &a).await,
                        Command::Shell(a) => commands::access::run_shell(&api, &out, &a).await,
                        Command::Exec(a) => commands::access::run_exec(&api, &out, &a).await,
                        Command::Forward(a) => commands::access::run_forward(&api, &out, &a).await,
                        Command::Devnet(a) => commands::devnet::run(&out, &a).await,
                        Command::SshConfig(a) => {
                            commands::ssh::run_ssh_config(&api, &out, &a).await
                        }
                        Command::Ssh(a) => commands::ssh::run_ssh(&api, &out, &a).await,
                        Command::SshProxy(a) => commands::ssh::run_ssh_proxy(&api, &a).await,
                        Command::Init(_)
                        | Command::Node(_)
                        | Command::Watchdog(_)
                        | Command::Service(_)
                        | Command::Completions(_)
                        | Command::Man(_) => Ok(0),
                    }
                })
            })
        }
    };
    match result {
        Ok(code) => ExitCode::from(code),
        Err(e) => {
            let _ = writeln!(std::io::stderr(), "error: {e:#}");
            let code = if let Some(c) = e.downcast_ref::<ClientError>() {
                c.exit_code()
            } else if e.downcast_ref::<commands::bench::NoGpu>().is_some() {
                commands::bench::EXIT_NO_GPU
            } else {
                1
            };
            ExitCode::from(code)
        }
    }
}
