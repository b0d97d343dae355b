//! The process's memory: its allocator, and the size of the pages it is given.

/// mimalloc: less overhead per small allocation and less fragmentation than the
/// system allocator for an index of millions of small objects. Its version 3: memory
/// freed into another thread's pages goes back to the system once any thread next
/// works (a request, a probe), where version 2 left it resident until the thread that
/// owned the page ran again, so the workers of a first sync, once idle, held what the
/// compressing pass freed (with a request after it, at a million pods 0.72 ×
/// the pruned JSON once settled instead of 1.45 ×, thirty clusters at rest 171–174 MB
/// instead of 371–464; docs/performance.md). Right after a load it serves some
/// allocations exactly a size class in size from the next class up (1.45–1.47 × instead
/// of 1.43 × at a million pods, before the objects settle), and a small fleet holds a
/// few MB more at rest (5,070 pods with the store: 39–41 MB instead of 31–34).
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// Has the kernel give this process (and what it starts) small pages only, unless
/// `MIMALLOC_ALLOW_THP` chooses otherwise. mimalloc asks for transparent huge pages on
/// each 1 GiB region it reserves, so every 2 MiB of it that is touched at all is held
/// whole: a server over 15,000 objects held 82–90 MB instead of 70–74 MB in memory,
/// and 192–213 MB instead of 97–140 MB with its store (docs/performance.md). Call first
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
