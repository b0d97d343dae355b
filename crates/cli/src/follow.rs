//! `fleetscope watch` and `get --watch`: a Watch followed across reconnects and
//! server restarts, resuming where it stood.

use std::time::{Duration, SystemTime};

use tokio_stream::StreamExt;

use super::args;
use super::connect::{Client, ClientError};
use super::lookup::{check_clusters, resource_error, table_for};
use super::output::{self, Format, Item, Table};
use super::printing::{freshness_name, print_streamed, println_flush, retryable};
use fleetscope_proto::{self as proto, Query, WatchRequest};

/// A Watch followed until interrupted. When the stream breaks (the server restarted
/// or went away, or ended this subscriber), it resumes from the last revision seen
/// (through a router: from the last position token and the positions after it),
/// saying so on stderr; a revision the server no longer has ends it with an error.
pub(super) struct Follower {
    client: Client,
    query: Query,
    since: u64,
    initial: bool,
    stream: Option<tonic::Streaming<proto::WatchEvent>>,
    broken: bool,
    /// Through a router: the last position token, and each cluster's position since.
    token: String,
    after: std::collections::BTreeMap<String, proto::StreamPosition>,
    /// Every object the Watch has shown and not deleted, as last shown: what a list
    /// again is told against, as a reflector replaces its store.
    known: std::collections::BTreeMap<(String, String, String), proto::Object>,
    /// Listing again (the position was no longer held): the objects listed so far.
    relisted: Option<std::collections::BTreeSet<(String, String, String)>>,
    /// Events made by a list again, handed out before the stream's next.
    pending: std::collections::VecDeque<proto::WatchEvent>,
}

/// An object's place in a Watch: cluster, namespace, name.
pub(super) fn place(o: &proto::Object) -> (String, String, String) {
    (o.cluster.clone(), o.namespace.clone(), o.name.clone())
}

impl Follower {
    pub(super) fn new(client: Client, query: Query, since: u64, initial: bool) -> Self {
        Self {
            client,
            query,
            since,
            initial,
            stream: None,
            broken: false,
            token: String::new(),
            after: std::collections::BTreeMap::new(),
            known: std::collections::BTreeMap::new(),
            relisted: None,
            pending: std::collections::VecDeque::new(),
        }
    }

    /// The position is no longer held: the Watch starts again with a list, which is
    /// then told against what was shown (see [`Follower::told`]), as a reflector does.
    pub(super) fn list_again(&mut self, why: &str) {
        eprintln!(
            "fleetscope: revision {} is no longer held ({why}): listing again",
            self.since
        );
        self.since = 0;
        self.token.clear();
        self.after.clear();
        self.stream = None;
        self.relisted = Some(std::collections::BTreeSet::new());
    }

    /// What an event from the server means to the person watching: inside a list
    /// again, an object shown already and unchanged is not shown again, a changed one
    /// is MODIFIED, and at the list's end each object shown before and not listed is
    /// DELETED. `None` for an event not to show.
    pub(super) fn told(&mut self, mut e: proto::WatchEvent) -> Option<proto::WatchEvent> {
        use proto::EventType as T;
        let kind = e.r#type();
        if let Some(listed) = &mut self.relisted {
            match (kind, &e.object) {
                (T::Added, Some(o)) => {
                    let p = place(o);
                    listed.insert(p.clone());
                    let same = self
                        .known
                        .get(&p)
                        .is_some_and(|k| k.resource_version == o.resource_version);
                    if self.known.contains_key(&p) {
                        e.r#type = T::Modified as i32;
                    }
                    self.known.insert(p, o.clone());
                    return (!same).then_some(e);
                }
                (T::InitialEventsEnd, _) => {
                    let listed = self.relisted.take().unwrap_or_default();
                    let gone: Vec<_> = self
                        .known
                        .keys()
                        .filter(|p| !listed.contains(*p))
                        .cloned()
                        .collect();
                    for p in gone {
                        if let Some(o) = self.known.remove(&p) {
                            self.pending.push_back(proto::WatchEvent {
                                r#type: T::Deleted as i32,
                                object: Some(o),
                                revision: e.revision,
                                ..Default::default()
                            });
                        }
                    }
                    eprintln!("fleetscope: listed again at revision {}", e.revision);
                    return None;
                }
                _ => {}
            }
        }
        if let Some(o) = &e.object {
            match kind {
                T::Deleted => {
                    self.known.remove(&place(o));
                }
                T::Added | T::Modified => {
                    self.known.insert(place(o), o.clone());
                }
                _ => {}
            }
        }
        Some(e)
    }

    /// The objects the Watch starts with (it was made with `initial`), up to the end
    /// of them; changes follow from [`Follower::next`].
    pub(super) async fn initial_objects(&mut self) -> Result<Vec<Item>, ClientError> {
        let mut items = Vec::new();
        loop {
            let e = self.next().await?;
            match e.r#type() {
                proto::EventType::InitialEventsEnd => return Ok(items),
                proto::EventType::Added => items.extend(e.object.as_ref().map(Item::from_proto)),
                _ => {}
            }
        }
    }

    /// The next event, resuming as often as it takes.
    pub(super) async fn next(&mut self) -> Result<proto::WatchEvent, ClientError> {
        let mut delay = Duration::from_millis(250);
        loop {
            if let Some(e) = self.pending.pop_front() {
                return Ok(e);
            }
            let Some(stream) = &mut self.stream else {
                let opened = self
                    .client
                    .watch(WatchRequest {
                        query: Some(self.query.clone()),
                        since_revision: if self.token.is_empty() { self.since } else { 0 },
                        send_initial_events: (self.initial || self.relisted.is_some())
                            && self.token.is_empty(),
                        bookmark_interval: None,
                        resume_token: self.token.clone(),
                        resume_positions: self.after.values().cloned().collect(),
                        ..WatchRequest::default()
                    })
                    .await;
                match opened {
                    Ok(s) => {
                        if self.broken {
                            eprintln!("fleetscope: resumed from revision {}", self.since);
                            self.broken = false;
                        }
                        // Initial objects only once: a resumed stream continues after them.
                        self.initial = false;
                        self.stream = Some(s.into_inner());
                        delay = Duration::from_millis(250);
                    }
                    Err(s) if retryable(&s) => {
                        self.broke(s.message());
                        tokio::time::sleep(delay).await;
                        delay = (delay * 2).min(Duration::from_secs(5));
                    }
                    Err(s) if s.code() == tonic::Code::OutOfRange && self.relisted.is_none() => {
                        self.list_again(s.message());
                    }
                    Err(s) => return Err(resource_error(&self.query.resource, s)),
                }
                continue;
            };
            match stream.next().await {
                Some(Ok(e)) => {
                    self.since = self.since.max(e.revision);
                    if !e.position_token.is_empty() {
                        self.token = e.position_token.clone();
                        self.after.clear();
                    } else if let Some(p) = &e.position {
                        self.after.insert(p.cluster.clone(), p.clone());
                    }
                    if let Some(e) = self.told(e) {
                        return Ok(e);
                    }
                }
                Some(Err(s)) if retryable(&s) => {
                    self.stream = None;
                    self.broke(s.message());
                }
                Some(Err(s)) if s.code() == tonic::Code::OutOfRange && self.relisted.is_none() => {
                    self.list_again(s.message());
                }
                Some(Err(s)) => return Err(s.into()),
                None => {
                    self.stream = None;
                    self.broke("the server ended the stream");
                }
            }
        }
    }

    pub(super) fn broke(&mut self, why: &str) {
        if !self.broken {
            eprintln!(
                "fleetscope: the watch broke ({why}): resuming from revision {}",
                self.since
            );
            self.broken = true;
        }
    }
}

/// `watch`: changes as they happen, until interrupted; resumes by itself.
pub async fn watch(client: &mut Client, args: args::WatchArgs) -> Result<(), ClientError> {
    check_clusters(client, &args.query).await?;
    let query = args.query.query();
    let one_namespace = args.query.namespaces.len() == 1;
    let mut follower = Follower::new(client.clone(), query, args.since, args.initial);
    let mut table: Option<Table> = None;
    let mut header_printed = args.print.no_headers;
    loop {
        let e = follower.next().await?;
        let printed_row = e.object.is_some();
        table = watch_event(client, e, &args.print, one_namespace, table, header_printed).await;
        header_printed |= printed_row && args.print.output.is_table();
    }
}

/// Prints one Watch event; returns the table to use for the next.
pub(super) async fn watch_event(
    client: &mut Client,
    e: proto::WatchEvent,
    print_args: &args::PrintArgs,
    one_namespace: bool,
    table: Option<Table>,
    header_printed: bool,
) -> Option<Table> {
    let kind = e
        .r#type()
        .as_str_name()
        .trim_start_matches("EVENT_TYPE_")
        .to_string();
    let format = &print_args.output;
    if !format.is_table() {
        if *format == Format::Json {
            let mut line = serde_json::json!({"type": kind, "revision": e.revision.to_string()});
            if let Some(o) = &e.object {
                line["cluster"] = o.cluster.clone().into();
                line["object"] = serde_json::from_str(&o.json).unwrap_or_default();
            }
            if let Some(c) = &e.cluster {
                line["cluster"] = c.cluster.clone().into();
                line["freshness"] = freshness_name(c.freshness()).into();
                line["message"] = c.message.clone().into();
            }
            if let Some(p) = &e.position {
                line["cluster"] = p.cluster.clone().into();
                line["resourceVersion"] = p.resource_version.clone().into();
            }
            println_flush(&format!("{line}\n"));
        } else if let Some(o) = &e.object {
            print_streamed(&Item::from_proto(o), format);
        }
        return table;
    }
    let Some(o) = &e.object else {
        if e.r#type() == proto::EventType::Reset
            && let Some(p) = &e.position
        {
            eprintln!(
                "cluster {} was reset (its history is gone where it is served now): its objects follow again",
                p.cluster
            );
        }
        if let Some(c) = &e.cluster {
            eprintln!(
                "cluster {} is {}{}",
                c.cluster,
                freshness_name(c.freshness()),
                if c.message.is_empty() {
                    String::new()
                } else {
                    format!(": {}", c.message)
                }
            );
        }
        return table;
    };
    let item = Item::from_proto(o);
    let t = match table {
        Some(t) => t,
        None => {
            table_for(
                client,
                std::slice::from_ref(&item),
                print_args,
                one_namespace,
                true,
            )
            .await
        }
    };
    let row = t.row(&item, SystemTime::now(), Some(&kind));
    let header = t.header();
    println_flush(&output::align(
        (!header_printed).then_some(&header[..]),
        &[row],
    ));
    Some(t)
}
