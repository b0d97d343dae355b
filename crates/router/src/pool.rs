//! The router's connections to each replica: as many as its open calls need. One
//! HTTP/2 connection carries a bounded number of streams (the replica's
//! `--grpc-max-concurrent-streams`), and a Watch holds one for as long as it runs:
//! were every call to share one connection, one caller's Watches could fill it and
//! leave every other caller's calls waiting. Each call takes a place on the least
//! busy connection to its replica, and a new connection is opened once every open
//! one carries [`CALLS_PER_CONNECTION`]; a place is given back when its call ends
//! (a unary call's answer, a Watch's stream dropped).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use tonic::transport::Channel;

/// Calls one connection carries before another is opened beside it (well under a
/// replica's streams per connection).
pub const CALLS_PER_CONNECTION: usize = 100;

/// The most connections to one replica: past it, calls share the least busy.
const MOST_CONNECTIONS: usize = 64;

/// One connection, and the calls open on it.
#[derive(Clone)]
struct Connection {
    channel: Channel,
    open: Arc<AtomicUsize>,
}

/// A call's place on a connection, given back when dropped.
#[derive(Debug)]
pub struct Place(Arc<AtomicUsize>);

impl Drop for Place {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

/// The connections to every replica, by address.
#[derive(Default)]
pub struct Pools(std::sync::Mutex<BTreeMap<String, Vec<Connection>>>);

impl Pools {
    /// A place for one call to the replica at `address`: on the least busy of its
    /// connections, or on a new one `connect` makes when every one is full.
    pub fn place<E>(
        &self,
        address: &str,
        connect: impl FnOnce() -> Result<Channel, E>,
    ) -> Result<(Channel, Place), E> {
        let mut pools = self.0.lock().unwrap_or_else(|e| e.into_inner());
        let pool = pools.entry(address.to_string()).or_default();
        let loads: Vec<usize> = pool
            .iter()
            .map(|c| c.open.load(Ordering::Acquire))
            .collect();
        let chosen = match pick(&loads) {
            Some(i) => pool[i].clone(),
            None => {
                let c = Connection {
                    channel: connect()?,
                    open: Arc::default(),
                };
                pool.push(c.clone());
                c
            }
        };
        chosen.open.fetch_add(1, Ordering::AcqRel);
        Ok((chosen.channel, Place(chosen.open)))
    }

    /// Per address: connections open, and calls open on them.
    pub fn figures(&self) -> BTreeMap<String, (usize, usize)> {
        let pools = self.0.lock().unwrap_or_else(|e| e.into_inner());
        pools
            .iter()
            .map(|(a, p)| {
                let open = p.iter().map(|c| c.open.load(Ordering::Acquire)).sum();
                (a.clone(), (p.len(), open))
            })
            .collect()
    }

    /// Connections open to each address.
    #[cfg(test)]
    fn connections(&self) -> BTreeMap<String, usize> {
        let pools = self.0.lock().unwrap_or_else(|e| e.into_inner());
        pools.iter().map(|(a, p)| (a.clone(), p.len())).collect()
    }
}

/// Which of connections carrying `loads` calls takes the next: the least busy while
/// it has room, or `None` for a new connection; at [`MOST_CONNECTIONS`], the least
/// busy whatever it carries.
fn pick(loads: &[usize]) -> Option<usize> {
    let (i, load) = loads.iter().enumerate().min_by_key(|(_, l)| **l)?;
    if *load < CALLS_PER_CONNECTION || loads.len() >= MOST_CONNECTIONS {
        Some(i)
    } else {
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn calls_take_the_least_busy_connection_and_a_new_one_when_all_are_full() {
        assert_eq!(pick(&[]), None, "the first call opens the first connection");
        assert_eq!(pick(&[3, 1, 2]), Some(1));
        assert_eq!(pick(&[CALLS_PER_CONNECTION, CALLS_PER_CONNECTION]), None);
        assert_eq!(
            pick(&[CALLS_PER_CONNECTION, CALLS_PER_CONNECTION - 1]),
            Some(1)
        );
        let full = vec![CALLS_PER_CONNECTION * 3; MOST_CONNECTIONS];
        assert!(pick(&full).is_some(), "no more than the most connections");
    }

    #[tokio::test]
    async fn a_place_is_given_back_when_its_call_ends() {
        let pools = Pools::default();
        let endpoint = tonic::transport::Endpoint::from_static("http://127.0.0.1:1");
        let connect = || Ok::<_, ()>(endpoint.connect_lazy());
        let mut held = Vec::new();
        for _ in 0..CALLS_PER_CONNECTION * 2 + 1 {
            held.push(pools.place("r", connect).unwrap().1);
        }
        assert_eq!(pools.connections()["r"], 3);
        held.truncate(CALLS_PER_CONNECTION);
        // Places given back: the next calls fit on the connections open.
        for _ in 0..CALLS_PER_CONNECTION {
            held.push(pools.place("r", connect).unwrap().1);
        }
        assert_eq!(pools.connections()["r"], 3);
    }
}
