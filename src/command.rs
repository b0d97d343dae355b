//! The command line: its subcommands. The servers' flags (`serve`, `router`, `demo`,
//! `sim`) are declared in [`crate::config`], the client's (`get`, `describe`,
//! `count`, `watch`, `clusters`, `store`) in `fleetscope_cli::args`.

use std::path::PathBuf;

use clap::{Parser, Subcommand};

use crate::config::flags::{GlobalArgs, RouterArgs, ServeArgs};
use crate::config::sim_flags::{DemoArgs, SimArgs};
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
    /// Check a configuration file: print the resolved settings with each value's
    /// source (flag, environment, file or default), changing nothing.
    #[command(subcommand)]
    Config(ConfigCommand),
    /// Print the version.
    Version,
    /// Print a shell completion script: `source <(fleetscope completion bash)`.
    Completion {
        /// The shell.
        #[arg(value_enum)]
        shell: clap_complete::Shell,
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
