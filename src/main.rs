//! The `fleetscope` command: parses the command line and dispatches.

use clap::Parser;
use fleetscope::cli;
use fleetscope::command as args;
use fleetscope::config;
use fleetscope::server::run;
use fleetscope::telemetry;

/// Exit status when the data directory is held by another running fleetscope.
const EXIT_DATA_DIR_LOCKED: u8 = 3;

fn main() -> std::process::ExitCode {
    let pages = fleetscope::memory::small_pages();
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
    let mut parsed = args::Cli::parse();
    // With a configuration file, the command line is parsed again with the file's
    // values as the flags' defaults (flag > environment > file > default).
    let mut config = None;
    let file = match &parsed.command {
        args::Command::Serve(serve) => serve.file.config.clone().map(|path| ("serve", path)),
        args::Command::Router(router) => router.file.config.clone().map(|path| ("router", path)),
        _ => None,
    };
    if let Some((subcommand, path)) = file {
        let argv = config::resolve::process_argv();
        let command = <args::Cli as clap::CommandFactory>::command();
        let resolved = config::resolve::resolve(command.clone(), subcommand, &argv, &path)?;
        parsed = <args::Cli as clap::FromArgMatches>::from_arg_matches(&resolved.matches)?;
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
        args::Command::Serve(args) => Ok(run::serve(args, config).await?),
        args::Command::Router(args) => Ok(run::router(*args, config).await?),
        args::Command::Config(args::ConfigCommand::Settings {
            output,
            command: of,
        }) => {
            let mut command = <args::Cli as clap::CommandFactory>::command();
            command.build();
            run::config_settings(&command, &of, &output);
            Ok(())
        }
        args::Command::Config(args::ConfigCommand::Check { file, command: of }) => Ok(
            run::config_check(&file, &of, <args::Cli as clap::CommandFactory>::command())?,
        ),
        args::Command::Demo(args) => Ok(run::demo(args).await?),
        args::Command::Sim(args) => Ok(run::sim(args).await?),
        args::Command::Get(args) => {
            let mut c = cli::connect(&args.query.server).await?;
            Ok(cli::get(&mut c, args).await?)
        }
        args::Command::Describe(args) => {
            let mut c = cli::connect(&args.query.server).await?;
            Ok(cli::describe(&mut c, args).await?)
        }
        args::Command::Count(args) => {
            let mut c = cli::connect(&args.query.server).await?;
            Ok(cli::count(&mut c, args).await?)
        }
        args::Command::Watch(args) => {
            let mut c = cli::connect(&args.query.server).await?;
            Ok(cli::watch(&mut c, args).await?)
        }
        args::Command::Clusters(args) => {
            let mut c = cli::connect(&args.server).await?;
            Ok(cli::clusters(&mut c, args).await?)
        }
        args::Command::Store(args) => {
            let mut c = cli::connect(&args.server).await?;
            Ok(cli::store(&mut c, args).await?)
        }
        args::Command::Version => {
            println!("fleetscope {}", env!("CARGO_PKG_VERSION"));
            Ok(())
        }
        args::Command::Completion { shell } => {
            let mut command = <args::Cli as clap::CommandFactory>::command();
            clap_complete::generate(shell, &mut command, "fleetscope", &mut std::io::stdout());
            Ok(())
        }
    }
}
