//! Watch semantics, below the seam: the initial objects (if asked) then every change
//! after the start, in revision order, from the event log and then live; the filter
//! applied to transitions (an object leaving it is `Deleted`, one entering it
//! `Added`); the cluster filter evaluated against the live fleet, so a cluster added
//! later is followed; cluster freshness changes as events; a subscriber that falls
//! behind ended with a resumable error, one whose start has left the log refused.
//!
//! In rooms: [`start`] (here) resolves a request into a subscription and the parts
//! of its producer; [`live`] runs the producer over the index's feed; [`grant`]
//! decides what the subscriber may see and puts a new policy in force; [`positions`]
//! follows member positions (a router's Watch); [`catchup`] carries a stream from
//! its member's history until it meets this replica's; [`evaluate`] runs the filter
//! on the engine's query threads; [`outlet`] hands the events over.

mod catchup;
mod evaluate;
mod grant;
mod live;
mod outlet;
mod positions;
#[cfg(test)]
mod tests;

use std::collections::HashMap;
use std::sync::Arc;

use fleetscope_index::{IndexError, Start, number};
use fleetscope_model::fleet::{Watch, WatchRequest, reason};
use fleetscope_model::{FleetError, Verb};
use tokio::sync::mpsc;

pub(crate) use catchup::Histories;

use crate::Engine;
use catchup::CatchUp;
use evaluate::Evaluator;
use grant::Grant;
use live::Producer;
use outlet::Outlet;
use positions::{Positions, Starts};

/// Starts a Watch: subscribes at once (so a bad start is an error of the call), and
/// spawns its producer.
///
/// (A revision the index cannot resume from is refused by [`refused`].)
pub(crate) fn start(engine: &Engine, r: WatchRequest) -> Result<Watch, FleetError> {
    if r.resume.is_some() {
        return Err(FleetError::InvalidArgument(
            "resume_token is a router's position; a server resumes from since_revision".into(),
        ));
    }
    let mut access = r.access;
    // Who reads members' histories for this Watch (see [`Histories`]).
    let caller = access.caller();
    // The policy in force now is the one the start is held to; a later one is a change.
    let policy = access.policy_seen();
    let (resource, built) = engine.build(&r.query, &access, Verb::Watch)?;
    let since = if r.initial { None } else { r.since };
    // From member positions: where each cluster's stream starts; those that cannot
    // continue exactly (and those selected but not given) are sent anew first.
    let mut after = Vec::new();
    let mut resets = Vec::new();
    // Streams this replica's log does not carry from the subscriber's position: read
    // from the member's history where its stream runs here.
    let mut histories = Vec::new();
    let subscription = match r.positions {
        Some(mut given) => {
            for c in engine.selected(&r.query.clusters) {
                if !given.iter().any(|(g, _)| *g == c.name) {
                    given.push((c.name, Arc::from("")));
                }
            }
            let (subscription, starts) = engine.index.subscribe_at(&resource.name(), &given);
            for ((cluster, position), start) in given.into_iter().zip(starts) {
                match start {
                    Start::After { revision, skip_to } => {
                        after.push((cluster, revision, skip_to, position));
                    }
                    Start::Reset => match engine.histories.of(&cluster, &resource.name()) {
                        Some(history) if number(&position).is_some() => {
                            histories.push((cluster, position, history));
                        }
                        _ => resets.push(cluster),
                    },
                }
            }
            subscription
        }
        None => engine.index.subscribe(since).map_err(refused)?,
    };
    let whole = built.query.clone();
    // The live events are checked per cluster by the producer, under the policy in
    // force when each arrives.
    let mut query = built.query;
    query.clusters = None;
    query.reach = None;
    let (caught_tx, caught) = mpsc::channel(64);
    let catching = histories
        .into_iter()
        .map(|(cluster, position, history)| {
            tracing::debug!(%cluster, resource = %resource.name(), %position, "a Watch's stream read from the member's history");
            let read = engine.histories.read(
                history,
                position.clone(),
                &caller,
                &engine.tasks,
                &engine.cancel,
            );
            let c = CatchUp::start(
                read,
                cluster.clone(),
                position,
                subscription.snapshot.revision(),
                caught_tx.clone(),
                &engine.tasks,
                &engine.cancel,
            );
            (cluster, c)
        })
        .collect();
    let watched = resource.name();
    let told = engine
        .status
        .clusters()
        .into_iter()
        .map(|c| {
            let (freshness, _, message) = c.freshness(Some(&watched));
            (c.name, (freshness, message))
        })
        .collect::<HashMap<_, _>>();
    let (outlet, watch) = Outlet::open(engine.subscriber_stall, engine.dropped.clone());
    let starts = Starts {
        report: r.report_positions,
        after,
        resets,
        catching,
        caught,
    };
    let positions = Positions::new(starts, whole, engine.histories.clone());
    // The cluster filter is evaluated per event against the live fleet, so a
    // matching cluster added later is followed too; the index query reads all.
    let initial = (r.initial && !positions.positioned()).then(|| positions.whole().clone());
    let producer = Producer {
        outlet,
        grant: Grant::new(
            access,
            policy,
            resource,
            r.query.clusters,
            engine.status.clone(),
        ),
        positions,
        eval: Evaluator::new(
            query,
            r.projection,
            engine.queries.clone(),
            engine.cancelled(),
        ),
        index: engine.index.clone(),
        status: engine.status.clone(),
        statuses: engine.status.subscribe(),
        told,
        initial,
        cancel: engine.cancelled(),
    };
    // Tracked with the engine's tasks: a shutdown waits for it (it ends with the
    // engine's cancellation, or when its subscriber goes).
    let span = tracing::info_span!("task", task = "watch-producer", resource = %watched);
    engine.tasks.spawn(tracing::Instrument::instrument(
        producer.run(subscription),
        span,
    ));
    Ok(watch)
}

/// A revision the index cannot start a Watch from, as the fleet refuses it.
fn refused(e: IndexError) -> FleetError {
    match e {
        IndexError::Expired { oldest, .. } => FleetError::OutOfRange {
            message: e.to_string(),
            reason: reason::REVISION_COMPACTED,
            oldest: Some(oldest),
        },
        IndexError::Future { .. } => FleetError::OutOfRange {
            message: e.to_string(),
            reason: reason::REVISION_IN_FUTURE,
            oldest: None,
        },
    }
}
