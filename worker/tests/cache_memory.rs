//! The record cache charges what its entries really cost, so `memory.recordCache` bounds the
//! memory the cache really holds: measured here with a counting allocator (this test binary's
//! own), for small and larger entries, hashed and ordered, dirty and flushed.

use eddy_crds::Format;
use eddy_worker::cache::{Backend, StoreState};
use eddy_worker::store::MemoryStore;
use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicIsize, Ordering};

/// Bytes of live allocations, plus glibc's 16-byte header for each.
static LIVE: AtomicIsize = AtomicIsize::new(0);
const HEADER: isize = 16;

struct Counting;

// SAFETY: every call goes to the system allocator unchanged; only a counter is kept beside.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, l: Layout) -> *mut u8 {
        LIVE.fetch_add(l.size() as isize + HEADER, Ordering::Relaxed);
        // SAFETY: the caller's layout, passed on.
        unsafe { System.alloc(l) }
    }

    unsafe fn dealloc(&self, p: *mut u8, l: Layout) {
        LIVE.fetch_sub(l.size() as isize + HEADER, Ordering::Relaxed);
        // SAFETY: allocated by `alloc` above with this layout.
        unsafe { System.dealloc(p, l) }
    }

    unsafe fn realloc(&self, p: *mut u8, l: Layout, new: usize) -> *mut u8 {
        LIVE.fetch_add(new as isize - l.size() as isize, Ordering::Relaxed);
        // SAFETY: as for `dealloc`.
        unsafe { System.realloc(p, l, new) }
    }
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

#[test]
fn cached_entries_cost_no_more_than_the_cache_charges() {
    for ordered in [false, true] {
        for (key_len, value_len) in [(8, 8), (24, 8), (40, 200)] {
            let before = LIVE.load(Ordering::Relaxed);
            let mut s = StoreState::new(
                "s",
                "app-s-changelog".into(),
                Backend::Memory(MemoryStore::default()),
                Format::Bytes,
                Format::Bytes,
            );
            if ordered {
                s.keep_order();
            }
            let mut worst = 0;
            for i in 0..200_000u64 {
                let mut key = vec![b'k'; key_len];
                key[..8].copy_from_slice(&i.to_be_bytes());
                s.put(&key, Some(vec![1; value_len]), 0);
                if i % 10_000 == 9_999 {
                    worst = worst.max(LIVE.load(Ordering::Relaxed) - before);
                }
            }
            // Flushed, not yet committed: the entries stay, the dirty list becomes the flushed.
            drop(s.take_dirty());
            let used = worst.max(LIVE.load(Ordering::Relaxed) - before);
            let charged = s.bytes() as isize;
            assert!(
                used <= charged,
                "ordered {ordered}, {key_len}-byte keys, {value_len}-byte values: the cache holds {used} bytes but charges {charged}"
            );
            // Not wildly over either, or the cache would hold far fewer entries than it could.
            assert!(
                used * 2 > charged,
                "ordered {ordered}, {key_len}-byte keys, {value_len}-byte values: charges {charged} bytes for {used}"
            );
        }
    }
}
