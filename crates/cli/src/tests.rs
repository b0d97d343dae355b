use super::*;

#[test]
fn a_server_is_a_url_or_host_and_port() {
    assert_eq!(
        server_url("localhost:50051", false),
        "http://localhost:50051"
    );
    assert_eq!(
        server_url("localhost:50051", true),
        "https://localhost:50051"
    );
    assert_eq!(server_url("http://10.0.0.1:1", true), "http://10.0.0.1:1");
    assert_eq!(server_url("https://fleet:443", false), "https://fleet:443");
}

#[test]
fn tables_align_like_kubectl() {
    let t = output::align(
        Some(&["A".into(), "LONGER".into()]),
        &[vec!["xyz".into(), "1".into()]],
    );
    assert_eq!(t, "A     LONGER\nxyz   1\n");
}
