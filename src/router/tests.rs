use super::*;

#[test]
fn a_routed_list_asks_again_only_replicas_left_unasked_that_still_have_objects() {
    let positions = Positions {
        s: (0..4).map(|i| (format!("r{i}"), 1, Vec::new())).collect(),
        r: vec![5, 5, 0, 5],
        t: vec![
            1_000,
            1_000 - KEEP_SNAPSHOT_EVERY,
            0,
            1_000 - KEEP_SNAPSHOT_EVERY + 1,
        ],
    };
    // r1 was asked a while ago; r2 has nothing left; r0 and r3 recently.
    assert_eq!(to_keep(&positions, 1_000), vec![1]);
    // A token of an earlier version: every replica with objects left.
    let earlier = Positions {
        t: Vec::new(),
        ..positions
    };
    assert_eq!(to_keep(&earlier, 1_000), vec![0, 1, 3]);
}

#[test]
fn an_answer_counts_only_from_the_replica_its_lease_names() {
    let member = Member {
        identity: "replica-a".into(),
        annotations: BTreeMap::from([(owner::ADDRESS.to_string(), "10.0.0.1:50051".into())]),
    };
    let headers = |value: Option<&str>| {
        let mut h = tonic::metadata::MetadataMap::new();
        if let Some(v) = value {
            h.insert(crate::grpc::REPLICA_HEADER, v.parse().unwrap());
        }
        h
    };
    assert!(answered_as(&headers(Some("ring/replica-a")), "ring", &member).is_ok());
    for (value, says) in [
        (
            Some("ring/replica-b"),
            "answers as replica \"ring/replica-b\"",
        ),
        (
            Some("other/replica-a"),
            "answers as replica \"other/replica-a\"",
        ),
        (Some("replica-a"), "answers as replica \"replica-a\""),
        (None, "answers as no replica of a ring"),
    ] {
        let refused = answered_as(&headers(value), "ring", &member).unwrap_err();
        assert!(
            matches!(&refused, FleetError::Unavailable(m) if m.contains(says) && m.contains("10.0.0.1:50051") && m.contains("--shard-advertise")),
            "{value:?}: {refused}"
        );
    }
}
