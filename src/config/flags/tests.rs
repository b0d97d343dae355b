use super::*;

#[test]
fn listen_addresses_are_host_and_port() {
    for ok in [
        "127.0.0.1:50051",
        "localhost:50051",
        "[::1]:0",
        "0.0.0.0:8080",
        "fleet-0.fleet:1",
    ] {
        assert_eq!(host_port(ok).as_deref(), Ok(ok), "{ok}");
    }
    for bad in [
        "50051",
        "localhost",
        "localhost:http",
        ":50051",
        "[::1:80",
        "a b:1",
        "host:70000",
    ] {
        let e = host_port(bad).unwrap_err();
        assert!(e.contains("HOST:PORT"), "{bad}: {e}");
    }
}
