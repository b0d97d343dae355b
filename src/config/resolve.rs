//! Flags, environment and the configuration file resolved into one command line: the
//! file's values become the flags' defaults, so clap's own precedence (a flag, then
//! its environment variable, then the default) puts the file between the environment
//! and the built-in default, and each value goes through its flag's parser.

use std::ffi::OsString;
use std::path::Path;

use clap::FromArgMatches;
use clap::parser::ValueSource;

use super::file::{self, FileError, Given};
use super::flags::{RouterArgs, ServeArgs, settings_of};
use super::settings::Applies;

/// Why a command line and configuration file cannot be resolved.
#[derive(Debug, thiserror::Error)]
pub enum ResolveError {
    /// The file is unusable.
    #[error(transparent)]
    File(#[from] FileError),
    /// The command line (with the file's values) does not parse.
    #[error("{0}")]
    Args(String),
}

/// One setting of a command (`serve`, `router`): its flag, its key in the file, its value and its source.
#[derive(Debug, Clone, PartialEq)]
pub struct Row {
    /// The key in the configuration file (`-` when the file has none for it).
    pub key: &'static str,
    /// The flag.
    pub flag: String,
    /// The value, as the flag takes it (several joined with `,`).
    pub value: String,
    /// `flag`, `env NAME`, `file` or `default`.
    pub source: String,
    /// When a new value applies; `None` for a flag the file does not set.
    pub applies: Option<Applies>,
}

/// A resolved command line.
#[derive(Debug)]
pub struct Resolved {
    /// The command line's matches, with the file's values in place.
    pub matches: clap::ArgMatches,
    /// Every setting of the command, for `config check` and for telling what a
    /// reload changed.
    pub rows: Vec<Row>,
}

impl Resolved {
    /// The value of a flag (`--page-size`).
    pub fn value(&self, flag: &str) -> Option<&str> {
        value(&self.rows, flag)
    }

    /// The `serve` flags, when the command is `serve`.
    pub fn serve(&self) -> Result<Option<ServeArgs>, ResolveError> {
        self.args("serve")
    }

    /// The `router` flags, when the command is `router`.
    pub fn router(&self) -> Result<Option<RouterArgs>, ResolveError> {
        self.args("router")
    }

    fn args<T: FromArgMatches>(&self, subcommand: &str) -> Result<Option<T>, ResolveError> {
        self.matches
            .subcommand_matches(subcommand)
            .map(T::from_arg_matches)
            .transpose()
            .map_err(|e| ResolveError::Args(first_line(&e)))
    }
}

/// The value of a flag (`--page-size`) among `rows`.
pub fn value<'a>(rows: &'a [Row], flag: &str) -> Option<&'a str> {
    rows.iter()
        .find(|r| r.flag == flag)
        .map(|r| r.value.as_str())
}

/// Resolves `argv` (a command line of `command`, the whole command line's
/// definition, running its `subcommand`: `serve` or `router`) with the configuration
/// file at `path`, which may set that subcommand's settings.
pub fn resolve(
    command: clap::Command,
    subcommand: &str,
    argv: &[OsString],
    path: &Path,
) -> Result<Resolved, ResolveError> {
    let settings = settings_of(subcommand);
    let given = file::read_for(path, &settings)?;
    let mut cmd = with_defaults(command, subcommand, &given);
    let matches = cmd
        .try_get_matches_from_mut(argv)
        .map_err(|e| attribute(e, &cmd, subcommand, &given, path))?;
    let mut rows = Vec::new();
    if let (Some(serve), Some(sub)) = (
        matches.subcommand_matches(subcommand),
        cmd.find_subcommand(subcommand),
    ) {
        for arg in sub.get_arguments() {
            let id = arg.get_id().as_str();
            let Some(long) = arg.get_long() else { continue };
            if arg.is_hide_set() || matches!(id, "help" | "config") {
                continue;
            }
            let value = serve
                .get_raw(id)
                .map(|v| {
                    v.map(|s| s.to_string_lossy().into_owned())
                        .collect::<Vec<_>>()
                        .join(",")
                })
                .unwrap_or_default();
            let source = match serve.value_source(id) {
                Some(ValueSource::CommandLine) => "flag".to_string(),
                Some(ValueSource::EnvVariable) => format!(
                    "env {}",
                    arg.get_env()
                        .map(|e| e.to_string_lossy())
                        .unwrap_or_default()
                ),
                Some(ValueSource::DefaultValue) if given.iter().any(|g| g.arg == id) => {
                    "file".to_string()
                }
                _ => "default".to_string(),
            };
            let setting = settings.iter().find(|s| s.id == id);
            rows.push(Row {
                key: setting.map_or("-", |s| s.key),
                flag: format!("--{long}"),
                value,
                source,
                applies: setting.map(|s| s.applies),
            });
        }
    }
    Ok(Resolved { matches, rows })
}

/// The command with the file's values as its `subcommand`'s flags' defaults.
fn with_defaults(mut cmd: clap::Command, subcommand: &str, given: &[Given]) -> clap::Command {
    for g in given {
        let values = g.values.clone();
        if cmd.get_arguments().any(|a| a.get_id() == g.arg) {
            cmd = cmd.mut_arg(g.arg, |a| a.default_values(values));
        } else {
            cmd = cmd.mut_subcommand(subcommand, |sc| {
                sc.mut_arg(g.arg, |a| a.default_values(values))
            });
        }
    }
    cmd
}

/// A parse error, named by the file's key when the bad value is the file's.
fn attribute(
    e: clap::Error,
    cmd: &clap::Command,
    subcommand: &str,
    given: &[Given],
    path: &Path,
) -> ResolveError {
    use clap::error::{ContextKind, ContextValue};
    let text = |kind| match e.get(kind) {
        Some(ContextValue::String(s)) => Some(s.clone()),
        _ => None,
    };
    if let (Some(flag), Some(value)) = (
        text(ContextKind::InvalidArg),
        text(ContextKind::InvalidValue),
    ) {
        let serve = cmd.find_subcommand(subcommand);
        let args = cmd
            .get_arguments()
            .chain(serve.into_iter().flat_map(|s| s.get_arguments()));
        for arg in args {
            let Some(long) = arg.get_long() else { continue };
            let named = flag == format!("--{long}") || flag.starts_with(&format!("--{long} "));
            let from_file = given
                .iter()
                .find(|g| g.arg == arg.get_id() && g.values.contains(&value));
            if let (true, Some(g)) = (named, from_file) {
                return FileError::Value {
                    path: path.to_path_buf(),
                    key: g.key.to_string(),
                    message: first_line(&e),
                }
                .into();
            }
        }
    }
    ResolveError::Args(first_line(&e))
}

/// A clap error's message, without its `error: ` prefix, usage and help lines.
fn first_line(e: &clap::Error) -> String {
    let rendered = e.to_string();
    let line = rendered.lines().next().unwrap_or_default();
    line.strip_prefix("error: ").unwrap_or(line).to_string()
}

/// The command line of a process, from `std::env::args_os`, for resolving the
/// configuration file again when it changes.
pub fn process_argv() -> Vec<OsString> {
    std::env::args_os().collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn argv(extra: &[&str], file: &Path) -> Vec<OsString> {
        let mut v: Vec<OsString> = vec!["fleetscope".into(), "serve".into(), "--config".into()];
        v.push(file.into());
        v.extend(extra.iter().map(OsString::from));
        v
    }

    /// `fleetscope serve`'s definition alone.
    fn command() -> clap::Command {
        use clap::Args as _;
        let top = super::super::flags::GlobalArgs::augment_args(clap::Command::new("fleetscope"));
        top.subcommand(ServeArgs::augment_args(clap::Command::new("serve")))
    }

    fn resolve(argv: &[OsString], path: &Path) -> Result<Resolved, ResolveError> {
        super::resolve(command(), "serve", argv, path)
    }

    fn write(text: &str) -> tempfile::NamedTempFile {
        let f = tempfile::NamedTempFile::new().unwrap();
        std::fs::write(f.path(), text).unwrap();
        f
    }

    #[test]
    fn a_flag_beats_the_file_which_beats_the_default() {
        let f = write(
            "listen: 127.0.0.1:6000\ninformer:\n  pageSize: 50\nresources:\n  pods:\n    namespace: a\nlogFormat: json\n",
        );
        let r = resolve(&argv(&["--page-size", "70"], f.path()), f.path()).unwrap();
        let row = |flag: &str| r.rows.iter().find(|r| r.flag == flag).unwrap().clone();
        assert_eq!(row("--page-size").value, "70");
        assert_eq!(row("--page-size").source, "flag");
        assert_eq!(row("--page-size").key, "informer.pageSize");
        assert_eq!(row("--listen").value, "127.0.0.1:6000");
        assert_eq!(row("--listen").source, "file");
        assert_eq!(row("--event-log").source, "default");
        assert_eq!(row("--scope").value, "pods:namespace=a");
        assert_eq!(
            r.matches
                .get_one::<crate::config::flags::LogFormat>("log_format"),
            Some(&crate::config::flags::LogFormat::Json)
        );
        assert_eq!(row("--page-size").applies, Some(Applies::Collection));
        assert_eq!(row("--listen").applies, Some(Applies::Restart));
        let args = r.serve().unwrap().unwrap();
        assert_eq!(args.engine.page_size, 70);
        assert_eq!(args.engine.resources, ["pods"]);
    }

    #[test]
    fn a_bad_file_value_is_named_by_its_key() {
        let f = write("retention:\n  eventsMib: 0\n");
        let e = resolve(&argv(&[], f.path()), f.path())
            .unwrap_err()
            .to_string();
        assert!(e.contains("retention.eventsMib"), "{e}");
        let f = write("listen: nowhere\n");
        let e = resolve(&argv(&[], f.path()), f.path())
            .unwrap_err()
            .to_string();
        assert!(e.contains(": listen:") && e.contains("HOST:PORT"), "{e}");
    }

    #[test]
    fn every_file_key_has_a_flag() {
        let f = write(
            "listen: 127.0.0.1:1\nmetricsListen: 127.0.0.1:2\nlogFormat: text\nkubeconfigs: [a]\ncontexts: [b]\n\
             inCluster: {enabled: true, name: here}\n\
             clusters: {labels: [{match: 'p-*', labels: {env: prod}}], aliases: {ctx: short}}\n\
             resources: {pods: {namespace: x, fieldIndexes: [spec.nodeName]}}\nfieldIndexes: [status.phase]\n\
             pruning: {managedFields: keep, annotations: [a]}\ninformer: {pageSize: 3, execTimeout: 5s}\n\
             retention: {events: 9, eventsMib: 8, diskShare: 0.3}\nwatch: {subscriberBuffer: 7, bookmarkInterval: 1m}\n\
             store: {dataDir: /tmp/x, persist: true, keepRemovedClusters: true, compactShare: 2, compactMinMib: 1, snapshotLogMib: 32, snapshotCpuShare: 0.2}\n\
             grpc: {requestTimeout: 10s, maxInFlight: 5}\n",
        );
        let r = resolve(&argv(&[], f.path()), f.path()).unwrap();
        let from_file: Vec<&Row> = r.rows.iter().filter(|r| r.source == "file").collect();
        assert_eq!(from_file.len(), 30, "{from_file:#?}");
        for row in from_file {
            assert_ne!(row.key, "-", "{row:?}");
        }
        assert_eq!(r.value("--bookmark-seconds"), Some("60"));
        assert_eq!(r.value("--cluster-alias"), Some("ctx=short"));
    }
}
