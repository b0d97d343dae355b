use super::*;

#[test]
fn a_list_reads_the_cache_unless_it_must_not_and_never_goes_back() {
    assert_eq!(ListFrom::choose(None, ListReason::Initial), ListFrom::Cache);
    assert_eq!(
        ListFrom::choose(Some(""), ListReason::Initial),
        ListFrom::Cache
    );
    assert_eq!(
        ListFrom::choose(Some("42"), ListReason::Initial),
        ListFrom::NotOlderThan("42".into())
    );
    assert_eq!(
        ListFrom::choose(Some("42"), ListReason::Expired),
        ListFrom::Consistent
    );
    assert_eq!(
        ListFrom::choose(None, ListReason::Expired),
        ListFrom::Consistent
    );
    assert!(goes_back("41", Some("42")));
    assert!(!goes_back("42", Some("42")));
    assert!(!goes_back("100", Some("42")));
    assert!(!goes_back("41", None));
    // Versions that are not numbers cannot be compared.
    assert!(!goes_back("abc", Some("42")));
    assert!(!goes_back("41", Some("xyz")));
}

#[tokio::test]
async fn a_watch_line_longer_than_the_largest_object_is_passed_over_unheld() {
    let long = "x".repeat(200 << 10);
    let text = format!("first\n{long}\nsecond\r\nlast");
    let mut lines = WatchLines::new(futures::io::Cursor::new(text.into_bytes()), 64 << 10);
    let mut got = Vec::new();
    while let Some(line) = lines.next().await {
        got.push(line.unwrap().to_string());
        assert!(
            lines.line.capacity() <= (128 << 10) + 64,
            "held {}",
            lines.line.capacity()
        );
    }
    assert_eq!(got, ["first", "", "second", "last"]);
    assert_eq!(lines.too_long(), 1);
    assert_eq!(lines.too_long(), 0);
}

#[test]
fn resource_versions_are_etcd_s_numbers() {
    for rv in ["1", "42", "18446744073709551615"] {
        assert!(is_resource_version(rv), "{rv}");
    }
    for rv in ["", "abc", "-1", "+1", "1.5", " 1", "18446744073709551616"] {
        assert!(!is_resource_version(rv), "{rv}");
    }
}

#[test]
fn backoff_doubles_to_its_cap_with_jitter_and_resets() {
    let mut b = Backoff::new(Duration::from_millis(800), Duration::from_secs(30));
    let first = b.next_delay();
    assert!(
        first >= Duration::from_millis(600) && first <= Duration::from_millis(1000),
        "{first:?}"
    );
    for _ in 0..20 {
        assert!(b.next_delay() <= Duration::from_millis(37_500));
    }
    b.reset();
    assert!(b.next_delay() <= Duration::from_millis(1000));
}
