//! Watch semantics through the seam, without a transport: an engine with no
//! clusters of its own, fed changes directly, watched through [`Fleet::watch`].

use std::collections::BTreeMap;
use std::time::Duration;

use fleetscope_index::Change;
use fleetscope_model::ObjectState;
use fleetscope_model::fleet::{Query, WatchEvent, WatchRequest};
use fleetscope_model::{
    ClusterFilter, ClusterName, EventType, Fleet, FleetError, LabelSelector, ObjectKey,
    ResourceType, Revision,
};
use futures::StreamExt;

use crate::{Engine, EngineConfig};

const PATIENCE: Duration = Duration::from_secs(30);

fn pods() -> ResourceType {
    ResourceType::new("", "v1", "pods", "Pod", true)
}

fn engine(buffer: usize) -> Engine {
    let mut config = EngineConfig::default();
    config.index.subscriber_buffer = buffer;
    Engine::start(Vec::new(), config)
}

/// A cluster that collects pods, as its discovery would register it.
fn join(e: &Engine, cluster: &str, labels: &[(&str, &str)]) {
    let name = ClusterName::from(cluster);
    let labels: BTreeMap<String, String> = labels
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    e.status.add_cluster(&name, "test", labels);
    e.status.update_stream(&name, &pods(), |_| {});
}

fn pod(cluster: &str, name: &str, app: &str) -> Change {
    let json = format!(
        r#"{{"apiVersion":"v1","kind":"Pod","metadata":{{"name":"{name}","namespace":"ns","uid":"uid-{name}","resourceVersion":"7","labels":{{"app":"{app}"}}}}}}"#
    );
    Change::Upsert(ObjectState {
        key: ObjectKey::new("pods", &ClusterName::from(cluster), "ns", name),
        json: json.into(),
        labels: vec![("app".into(), app.into())],
        owners: Vec::new(),
        fields: Vec::new(),
    })
}

fn query(clusters: &[&str], labels: &str) -> Query {
    Query {
        resource: "pods".into(),
        clusters: ClusterFilter::parse(
            &clusters.iter().map(|c| c.to_string()).collect::<Vec<_>>(),
            "",
        )
        .unwrap(),
        labels: LabelSelector::parse(labels).unwrap(),
        ..Query::default()
    }
}

/// A live watch (no initial objects, from now) of `query`.
async fn live(e: &Engine, query: Query) -> fleetscope_model::fleet::Watch {
    e.watch(WatchRequest {
        query,
        ..WatchRequest::for_caller(fleetscope_model::Access::everything())
    })
    .await
    .unwrap()
}

async fn next(w: &mut fleetscope_model::fleet::Watch) -> WatchEvent {
    tokio::time::timeout(PATIENCE, w.next())
        .await
        .expect("an event in time")
        .expect("the watch goes on")
        .expect("no error")
}

/// The next object event (skipping cluster status events): kind, cluster/name, revision.
async fn next_object(w: &mut fleetscope_model::fleet::Watch) -> (EventType, String, Revision) {
    loop {
        if let WatchEvent::Object {
            kind,
            object,
            revision,
            ..
        } = next(w).await
        {
            assert_eq!(object.uid, format!("uid-{}", object.key.name));
            assert_eq!(object.resource_version, "7");
            return (
                kind,
                format!("{}/{}", object.key.cluster, object.key.name),
                revision,
            );
        }
    }
}

#[tokio::test]
async fn backlog_then_live_in_revision_order() {
    let e = engine(1000);
    join(&e, "a", &[]);
    let start = e.index.snapshot().revision();
    e.index
        .apply([pod("a", "p1", "web"), pod("a", "p2", "web")]);
    let mut w = e
        .watch(WatchRequest {
            query: query(&[], ""),
            since: Some(start),
            ..WatchRequest::for_caller(fleetscope_model::Access::everything())
        })
        .await
        .unwrap();
    e.index.apply([pod("a", "p3", "web")]);
    let mut last = start;
    for name in ["a/p1", "a/p2", "a/p3"] {
        let (kind, got, revision) = next_object(&mut w).await;
        assert_eq!((kind, got.as_str()), (EventType::Added, name));
        assert!(revision > last, "revisions increase");
        last = revision;
    }
}

#[tokio::test]
async fn initial_objects_then_the_end_marker_then_changes() {
    let e = engine(1000);
    join(&e, "a", &[]);
    e.index.apply([pod("a", "p1", "web"), pod("a", "p2", "db")]);
    let mut w = e
        .watch(WatchRequest {
            query: query(&[], "app=web"),
            initial: true,
            ..WatchRequest::for_caller(fleetscope_model::Access::everything())
        })
        .await
        .unwrap();
    assert_eq!(next_object(&mut w).await.1, "a/p1");
    let at = e.index.snapshot().revision();
    match next(&mut w).await {
        WatchEvent::InitialEventsEnd { revision, .. } => assert_eq!(revision, at),
        other => panic!("expected the end of the initial objects, got {other:?}"),
    }
    e.index.apply([pod("a", "p3", "web")]);
    assert_eq!(next_object(&mut w).await.1, "a/p3");
}

#[tokio::test]
async fn filters_apply_to_transitions() {
    let e = engine(1000);
    join(&e, "a", &[]);
    let mut w = live(&e, query(&[], "app=web")).await;
    e.index.apply([pod("a", "p1", "web")]);
    assert_eq!(next_object(&mut w).await.0, EventType::Added);
    e.index.apply([pod("a", "p1", "db")]);
    assert_eq!(next_object(&mut w).await.0, EventType::Deleted);
    e.index.apply([pod("a", "p2", "db")]);
    e.index.apply([pod("a", "p1", "web")]);
    let (kind, name, _) = next_object(&mut w).await;
    assert_eq!((kind, name.as_str()), (EventType::Added, "a/p1"));
}

#[tokio::test]
async fn a_cluster_added_later_is_followed_by_a_matching_glob() {
    let e = engine(1000);
    join(&e, "prod-1", &[]);
    let mut w = live(&e, query(&["prod-*"], "")).await;
    join(&e, "prod-2", &[]);
    join(&e, "dev", &[]);
    e.index
        .apply([pod("dev", "d1", "web"), pod("prod-2", "p1", "web")]);
    // The new cluster's status and its object, in either order; nothing of "dev".
    let (mut saw_status, mut saw_object) = (false, false);
    while !(saw_status && saw_object) {
        match next(&mut w).await {
            WatchEvent::ClusterStatus { cluster, .. } => {
                assert_ne!(cluster.cluster.as_str(), "dev");
                saw_status |= cluster.cluster.as_str() == "prod-2";
            }
            WatchEvent::Object { object, kind, .. } => {
                assert_eq!(kind, EventType::Added);
                assert_eq!(object.key.cluster.as_str(), "prod-2");
                saw_object = true;
            }
            other => panic!("unexpected {other:?}"),
        }
    }
    // A cluster removed: its objects' deletes still reach the watch.
    e.index
        .apply([Change::RemoveCluster(ClusterName::from("prod-2"))]);
    let (kind, name, _) = next_object(&mut w).await;
    assert_eq!((kind, name.as_str()), (EventType::Deleted, "prod-2/p1"));
}

#[tokio::test]
async fn an_oversized_batch_does_not_end_a_subscriber_but_falling_behind_does() {
    let e = engine(4);
    join(&e, "a", &[]);
    let mut w = live(&e, query(&[], "")).await;
    // One batch of 20, more than the buffer of 4: delivered whole.
    e.index
        .apply((0..20).map(|i| pod("a", &format!("big-{i}"), "web")));
    for _ in 0..20 {
        next_object(&mut w).await;
    }
    // Then, not reading, it falls behind change after change: ended, resumably.
    for i in 0..200 {
        e.index.apply([pod("a", &format!("small-{i}"), "web")]);
    }
    let ended = tokio::time::timeout(PATIENCE, async {
        loop {
            match w.next().await {
                Some(Err(e)) => return e,
                Some(Ok(_)) => {}
                None => panic!("ended without an error"),
            }
        }
    })
    .await
    .expect("ended in time");
    assert!(
        matches!(ended, FleetError::ResourceExhausted { .. }),
        "{ended}"
    );
    assert!(ended.to_string().contains("since_revision="), "{ended}");
}

#[tokio::test]
async fn a_start_older_than_the_log_is_out_of_range() {
    let mut config = EngineConfig::default();
    config.index.log_retention = 2;
    let e = Engine::start(Vec::new(), config);
    join(&e, "a", &[]);
    let start = e.index.snapshot().revision();
    for i in 0..10 {
        e.index.apply([pod("a", &format!("p{i}"), "web")]);
    }
    let refused = e
        .watch(WatchRequest {
            query: query(&[], ""),
            since: Some(start),
            ..WatchRequest::for_caller(fleetscope_model::Access::everything())
        })
        .await
        .err()
        .expect("refused");
    assert!(
        matches!(refused, FleetError::OutOfRange { .. }),
        "{refused}"
    );
}

#[tokio::test]
async fn a_bookmark_never_runs_ahead_of_an_event_still_to_be_yielded() {
    let e = engine(1000);
    join(&e, "a", &[]);
    let mut w = live(&e, query(&[], "")).await;
    e.index.apply([pod("a", "p1", "web")]);
    let published = e.index.snapshot().revision();
    // Wait until the producer has handed the event over and moved on.
    let waker = futures::task::noop_waker();
    let mut cx = std::task::Context::from_waker(&waker);
    let deadline = tokio::time::Instant::now() + PATIENCE;
    loop {
        match w.bookmark(&mut cx) {
            // The event is still to come: no bookmark may claim its revision.
            None => break,
            Some(r) => assert!(r < published, "bookmark {r} ahead of an undelivered event"),
        }
        assert!(tokio::time::Instant::now() < deadline);
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let (_, name, revision) = next_object(&mut w).await;
    assert_eq!((name.as_str(), revision), ("a/p1", published));
    assert_eq!(w.bookmark(&mut cx), Some(published));
}

/// A policy granting pods of the listed (cluster, namespace) places, and Secret
/// values nowhere.
struct Places(Vec<(&'static str, &'static str)>);

impl fleetscope_model::access::Policy for Places {
    fn namespaces(
        &self,
        _: &fleetscope_model::access::Subject,
        _: fleetscope_model::Verb,
        _: &ResourceType,
        cluster: fleetscope_model::access::ClusterRef<'_>,
    ) -> fleetscope_model::access::Namespaces {
        let patterns: Vec<glob::Pattern> = self
            .0
            .iter()
            .filter(|(c, _)| *c == cluster.name.as_str())
            .map(|(_, n)| glob::Pattern::new(n).unwrap())
            .collect();
        fleetscope_model::access::Namespaces::Only {
            patterns,
            cluster_scoped: false,
        }
    }
    fn secret_data(
        &self,
        _: &fleetscope_model::access::Subject,
        _: fleetscope_model::access::ClusterRef<'_>,
        _: &str,
    ) -> bool {
        false
    }
    fn sees_cluster(
        &self,
        _: &fleetscope_model::access::Subject,
        cluster: fleetscope_model::access::ClusterRef<'_>,
    ) -> bool {
        self.0.iter().any(|(c, _)| *c == cluster.name.as_str())
    }
}

type PolicyTx = tokio::sync::watch::Sender<std::sync::Arc<dyn fleetscope_model::access::Policy>>;

fn held_to(places: Vec<(&'static str, &'static str)>) -> (fleetscope_model::Access, PolicyTx) {
    let (tx, rx) =
        tokio::sync::watch::channel(std::sync::Arc::new(Places(places))
            as std::sync::Arc<dyn fleetscope_model::access::Policy>);
    let subject = fleetscope_model::access::Subject {
        user: "alice".into(),
        groups: Vec::new(),
    };
    (fleetscope_model::Access::new(subject, rx), tx)
}

fn pod_in(cluster: &str, namespace: &str, name: &str) -> Change {
    let json = format!(
        r#"{{"apiVersion":"v1","kind":"Pod","metadata":{{"name":"{name}","namespace":"{namespace}","uid":"uid-{name}","resourceVersion":"7"}}}}"#
    );
    Change::Upsert(ObjectState {
        key: ObjectKey::new("pods", &ClusterName::from(cluster), namespace, name),
        json: json.into(),
        labels: Vec::new(),
        owners: Vec::new(),
        fields: Vec::new(),
    })
}

#[tokio::test]
async fn a_watch_sees_only_its_grant_and_follows_a_new_policy_at_once() {
    let e = engine(1000);
    join(&e, "a", &[]);
    join(&e, "b", &[]);
    e.index.apply([
        pod_in("a", "team", "p1"),
        pod_in("a", "other", "p2"),
        pod_in("b", "team", "p3"),
    ]);
    let (access, policy) = held_to(vec![("a", "team")]);
    let mut w = e
        .watch(WatchRequest {
            query: query(&[], ""),
            initial: true,
            ..WatchRequest::for_caller(access)
        })
        .await
        .unwrap();
    assert_eq!(next_object(&mut w).await.1, "a/p1");
    assert!(matches!(
        next(&mut w).await,
        WatchEvent::InitialEventsEnd { .. }
    ));
    // Changes outside the grant are never sent; one inside is.
    e.index
        .apply([pod_in("a", "other", "p4"), pod_in("b", "team", "p5")]);
    e.index.apply([pod_in("a", "team", "p6")]);
    assert_eq!(next_object(&mut w).await.1, "a/p6");
    // A new policy: a/team taken away, b/team granted. The objects leaving are
    // DELETED, those entering ADDED, at the revision reached; then it is followed.
    let at = e.index.snapshot().revision();
    policy.send_replace(std::sync::Arc::new(Places(vec![("b", "team")])));
    let mut seen = std::collections::BTreeSet::new();
    for _ in 0..4 {
        let (kind, name, revision) = next_object(&mut w).await;
        assert_eq!(revision, at);
        seen.insert((name, format!("{kind:?}")));
    }
    let expected: std::collections::BTreeSet<(String, String)> = [
        ("a/p1", EventType::Deleted),
        ("a/p6", EventType::Deleted),
        ("b/p3", EventType::Added),
        ("b/p5", EventType::Added),
    ]
    .into_iter()
    .map(|(n, k)| (n.to_string(), format!("{k:?}")))
    .collect();
    assert_eq!(seen, expected);
    e.index.apply([pod_in("a", "team", "p7")]);
    e.index.apply([pod_in("b", "team", "p8")]);
    assert_eq!(next_object(&mut w).await.1, "b/p8");
}

#[tokio::test]
async fn a_type_a_cluster_does_not_serve_is_named_only_to_who_reads_everything_there() {
    let e = engine(1000);
    join(&e, "a", &[]);
    e.index.apply([pod_in("a", "team", "p1")]);
    e.status.update(&ClusterName::from("a"), |c| {
        c.missing = vec![("widgets.example.com".into(), "not served".into())];
    });
    let everything = fleetscope_model::Access::everything();
    let (narrow, _policy) = held_to(vec![("a", "team")]);
    for (access, named) in [(everything, true), (narrow, false)] {
        let answer = e.clusters(ClusterFilter::default(), &access).await.unwrap();
        let text = format!("{:?}", answer.clusters);
        assert_eq!(text.contains("widgets"), named, "{text}");
    }
}

#[tokio::test]
async fn list_count_and_get_answer_only_the_grant() {
    use fleetscope_model::fleet::{CountRequest, GetRequest, ListRequest};
    let e = engine(1000);
    join(&e, "a", &[]);
    join(&e, "b", &[]);
    e.index.apply([
        pod_in("a", "team", "p1"),
        pod_in("a", "other", "p2"),
        pod_in("b", "team", "p3"),
    ]);
    let (access, _policy) = held_to(vec![("a", "team")]);
    let list = e
        .list(ListRequest {
            query: query(&[], ""),
            limit: 100,
            max_bytes: usize::MAX,
            ..ListRequest::for_caller(access.clone())
        })
        .await
        .unwrap();
    let names: Vec<String> = list.items.iter().map(|o| o.key.to_string()).collect();
    assert_eq!(list.items.len(), 1, "{names:?}");
    assert_eq!(
        list.clusters.len(),
        1,
        "only the cluster granted is drawn on"
    );
    let count = e
        .count(CountRequest {
            query: query(&[], ""),
            group_by: vec![fleetscope_model::GroupBy::Namespace],
            access: access.clone(),
        })
        .await
        .unwrap();
    assert_eq!(count.total, 1);
    assert_eq!(count.groups.len(), 1);
    let get = |cluster: &str, namespace: &str, name: &str| GetRequest {
        resource: "pods".into(),
        cluster: cluster.into(),
        namespace: namespace.into(),
        name: name.into(),
        ..GetRequest::for_caller(access.clone())
    };
    assert!(e.get(get("a", "team", "p1")).await.is_ok());
    // Not granted reads exactly as not there.
    let hidden = e.get(get("a", "other", "p2")).await.unwrap_err();
    let missing = e.get(get("a", "other", "nope")).await.unwrap_err();
    assert_eq!(
        hidden.to_string().replace("p2", "X"),
        missing.to_string().replace("nope", "X")
    );
    let hidden = e.get(get("b", "team", "p3")).await.unwrap_err();
    let missing = e.get(get("c", "team", "p3")).await.unwrap_err();
    assert_eq!(
        hidden.to_string().replace("\"b\"", "?"),
        missing.to_string().replace("\"c\"", "?")
    );
    let clusters = e.clusters(ClusterFilter::default(), &access).await.unwrap();
    let names: Vec<&str> = clusters.clusters.iter().map(|c| c.name.as_str()).collect();
    assert_eq!(names, ["a"]);
    assert_eq!(clusters.clusters[0].streams[0].object_count, 1);
    let types = e.resource_types(&access).await.unwrap();
    assert_eq!(types.len(), 1);
    assert_eq!(types[0].clusters, vec![(ClusterName::from("a"), 1)]);
}

#[test]
fn a_secret_shown_without_its_values_keeps_its_keys_and_says_so() {
    let mut o = fleetscope_model::fleet::FleetObject {
        key: ObjectKey::new("secrets", &ClusterName::from("a"), "ns", "s"),
        revision: Revision(1),
        uid: String::new(),
        resource_version: String::new(),
        json: r#"{"apiVersion":"v1","kind":"Secret","metadata":{"name":"s"},"data":{"password":"aHVudGVyMg=="},"stringData":{"token":"t0p"}}"#.into(),
    };
    crate::view::redact_secret(&mut o);
    let v: serde_json::Value = serde_json::from_str(&o.json).unwrap();
    assert_eq!(v["data"]["password"], "");
    assert_eq!(v["stringData"]["token"], "");
    assert_eq!(
        v["metadata"]["annotations"]["fleetscope.io/redacted"],
        "data,stringData"
    );
    assert!(!o.json.contains("aHVudGVyMg"));
}

#[test]
fn a_redacted_secret_loses_its_last_applied_copy_in_full_and_metadata_form() {
    let applied =
        r#"{\"apiVersion\":\"v1\",\"data\":{\"password\":\"aHVudGVyMg==\"},\"kind\":\"Secret\"}"#;
    for body in [r#","data":{"password":"aHVudGVyMg=="}"#, ""] {
        let mut o = fleetscope_model::fleet::FleetObject {
            key: ObjectKey::new("secrets", &ClusterName::from("a"), "ns", "s"),
            revision: Revision(1),
            uid: String::new(),
            resource_version: String::new(),
            json: format!(
                r#"{{"apiVersion":"v1","kind":"Secret","metadata":{{"name":"s","annotations":{{"kubectl.kubernetes.io/last-applied-configuration":"{applied}","keep":"me"}}}}{body}}}"#
            ).into(),
        };
        crate::view::redact_secret(&mut o);
        assert!(!o.json.contains("aHVudGVyMg"), "{}", o.json);
        let v: serde_json::Value = serde_json::from_str(&o.json).unwrap();
        let a = &v["metadata"]["annotations"];
        assert_eq!(a["keep"], "me");
        let said = a["fleetscope.io/redacted"].as_str().unwrap();
        assert!(
            said.ends_with("kubectl.kubernetes.io/last-applied-configuration"),
            "{said}"
        );
    }
}

#[tokio::test]
async fn a_watch_left_unread_is_ended_and_told_where_to_resume() {
    let config = EngineConfig {
        subscriber_stall: Duration::from_millis(100),
        ..EngineConfig::default()
    };
    let e = Engine::start(Vec::new(), config);
    join(&e, "a", &[]);
    let before = e.index.subscriber_count();
    let mut w = live(&e, query(&[], "")).await;
    assert_eq!(e.index.subscriber_count(), before + 1);
    for i in 0..50 {
        e.index.apply([pod("a", &format!("p{i}"), "web")]);
    }
    // Nobody reads: the producer gives up, and its subscription goes.
    let deadline = tokio::time::Instant::now() + PATIENCE;
    while e.index.subscriber_count() > before {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the unread Watch is ended"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    // Reading now: what was handed over, then why it ended, resumably.
    let mut delivered = 0;
    let ended = loop {
        match tokio::time::timeout(PATIENCE, w.next())
            .await
            .expect("in time")
        {
            Some(Ok(_)) => delivered += 1,
            Some(Err(err)) => break err,
            None => panic!("ended without saying why"),
        }
    };
    assert!(delivered > 0 && delivered < 50, "{delivered}");
    assert!(
        matches!(ended, FleetError::ResourceExhausted { .. }),
        "{ended}"
    );
    assert!(ended.to_string().contains("since_revision="), "{ended}");
    assert!(w.next().await.is_none());
}

#[tokio::test]
async fn a_query_past_its_deadline_is_deadline_exceeded_not_a_partial_answer() {
    use fleetscope_model::fleet::{CountRequest, ListRequest};
    let config = EngineConfig {
        query_timeout: Duration::from_nanos(1),
        ..EngineConfig::default()
    };
    let e = Engine::start(Vec::new(), config);
    join(&e, "a", &[]);
    e.index
        .apply((0..5000).map(|i| pod("a", &format!("p{i}"), "web")));
    let q = query(&[], "app=web,tier!=db");
    let count = e
        .count(CountRequest {
            query: q.clone(),
            ..CountRequest::for_caller(fleetscope_model::Access::everything())
        })
        .await
        .unwrap_err();
    assert!(matches!(count, FleetError::DeadlineExceeded(_)), "{count}");
    let list = e
        .list(ListRequest {
            query: q,
            limit: 10_000,
            max_bytes: usize::MAX,
            ..ListRequest::for_caller(fleetscope_model::Access::everything())
        })
        .await
        .unwrap_err();
    assert!(matches!(list, FleetError::DeadlineExceeded(_)), "{list}");
}

/// A watch event of pod `name` in `cluster` at member resourceVersion `rv`.
fn pod_at(cluster: &str, name: &str, rv: u64) -> Change {
    let Change::Upsert(input) = pod(cluster, name, "web") else {
        unreachable!()
    };
    Change::UpsertAt(input, std::sync::Arc::from(rv.to_string()))
}

fn positioned(e: &Engine, positions: &[(&str, &str)]) -> WatchRequest {
    let _ = e;
    WatchRequest {
        query: query(&[], ""),
        positions: Some(
            positions
                .iter()
                .map(|(c, rv)| (ClusterName::from(*c), std::sync::Arc::from(*rv)))
                .collect(),
        ),
        report_positions: true,
        ..WatchRequest::for_caller(fleetscope_model::Access::everything())
    }
}

/// The next event that is not a cluster's status.
async fn next_change(w: &mut fleetscope_model::fleet::Watch) -> WatchEvent {
    loop {
        match next(w).await {
            WatchEvent::ClusterStatus { .. } => {}
            e => return e,
        }
    }
}

fn object_at(e: &WatchEvent) -> (String, Option<&str>) {
    match e {
        WatchEvent::Object {
            object, position, ..
        } => (object.key.name.to_string(), position.as_deref()),
        other => panic!("expected an object, got {other:?}"),
    }
}

/// Reads a cluster sent anew, which must come next: the cluster the reset names,
/// each object it sends with the position it carries, and the cluster and
/// position its end gives.
async fn reset_of(
    w: &mut fleetscope_model::fleet::Watch,
) -> (String, Vec<(String, Option<String>)>, (String, String)) {
    let cluster = match next_change(w).await {
        WatchEvent::Reset { cluster } => cluster.to_string(),
        other => panic!("expected a reset, got {other:?}"),
    };
    let mut objects = Vec::new();
    loop {
        match next_change(w).await {
            WatchEvent::ResetEnd {
                cluster: ended,
                position,
                ..
            } => return (cluster, objects, (ended.to_string(), position.to_string())),
            e => {
                let (name, position) = object_at(&e);
                objects.push((name, position.map(str::to_string)));
            }
        }
    }
}
#[tokio::test]
async fn from_a_member_position_the_changes_after_it_follow_with_theirs() {
    let e = engine(1000);
    join(&e, "a", &[]);
    e.index
        .apply([pod_at("a", "p1", 11), pod_at("a", "p2", 12)]);
    e.index.apply([pod_at("a", "p3", 13)]);
    let mut w = e.watch(positioned(&e, &[("a", "11")])).await.unwrap();
    match next_change(&mut w).await {
        WatchEvent::Positions { positions, .. } => {
            assert_eq!(
                positions,
                [(ClusterName::from("a"), std::sync::Arc::from("11"))]
            );
        }
        other => panic!("expected the positions, got {other:?}"),
    }
    assert_eq!(
        object_at(&next_change(&mut w).await),
        ("p2".into(), Some("12"))
    );
    assert_eq!(
        object_at(&next_change(&mut w).await),
        ("p3".into(), Some("13"))
    );
    e.index.apply([pod_at("a", "p4", 20)]);
    assert_eq!(
        object_at(&next_change(&mut w).await),
        ("p4".into(), Some("20"))
    );
    // Between two changes: what is at or before the position is not sent again.
    let mut w = e.watch(positioned(&e, &[("a", "12")])).await.unwrap();
    next_change(&mut w).await;
    assert_eq!(
        object_at(&next_change(&mut w).await),
        ("p3".into(), Some("13"))
    );
}

#[tokio::test]
async fn a_position_from_before_this_replica_let_the_cluster_go_is_not_carried() {
    let e = engine(1000);
    join(&e, "a", &[]);
    e.index
        .apply([pod_at("a", "p1", 11), pod_at("a", "p2", 12)]);
    // The cluster goes to another replica, which sees p2 deleted; it comes back
    // here by a fresh list, without p2.
    e.index
        .apply([Change::RemoveCluster(ClusterName::from("a"))]);
    join(&e, "a", &[]);
    e.index.apply([pod_at("a", "p1", 20)]);
    // A subscriber standing at 12 is sent the cluster anew (no history of the
    // member here), never the fresh list as news with p2 left standing.
    let mut w = e.watch(positioned(&e, &[("a", "12")])).await.unwrap();
    assert_eq!(
        reset_of(&mut w).await,
        (
            "a".into(),
            vec![("p1".into(), None)],
            ("a".into(), "20".into())
        )
    );
}

#[tokio::test]
async fn a_position_with_no_history_here_is_reset_and_a_cluster_leaving_ends_the_stream() {
    let e = engine(1000);
    join(&e, "a", &[]);
    e.index
        .apply([pod_at("a", "p1", 11), pod_at("a", "p2", 12)]);
    let mut w = e.watch(positioned(&e, &[("a", "5")])).await.unwrap();
    assert_eq!(
        reset_of(&mut w).await,
        (
            "a".into(),
            vec![("p1".into(), None), ("p2".into(), None)],
            ("a".into(), "12".into())
        )
    );
    assert!(matches!(
        next_change(&mut w).await,
        WatchEvent::Positions { .. }
    ));
    // Ahead of this fleet (another replica saw 30): changes up to it are skipped.
    let mut ahead = e.watch(positioned(&e, &[("a", "30")])).await.unwrap();
    next_change(&mut ahead).await;
    e.index
        .apply([pod_at("a", "p3", 25), pod_at("a", "p4", 31)]);
    assert_eq!(
        object_at(&next_change(&mut ahead).await),
        ("p4".into(), Some("31"))
    );
    assert_eq!(
        object_at(&next_change(&mut w).await),
        ("p3".into(), Some("25"))
    );
    assert_eq!(
        object_at(&next_change(&mut w).await),
        ("p4".into(), Some("31"))
    );
    // The cluster leaving this fleet is no change of it: nothing of it is
    // reported, and the stream ends, retryably (a router follows the cluster
    // where it is served now); the cluster taken up here again is never sent on
    // it as a list of no position.
    e.index
        .apply([Change::RemoveCluster(ClusterName::from("a"))]);
    join(&e, "a", &[]);
    e.index.apply([pod_at("a", "p1", 40)]);
    loop {
        match tokio::time::timeout(PATIENCE, w.next()).await.unwrap() {
            Some(Ok(WatchEvent::ClusterStatus { .. } | WatchEvent::Positions { .. })) => {}
            Some(Err(FleetError::Unavailable(why))) => {
                assert!(why.contains("cluster a left this replica"), "{why}");
                break;
            }
            other => panic!("the stream went on after its cluster left: {other:?}"),
        }
    }
    assert!(w.next().await.is_none());
}

#[tokio::test]
async fn a_replay_from_another_cluster_s_start_never_repeats_what_a_stream_holds() {
    let e = engine(1000);
    join(&e, "a", &[]);
    join(&e, "b", &[]);
    e.index.apply([pod_at("b", "q1", 5)]);
    e.index.apply([pod_at("a", "p1", 11)]);
    // This replica let the cluster go and took it up again since b's position.
    e.index
        .apply([Change::RemoveCluster(ClusterName::from("a"))]);
    join(&e, "a", &[]);
    e.index
        .apply([pod_at("a", "p1", 20), pod_at("a", "p2", 21)]);
    e.index.apply([pod_at("b", "q2", 6)]);
    // b starts long before a: the replay holds a leaving and coming back, none of
    // which is news to a subscriber standing at 21 in a.
    let mut w = e
        .watch(positioned(&e, &[("b", "5"), ("a", "21")]))
        .await
        .unwrap();
    assert!(matches!(
        next_change(&mut w).await,
        WatchEvent::Positions { .. }
    ));
    assert_eq!(
        object_at(&next_change(&mut w).await),
        ("q2".into(), Some("6"))
    );
    e.index.apply([pod_at("a", "p3", 22)]);
    assert_eq!(
        object_at(&next_change(&mut w).await),
        ("p3".into(), Some("22"))
    );
}
