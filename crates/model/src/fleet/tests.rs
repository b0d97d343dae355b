use super::*;

/// A gate closed by hand, waking what waits on it.
#[derive(Default)]
struct Switch {
    closed: std::sync::atomic::AtomicBool,
    notify: Arc<tokio::sync::Notify>,
}

impl Gate for Switch {
    fn check(&self) -> Result<(), FleetError> {
        if self.closed.load(Ordering::SeqCst) {
            Err(FleetError::Unavailable("closed".into()))
        } else {
            Ok(())
        }
    }
    fn closing(&self) -> Pin<Box<dyn Future<Output = ()> + Send>> {
        let notify = self.notify.clone();
        Box::pin(async move { notify.notified().await })
    }
}

#[tokio::test]
async fn a_gated_watch_ends_with_the_gate_s_error_when_it_closes_while_waiting() {
    let switch = Arc::new(Switch::default());
    let (tx, rx) = futures::channel::mpsc::unbounded::<Result<WatchEvent, FleetError>>();
    let watch = Watch::new(rx, Arc::new(AtomicU64::new(0))).gated(switch.clone());
    let mut watch = Box::pin(watch);
    tx.unbounded_send(Ok(WatchEvent::InitialEventsEnd {
        revision: Revision(1),
        token: String::new(),
    }))
    .unwrap();
    assert!(matches!(
        watch.next().await,
        Some(Ok(WatchEvent::InitialEventsEnd {
            revision: Revision(1),
            ..
        }))
    ));
    // Nothing to read: the watch waits, and is woken by the gate closing.
    let waiting = tokio::spawn(async move {
        let ended = watch.next().await;
        (ended, watch.next().await)
    });
    tokio::task::yield_now().await;
    switch.closed.store(true, Ordering::SeqCst);
    switch.notify.notify_one();
    let (ended, after) = tokio::time::timeout(std::time::Duration::from_secs(10), waiting)
        .await
        .expect("the closing gate wakes the waiting watch")
        .unwrap();
    assert!(matches!(ended, Some(Err(FleetError::Unavailable(_)))));
    assert!(after.is_none(), "nothing after the gate's error");
    drop(tx);
}

#[test]
fn a_histogram_counts_each_duration_in_the_first_bucket_that_holds_it() {
    let mut h = Histogram::default();
    for ms in [0, 1, 3, 3, 20_000] {
        h.observe(Duration::from_millis(ms));
    }
    let buckets = h.buckets();
    assert_eq!(buckets.len(), HISTOGRAM_BOUNDS.len() + 1);
    assert_eq!(buckets[0], (0.0005, 1));
    assert_eq!(buckets[1], (0.001, 1));
    assert_eq!(buckets[3], (0.005, 2));
    assert_eq!(buckets.last(), Some(&(f64::MAX, 1)));
    assert_eq!(h.count(), 5);
    assert!((h.sum - 20.007).abs() < 1e-9);
}
