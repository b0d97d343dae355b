//! The process's memory: its allocator, and the size of the pages it is given.

/// mimalloc: less overhead per small allocation and less fragmentation than the
/// system allocator for an index of millions of small objects. Its version 3: a page
/// that another thread's frees empty is freed by that thread, where version 2 left it
/// resident until the thread that owned it ran again, so the workers of a first sync,
/// once idle, held what the compressing pass freed (at a million pods 0.72 × the pruned
/// JSON once settled instead of 1.45 ×, thirty clusters at rest 171–174 MB instead of
/// 371–464; docs/notes/performance-log.md). Right after a load it serves some allocations exactly
/// a size class in size from the next class up (1.45–1.47 × instead of 1.43 × at a
/// million pods, before the objects settle). A page freed goes back to the system once
/// its purge delay has passed and some thread next frees a page: [`return_freed`] sees
/// that one does. Built (`.cargo/config.toml`) to hold blocks of up to 512 KiB in its
/// arena: a larger one has a mapping of its own, so a zeroed one is never written and a
/// freed one goes back at once (sled's 41 zeroed histograms of 512 KiB, which it never
/// records into, had 2-8 MB resident at random from the arena's reused memory: a server
/// over 15,605 configmaps held 21-24 MB at rest instead of 23-32; docs/notes/performance-log.md).
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// How often [`return_freed`] has the allocator run the purges that are due.
pub const RETURN_EVERY: std::time::Duration = std::time::Duration::from_secs(1);

/// Above mimalloc's largest size class (512 KiB): a block of this size has a page of
/// its own, which freeing it frees at once.
const PAGE_OF_ITS_OWN: usize = 1 << 20;

/// Runs the allocator's delayed purges that are due, once: allocates a block with a
/// page of its own and frees it. mimalloc (version 3) gives a freed page back to the
/// system only after its purge delay (`MIMALLOC_PURGE_DELAY`, 1 s in the image), and
/// runs the purges then due only when some thread next frees or gives up a page; a
/// server at rest, whose probes and scrapes allocate a few small blocks, does neither,
/// so what a first sync freed stayed resident (one simulated cluster of 5,070 pods with
/// its store: 34–44 MB at rest, 24–28 MB with this run every second, 22–23 MB with no
/// delay; docs/notes/performance-log.md).
/// Freeing the block is such a page: the purges due run on this thread, at the cost of
/// one allocation that is never written.
pub fn run_due_purges() {
    drop(std::hint::black_box(Vec::<u8>::with_capacity(
        PAGE_OF_ITS_OWN,
    )));
}

/// Every second ([`RETURN_EVERY`]) until `stop`, runs the allocator's purges that are due
/// ([`run_due_purges`]): memory freed is back with the system within about a purge
/// delay and a second, whether or not anything else runs.
pub async fn return_freed(stop: tokio_util::sync::CancellationToken) {
    let mut every = tokio::time::interval(RETURN_EVERY);
    every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = every.tick() => run_due_purges(),
            () = stop.cancelled() => return,
        }
    }
}

/// Has the kernel give this process (and what it starts) small pages only, unless
/// `MIMALLOC_ALLOW_THP` chooses otherwise. mimalloc asks for transparent huge pages on
/// each 1 GiB region it reserves, so every 2 MiB of it that is touched at all is held
/// whole: a server over 15,000 objects held 82–90 MB instead of 70–74 MB in memory,
/// and 192–213 MB instead of 97–140 MB with its store (docs/notes/performance-log.md). Call first
/// thing in `main`, before threads start. An error (a kernel without the setting)
/// leaves pages as they are.
pub fn small_pages() -> std::io::Result<()> {
    if std::env::var_os("MIMALLOC_ALLOW_THP").is_some() {
        return Ok(());
    }
    #[cfg(target_os = "linux")]
    rustix::thread::disable_transparent_huge_pages(true)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    /// Set in the child process that runs a test alone ([`alone`]).
    #[cfg(target_os = "linux")]
    const ALONE: &str = "FLEETSCOPE_TEST_MEMORY_ALONE";

    /// This process's anonymous resident memory, in bytes.
    #[cfg(target_os = "linux")]
    fn resident_anonymous() -> u64 {
        let status = std::fs::read_to_string("/proc/self/status").expect("/proc/self/status");
        let kib = status
            .lines()
            .find_map(|l| l.strip_prefix("RssAnon:"))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
            .expect("RssAnon in /proc/self/status");
        kib * 1024
    }

    /// Runs the test `name` again, alone in a process of its own with `env` set (other
    /// tests allocating and freeing beside it would move what it measures), and checks
    /// that it passes there. Returns whether this process is that one, which runs it.
    #[cfg(target_os = "linux")]
    fn alone(name: &str, env: &[(&str, &str)]) -> bool {
        if std::env::var_os(ALONE).is_some() {
            return true;
        }
        let out = std::process::Command::new(std::env::current_exe().expect("test binary"))
            .args([name, "--exact", "--test-threads=1", "--nocapture"])
            .env(ALONE, "1")
            .env_remove("MIMALLOC_ARENA_MAX_OBJECT_SIZE")
            .envs(env.iter().copied())
            .output()
            .expect("the test binary runs again");
        assert!(
            out.status.success(),
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        false
    }

    /// Runs the allocator's due purges every 50 ms until this process's anonymous
    /// resident memory satisfies `done`, or `seconds` have passed; returns the last
    /// reading.
    #[cfg(target_os = "linux")]
    fn purge_until(seconds: u64, done: impl Fn(u64) -> bool) -> u64 {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(seconds);
        loop {
            super::run_due_purges();
            std::thread::sleep(std::time::Duration::from_millis(50));
            let now = resident_anonymous();
            if done(now) || std::time::Instant::now() >= deadline {
                return now;
            }
        }
    }

    #[cfg(target_os = "linux")]
    #[test]
    fn what_a_thread_freed_goes_back_once_the_due_purges_run() {
        if !alone(
            "memory::tests::what_a_thread_freed_goes_back_once_the_due_purges_run",
            &[("MIMALLOC_PURGE_DELAY", "1000")],
        ) {
            return;
        }
        const HELD: u64 = 96 << 20;
        let (freed_tx, freed) = std::sync::mpsc::channel::<()>();
        let (end_tx, end) = std::sync::mpsc::channel::<()>();
        // A thread that allocates, writes and frees, then stays (a thread that ends
        // gives its pages up, which runs the purges too).
        let worker = std::thread::spawn(move || {
            let blocks: Vec<Vec<u8>> = (0..HELD / 16384).map(|_| vec![1u8; 16384]).collect();
            drop(std::hint::black_box(blocks));
            freed_tx.send(()).expect("the test waits");
            let _ = end.recv();
        });
        freed.recv().expect("the worker frees");
        let at_free = resident_anonymous();
        // Past the purge delay with no page freed, the memory is still held: what the
        // servers at rest saw, and why the purges are run on purpose.
        std::thread::sleep(std::time::Duration::from_millis(2500));
        let idle = resident_anonymous();
        assert!(
            idle + HELD / 2 > at_free,
            "the allocator gave {} MiB back on its own: run_due_purges is not needed",
            (at_free - idle) >> 20
        );
        let now = purge_until(30, |now| now + HELD / 2 <= at_free);
        assert!(
            now + HELD / 2 <= at_free,
            "{} MiB resident 30 s after the purges ran, {} MiB when freed",
            now >> 20,
            at_free >> 20
        );
        let _ = end_tx.send(());
        worker.join().expect("the worker ends");
    }

    /// The allocator is built to give a block larger than 512 KiB a mapping of its own
    /// (`.cargo/config.toml`): a zeroed one comes from the system and is not written,
    /// where one from the arena's reused memory is cleared page by page.
    #[cfg(target_os = "linux")]
    #[test]
    fn a_zeroed_block_larger_than_half_a_mebibyte_is_never_written() {
        if !alone(
            "memory::tests::a_zeroed_block_larger_than_half_a_mebibyte_is_never_written",
            &[("MIMALLOC_PURGE_DELAY", "100")],
        ) {
            return;
        }
        // sled's histograms: 65,536 counters of 8 bytes each.
        const BLOCK: usize = 512 << 10;
        const COUNT: usize = 64;
        let at_start = resident_anonymous();
        // Memory an arena would reuse before its purge delay has passed: blocks
        // written, then freed.
        let written: Vec<Vec<u8>> = (0..COUNT).map(|_| vec![1u8; BLOCK]).collect();
        drop(std::hint::black_box(written));
        let zeroed: Vec<Vec<u8>> = (0..COUNT).map(|_| vec![0u8; BLOCK]).collect();
        // Whatever was freed goes back within the purge delay (100 ms here); a zeroed
        // block the allocator cleared stays.
        let held = purge_until(10, |now| {
            now.saturating_sub(at_start) < (COUNT * BLOCK / 4) as u64
        })
        .saturating_sub(at_start);
        std::hint::black_box(&zeroed);
        assert!(
            held < (COUNT * BLOCK / 4) as u64,
            "{} MiB of {COUNT} zeroed blocks of 512 KiB stay resident: the allocator cleared \
             them (built without .cargo/config.toml's MI_DEFAULT_ARENA_MAX_OBJECT_SIZE?)",
            held >> 20
        );
    }

    #[cfg(target_os = "linux")]
    #[test]
    fn the_process_is_given_small_pages_only() {
        if std::env::var_os("MIMALLOC_ALLOW_THP").is_some() {
            return;
        }
        super::small_pages().expect("the kernel takes PR_SET_THP_DISABLE");
        assert!(rustix::thread::transparent_huge_pages_are_disabled().unwrap());
    }
}
