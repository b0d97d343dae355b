//! The command line: its subcommands, and [`main`], which parses them and dispatches.
//! The servers' flags (`serve`, `router`, `demo`, `sim`) are declared in
//! [`crate::config`], the client's (`get`, `describe`, `count`, `watch`, `clusters`,
//! `store`) in `fleetscope_cli::args`.

use std::path::PathBuf;

use clap::{Parser, Subcommand};
use fleetscope_cli as cli;

use crate::config;
use crate::config::flags::{GlobalArgs, RouterArgs, ServeArgs};
use crate::config::sim_flags::{DemoArgs, SimArgs};
use crate::server::run;
use crate::telemetry;
use fleetscope_cli::args::{ClustersArgs, CountArgs, DescribeArgs, GetArgs, StoreArgs, WatchArgs};

/// One gRPC view over many Kubernetes clusters.
#[derive(Debug, Parser)]
#[command(name = "fleetscope", version, about)]
pub struct Cli {
    #[command(flatten)]
    pub global: GlobalArgs,
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Serve the Fleet API over the contexts of one or more kubeconfigs.
    Serve(ServeArgs),
    /// Serve the whole fleet of a ring of replicas (`serve --shard-ring`), found by
    /// their Leases.
    Router(Box<RouterArgs>),
    /// Run simulated clusters with a workload and the server over them: no Kubernetes needed.
    Demo(DemoArgs),
    /// Run simulated Kubernetes clusters on loopback and write a kubeconfig for them.
    Sim(SimArgs),
    /// List objects across the fleet, or get one by name.
    Get(GetArgs),
    /// Show objects in detail, with their cluster and the events about them.
    Describe(DescribeArgs),
    /// Count objects across the fleet, grouped.
    Count(CountArgs),
    /// Stream changes across the fleet.
    Watch(WatchArgs),
    /// Show the health of every cluster (and with -o wide, every stream).
    Clusters(ClustersArgs),
    /// Show the persisted store: size on disk, writes and their latency, errors.
    Store(StoreArgs),
    /// Print a kubeconfig for the server's Kubernetes API: a `fleet` context (the
    /// whole fleet) and one per cluster, with this client's credentials.
    Kubeconfig(fleetscope_cli::args::KubeconfigArgs),
    /// Check a configuration file: print the resolved settings with each value's
    /// source (flag, environment, file or default), changing nothing.
    #[command(subcommand)]
    Config(ConfigCommand),
    /// Print the client's version and the server's (as kubectl version does).
    Version(fleetscope_cli::args::VersionArgs),
    /// Print a shell completion script: `source <(fleetscope completion bash)` (bash
    /// completes resource types and cluster names from the server).
    Completion {
        /// The shell.
        #[arg(value_enum)]
        shell: clap_complete::Shell,
    },
    /// The words that complete a resource type or a cluster name, from the server
    /// (what the bash completion script asks).
    #[command(name = "__complete", hide = true)]
    Complete {
        /// What to complete.
        #[arg(value_enum)]
        what: cli::complete::Completing,
        #[command(flatten)]
        server: cli::args::ServerArg,
    },
}

#[derive(Debug, Subcommand)]
pub enum ConfigCommand {
    /// Validate FILE as `serve --config FILE` (or `router --config FILE`) would read
    /// it (with this environment) and print every setting, its value and where the
    /// value comes from.
    Check {
        /// The configuration file.
        file: PathBuf,
        /// The command the file configures.
        #[arg(long = "for", default_value = "serve", value_parser = ["serve", "router"])]
        command: String,
    },
    /// Print every setting of `serve` (or `router`): its key in the configuration
    /// file, its flag, its environment variable, its default and whether a change
    /// applies live or at the next restart.
    Settings {
        /// Output format: table or markdown (with each setting's description).
        #[arg(short = 'o', long, default_value = "table", value_parser = ["table", "markdown"])]
        output: String,
        /// The command whose settings to print.
        #[arg(long = "for", default_value = "serve", value_parser = ["serve", "router"])]
        command: String,
    },
}

/// `fleetscope completion SHELL`: clap's script, and for bash completion from the
/// server ([`cli::complete`]).
fn completion(shell: clap_complete::Shell) {
    let mut command = <Cli as clap::CommandFactory>::command();
    clap_complete::generate(shell, &mut command, "fleetscope", &mut std::io::stdout());
    if shell == clap_complete::Shell::Bash {
        print!("{}", cli::complete::BASH);
    }
}

/// Exit status when the data directory is held by another running fleetscope.
const EXIT_DATA_DIR_LOCKED: u8 = 3;

/// The `fleetscope` command: parses the command line and runs what it asks for. The
/// binary only calls this: whatever the command runs is compiled once, in this
/// crate, rather than instantiated again in the binary's.
pub fn main() -> std::process::ExitCode {
    let pages = crate::memory::small_pages();
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(e) => {
            eprintln!("fleetscope: starting the async runtime: {e}");
            return std::process::ExitCode::FAILURE;
        }
    };
    runtime.block_on(dispatch(pages))
}

async fn dispatch(pages: std::io::Result<()>) -> std::process::ExitCode {
    match run_cli(pages).await {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            // One line with every cause, the way people read errors at a terminal.
            eprintln!("fleetscope: {}", one_line(&e));
            let locked = e.chain().any(|c| {
                matches!(
                    c.downcast_ref::<fleetscope_store::StoreError>(),
                    Some(fleetscope_store::StoreError::Locked(_))
                )
            });
            if locked {
                std::process::ExitCode::from(EXIT_DATA_DIR_LOCKED)
            } else {
                std::process::ExitCode::FAILURE
            }
        }
    }
}

/// Every cause of `e` on one line, each once: a library's message that already
/// repeats the cause it chains is not followed by that cause again.
fn one_line(e: &anyhow::Error) -> String {
    let mut line = String::new();
    for cause in e.chain() {
        let text = cause.to_string();
        if line.ends_with(&text) {
            continue;
        }
        if !line.is_empty() {
            line.push_str(": ");
        }
        line.push_str(&text);
    }
    line
}

async fn run_cli(pages: std::io::Result<()>) -> anyhow::Result<()> {
    let mut parsed = Cli::parse();
    // With a configuration file, the command line is parsed again with the file's
    // values as the flags' defaults (flag > environment > file > default).
    let mut config = None;
    let file = match &parsed.command {
        Command::Serve(serve) => serve.file.config.clone().map(|path| ("serve", path)),
        Command::Router(router) => router.file.config.clone().map(|path| ("router", path)),
        _ => None,
    };
    if let Some((subcommand, path)) = file {
        let argv = config::resolve::process_argv();
        let command = <Cli as clap::CommandFactory>::command();
        let resolved = config::resolve::resolve(command.clone(), subcommand, &argv, &path)?;
        parsed = <Cli as clap::FromArgMatches>::from_arg_matches(&resolved.matches)?;
        config = Some(config::reload::ConfigFile {
            path,
            subcommand,
            argv,
            command,
            last: resolved.rows,
        });
    }
    let _telemetry = telemetry::init(parsed.global.log_format);
    if let Err(e) = pages {
        tracing::debug!(error = %e, "transparent huge pages stay as the kernel has them");
    }
    match parsed.command {
        Command::Serve(args) => Ok(run::serve(args, config).await?),
        Command::Router(args) => Ok(run::router(*args, config).await?),
        Command::Config(ConfigCommand::Settings {
            output,
            command: of,
        }) => {
            let mut command = <Cli as clap::CommandFactory>::command();
            command.build();
            run::config_settings(&command, &of, &output);
            Ok(())
        }
        Command::Config(ConfigCommand::Check { file, command: of }) => Ok(run::config_check(
            &file,
            &of,
            <Cli as clap::CommandFactory>::command(),
        )?),
        Command::Demo(args) => Ok(run::demo(args).await?),
        Command::Sim(args) => Ok(run::sim(args).await?),
        Command::Get(args) => {
            let mut c = cli::connect(&args.query.server).await?;
            Ok(cli::get(&mut c, args).await?)
        }
        Command::Describe(args) => {
            let mut c = cli::connect(&args.query.server).await?;
            Ok(cli::describe(&mut c, args).await?)
        }
        Command::Count(args) => {
            let mut c = cli::connect(&args.query.server).await?;
            Ok(cli::count(&mut c, args).await?)
        }
        Command::Watch(args) => {
            let mut c = cli::connect(&args.query.server).await?;
            Ok(cli::watch(&mut c, args).await?)
        }
        Command::Clusters(args) => {
            let mut c = cli::connect(&args.server).await?;
            Ok(cli::clusters(&mut c, args).await?)
        }
        Command::Store(args) => {
            let mut c = cli::connect(&args.server).await?;
            Ok(cli::store(&mut c, args).await?)
        }
        Command::Kubeconfig(args) => {
            let mut c = cli::connect(&args.server).await?;
            Ok(cli::kubeconfig(&mut c, args).await?)
        }
        Command::Version(args) => {
            println!("Client Version: {}", crate::version());
            if args.client {
                return Ok(());
            }
            let mut c = cli::connect(&args.server).await?;
            println!("Server Version: {}", cli::server_version(&mut c).await?);
            Ok(())
        }
        Command::Completion { shell } => {
            completion(shell);
            Ok(())
        }
        Command::Complete { what, server } => {
            // Completion says nothing rather than an error at a prompt.
            let words = cli::complete::words(&server, what).await;
            words
                .unwrap_or_default()
                .iter()
                .for_each(|w| println!("{w}"));
            Ok(())
        }
    }
}
