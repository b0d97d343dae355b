//! Printing what the commands show: items in the chosen format, streamed items,
//! and the names of states and durations as a person reads them.

use std::io::Write as _;
use std::time::Duration;

use super::columns;
use super::output::{self, Format, Item};
use fleetscope_proto as proto;

pub(super) fn print(text: &str) {
    let _ = std::io::stdout().write_all(text.as_bytes());
}

pub(super) fn println_flush(text: &str) {
    let mut out = std::io::stdout().lock();
    let _ = out.write_all(text.as_bytes());
    let _ = out.flush();
}

/// Prints items in a non-table format: one object alone when `single`, else a List.
pub(super) fn print_items(items: &[Item], format: &Format, single: bool) {
    match format {
        Format::Name => {
            let names: String = items.iter().map(|i| i.qualified_name() + "\n").collect();
            print(&names);
        }
        Format::Json | Format::Yaml | Format::JsonPath(_) => {
            let value = if single && items.len() == 1 {
                items[0].annotated()
            } else {
                output::list(items)
            };
            match format {
                Format::Json => print(&output::to_json(&value)),
                Format::Yaml => print(&output::to_yaml(&value)),
                Format::JsonPath(t) => print(&t.render(&value)),
                _ => {}
            }
        }
        _ => {}
    }
}

/// One object of a stream (`get -w`, `watch`) in a non-table format, flushed at once:
/// each a document of its own (YAML ones separated by `---`).
pub(super) fn print_streamed(item: &Item, format: &Format) {
    match format {
        Format::Json => println_flush(&output::to_json(&item.annotated())),
        Format::Yaml => println_flush(&format!("---\n{}", output::to_yaml(&item.annotated()))),
        Format::Name => println_flush(&format!("{}\n", item.qualified_name())),
        Format::JsonPath(t) => println_flush(&t.render(&item.annotated())),
        _ => {}
    }
}

/// A cluster's owners through a router, the assigned one first; `<none>` from a
/// single server (or where no replica serves it).
pub(super) fn owners_text(owners: &[String]) -> String {
    if owners.is_empty() {
        "<none>".into()
    } else {
        owners.join(",")
    }
}

/// Whether a Watch failure is worth resuming from the last revision.
pub(super) fn retryable(s: &tonic::Status) -> bool {
    matches!(
        s.code(),
        tonic::Code::Unavailable
            | tonic::Code::Unknown
            | tonic::Code::ResourceExhausted
            | tonic::Code::Cancelled
            | tonic::Code::Internal
            | tonic::Code::DeadlineExceeded
    )
}

/// Says on stderr, as kubectl warns, which clusters an answer drew on are not current.
pub(super) fn warn_not_current(clusters: &[proto::ClusterFreshness]) {
    for f in clusters
        .iter()
        .filter(|f| f.freshness() != proto::Freshness::Synced)
    {
        eprintln!(
            "warning: cluster {} is {}: {}",
            f.cluster,
            freshness_name(f.freshness()),
            f.message
        );
    }
}

pub(super) fn freshness_name(f: proto::Freshness) -> String {
    f.as_str_name().trim_start_matches("FRESHNESS_").to_string()
}

pub(super) fn state_name(s: proto::StreamState) -> String {
    s.as_str_name()
        .trim_start_matches("STREAM_STATE_")
        .to_string()
}

pub(super) fn duration_text(d: Option<&prost_types::Duration>) -> String {
    match d {
        None => String::new(),
        Some(d) => {
            columns::human_duration(Duration::from_secs(u64::try_from(d.seconds).unwrap_or(0)))
        }
    }
}

/// How a stream synced, as the CLI shows it.
pub(super) fn sync_method_name(m: proto::SyncMethod) -> String {
    match m {
        proto::SyncMethod::Unspecified => "<none>",
        proto::SyncMethod::WatchList => "watch-list",
        proto::SyncMethod::ListFromCache => "list-from-cache",
        proto::SyncMethod::ListConsistent => "list-consistent",
        proto::SyncMethod::Resumed => "resumed",
    }
    .to_string()
}
