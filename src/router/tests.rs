use super::*;

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
