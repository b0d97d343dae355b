//! Where fleetscope's settings come from and how they reload: the configuration file
//! ([`file`]), its resolution with flags and environment ([`resolve`]), the cluster
//! sources (kubeconfig files and `--context` patterns, [`kubeconfig`]) and the reload
//! of both ([`reload`]).

pub mod file;
pub mod flags;
pub mod kubeconfig;
pub mod plan;
pub mod reload;
pub mod resolve;
pub mod settings;
pub mod sim_flags;

/// Parses a duration as people write it: `30s`, `500ms`, `2m`, `1h 30m`, or a bare
/// number of seconds.
pub fn parse_duration(text: &str) -> Result<std::time::Duration, String> {
    let text = text.trim();
    if let Ok(secs) = text.parse::<f64>() {
        return std::time::Duration::try_from_secs_f64(secs)
            .map_err(|_| format!("{text:?} is not a duration of zero or more seconds"));
    }
    let d: jiff::SignedDuration = text
        .parse()
        .map_err(|_| format!("{text:?} is not a duration (e.g. 30s, 500ms, 2m)"))?;
    std::time::Duration::try_from(d).map_err(|_| format!("{text:?} is negative"))
}

/// A duration of more than zero: a timeout or an interval, which at zero would end
/// every call or spin.
pub fn parse_timeout(text: &str) -> Result<std::time::Duration, String> {
    let d = parse_duration(text)?;
    if d.is_zero() {
        return Err(format!("{text:?} is zero: it must be more than 0"));
    }
    Ok(d)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_timeout_is_more_than_zero() {
        assert!(parse_timeout("0s").unwrap_err().contains("more than 0"));
        assert!(parse_timeout("0").is_err());
        assert_eq!(parse_timeout("1ms").unwrap().as_millis(), 1);
    }

    #[test]
    fn durations_read_as_people_write_them() {
        assert_eq!(parse_duration("30s").unwrap().as_secs(), 30);
        assert_eq!(parse_duration("500ms").unwrap().as_millis(), 500);
        assert_eq!(parse_duration("2m").unwrap().as_secs(), 120);
        assert_eq!(parse_duration("1.5").unwrap().as_millis(), 1500);
        assert!(parse_duration("-3s").is_err());
        assert!(parse_duration("soon").is_err());
    }
}
