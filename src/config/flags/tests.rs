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

fn sim_spec(args: &[&str]) -> Result<FleetSpec, String> {
    use clap::FromArgMatches as _;
    let matches = SimArgs::augment_args(clap::Command::new("sim"))
        .try_get_matches_from([&["sim"], args].concat())
        .map_err(|e| e.to_string())?;
    let sim = SimArgs::from_arg_matches(&matches).map_err(|e| e.to_string())?;
    sim.fleet.spec().map_err(|e| e.to_string())
}

#[test]
fn simulated_clusters_take_a_latency_a_cache_lag_and_a_streaming_list_answer() {
    let spec = sim_spec(&[
        "--latency",
        "20ms",
        "--cache-lag",
        "3",
        "--streaming-lists",
        "refused",
    ])
    .unwrap();
    assert_eq!(spec.latency, std::time::Duration::from_millis(20));
    assert_eq!(spec.cache_lag, 3);
    assert_eq!(spec.watch_list, fleetscope_sim::WatchListSupport::Refused);
    assert_eq!(
        sim_spec(&["--streaming-lists", "unknown"])
            .unwrap()
            .watch_list,
        fleetscope_sim::WatchListSupport::Unknown
    );
    assert_eq!(sim_spec(&[]).unwrap().latency, std::time::Duration::ZERO);
    let e = sim_spec(&["--latency", "soon"]).unwrap_err();
    assert!(e.contains("--latency") && e.contains("soon"), "{e}");
}
