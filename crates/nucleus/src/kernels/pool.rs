//! A persistent pool of worker threads for data-parallel kernels.
//!
//! [`ThreadPool::run`] hands one closure to every thread (the caller is thread 0) and returns
//! when all have finished. Workers wait for work by spinning briefly and then parking on a
//! condition variable, so back-to-back runs (hundreds per generated token) cost a few
//! microseconds and an idle pool costs nothing. `run` does not allocate.

use std::cell::{Cell, UnsafeCell};
use std::panic::{catch_unwind, resume_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;

/// Spin iterations before a waiting thread yields / parks.
const SPIN: u32 = 1 << 14;

/// The current job: a type-erased pointer to the caller's closure and the function that calls it.
#[derive(Clone, Copy)]
struct Job {
    data: *const (),
    call: unsafe fn(*const (), usize, usize),
}

struct Shared {
    n_threads: usize,
    /// `generation << 16 | next_index`. The caller publishes a job by storing a new generation
    /// with next index 1 (index 0 is the caller's); threads claim the remaining indices by CAS,
    /// so indices whose worker is asleep or descheduled are run by whoever is free (the
    /// caller included) instead of being waited for.
    state: AtomicU64,
    /// The job of the current generation. Written only by the caller holding `run_lock` while
    /// every worker is idle (`remaining == 0`), read by workers after they observe the new
    /// generation (Release/Acquire on `generation`).
    job: UnsafeCell<Job>,
    /// Indices of the current generation that have finished.
    done: AtomicUsize,
    /// Set when a worker's closure panicked during the current generation.
    panicked: AtomicBool,
    shutdown: AtomicBool,
    /// Workers parked (or about to park) on `wake`.
    sleepers: AtomicUsize,
    lock: Mutex<()>,
    wake: Condvar,
    /// Serializes `run` calls from different threads.
    run_lock: Mutex<()>,
}

// SAFETY: `job` is the only non-Sync field; it is written only while no worker reads it (see its
// doc) and the pointer it holds refers to a `Sync` closure.
unsafe impl Sync for Shared {}
// SAFETY: as above; the raw pointer in `job` is only dereferenced during a `run` that keeps the
// closure alive.
unsafe impl Send for Shared {}

thread_local! {
    /// Set on pool worker threads (and on a caller while it runs a job), to run nested `run`
    /// calls inline instead of deadlocking.
    static IN_POOL: Cell<bool> = const { Cell::new(false) };
}

/// A fixed set of `n_threads - 1` worker threads plus the calling thread.
pub struct ThreadPool {
    shared: Arc<Shared>,
    handles: Vec<JoinHandle<()>>,
}

impl ThreadPool {
    /// A pool of `n_threads` threads in total, the caller of [`run`](Self::run) included
    /// (`n_threads` of 0 is treated as 1).
    pub fn new(n_threads: usize) -> ThreadPool {
        let n_threads = n_threads.clamp(1, 0xFFFF);
        unsafe fn noop(_: *const (), _: usize, _: usize) {}
        let shared = Arc::new(Shared {
            n_threads,
            state: AtomicU64::new(0),
            job: UnsafeCell::new(Job {
                data: std::ptr::null(),
                call: noop,
            }),
            done: AtomicUsize::new(0),
            panicked: AtomicBool::new(false),
            shutdown: AtomicBool::new(false),
            sleepers: AtomicUsize::new(0),
            lock: Mutex::new(()),
            wake: Condvar::new(),
            run_lock: Mutex::new(()),
        });
        let handles = (1..n_threads)
            .map(|idx| {
                let s = shared.clone();
                std::thread::Builder::new()
                    .name(format!("nucleus-worker-{idx}"))
                    .spawn(move || worker(s, idx))
                    .expect("failed to spawn a worker thread")
            })
            .collect();
        ThreadPool { shared, handles }
    }

    pub fn n_threads(&self) -> usize {
        self.shared.n_threads
    }

    /// Runs `f(index, n_threads)` once for every index in `0..n_threads` and returns when all
    /// calls have returned. The caller runs index 0; the other indices run on the workers, or
    /// on the caller when a worker has not picked its index up by then (so a descheduled worker
    /// delays nothing it has not started). A panic in any call is re-raised here after
    /// every thread has finished. Calls from several threads at once are serialized; a nested
    /// call from inside `f` runs all indices inline on the current thread.
    pub fn run<F: Fn(usize, usize) + Sync>(&self, f: F) {
        let n = self.shared.n_threads;
        if n == 1 || IN_POOL.with(|c| c.get()) {
            for i in 0..n {
                f(i, n);
            }
            return;
        }
        let s = &*self.shared;
        let _guard = s.run_lock.lock().unwrap_or_else(|e| e.into_inner());

        unsafe fn call<F: Fn(usize, usize) + Sync>(data: *const (), i: usize, n: usize) {
            // SAFETY: `data` is `&F` published by `run`, which does not return before every
            // index has finished, so the reference is live.
            let f = unsafe { &*(data as *const F) };
            f(i, n)
        }
        // SAFETY: no index is running (the previous run waited for all of them, and we hold
        // `run_lock`), so nobody reads `job` while we write it.
        unsafe {
            *s.job.get() = Job {
                data: &f as *const F as *const (),
                call: call::<F>,
            };
        }
        s.panicked.store(false, Ordering::Relaxed);
        s.done.store(0, Ordering::Relaxed);
        let gen = (s.state.load(Ordering::Relaxed) >> 16) + 1;
        // Publish with index 0 taken by us. SeqCst: Release for the job, and ordered before
        // the `sleepers` load below (Dekker-style with the worker's park path).
        s.state.store(gen << 16 | 1, Ordering::SeqCst);
        if s.sleepers.load(Ordering::SeqCst) > 0 {
            let _l = s.lock.lock().unwrap_or_else(|e| e.into_inner());
            s.wake.notify_all();
        }

        IN_POOL.with(|c| c.set(true));
        let mine = catch_unwind(AssertUnwindSafe(|| f(0, n)));
        s.done.fetch_add(1, Ordering::Release);
        // Help with indices no worker has picked up yet.
        claim_and_run(s, gen);
        IN_POOL.with(|c| c.set(false));

        // Wait for the indices other threads are running: they borrow `f` until they count
        // themselves done.
        let mut spins = 0u32;
        while s.done.load(Ordering::Acquire) != n {
            if spins < SPIN {
                std::hint::spin_loop();
                spins += 1;
            } else {
                std::thread::yield_now();
            }
        }
        if let Err(p) = mine {
            resume_unwind(p);
        }
        if s.panicked.load(Ordering::Relaxed) {
            panic!("a ThreadPool worker panicked while running a job");
        }
    }
}

/// Claims and runs indices of generation `gen` until none are left.
fn claim_and_run(s: &Shared, gen: u64) {
    let n = s.n_threads as u64;
    loop {
        let cur = s.state.load(Ordering::Acquire);
        if cur >> 16 != gen || cur & 0xFFFF >= n {
            return;
        }
        if s.state
            .compare_exchange_weak(cur, cur + 1, Ordering::AcqRel, Ordering::Relaxed)
            .is_err()
        {
            continue;
        }
        let idx = (cur & 0xFFFF) as usize;
        // SAFETY: we claimed index `idx` of the current generation, so the caller has written
        // `job` (published by the store our CAS read from) and cannot finish the run, change
        // `job` or drop the closure before we count this index done.
        let job = unsafe { *s.job.get() };
        // SAFETY: `job.data` points to the closure `job.call` was instantiated for.
        let r = catch_unwind(AssertUnwindSafe(|| unsafe {
            (job.call)(job.data, idx, s.n_threads)
        }));
        if r.is_err() {
            s.panicked.store(true, Ordering::Relaxed);
        }
        s.done.fetch_add(1, Ordering::Release);
    }
}

fn worker(s: Arc<Shared>, _idx: usize) {
    IN_POOL.with(|c| c.set(true));
    let mut seen = 0u64;
    loop {
        // Wait for a new generation: spin, then park.
        let mut spins = 0u32;
        let gen = loop {
            let g = s.state.load(Ordering::Acquire) >> 16;
            if g != seen {
                break g;
            }
            if s.shutdown.load(Ordering::Acquire) {
                return;
            }
            if spins < SPIN {
                std::hint::spin_loop();
                spins += 1;
                continue;
            }
            let mut l = s.lock.lock().unwrap_or_else(|e| e.into_inner());
            s.sleepers.fetch_add(1, Ordering::SeqCst);
            // Re-check under the lock after announcing ourselves: either the caller sees
            // `sleepers > 0` and notifies (taking the lock, so after we wait), or we see the
            // new generation here.
            while s.state.load(Ordering::SeqCst) >> 16 == seen && !s.shutdown.load(Ordering::SeqCst)
            {
                l = s.wake.wait(l).unwrap_or_else(|e| e.into_inner());
            }
            s.sleepers.fetch_sub(1, Ordering::SeqCst);
            drop(l);
            spins = 0;
        };
        seen = gen;
        claim_and_run(&s, gen);
    }
}

impl ThreadPool {
    /// `f(a_run, b_run)` for the runs of `items` items, `a_item` elements of `a` and `b_item`
    /// of `b` each (`b` may be empty: every run then gets an empty slice), one run per thread,
    /// each of whole items. What `f` does to an item does not depend on the split when it
    /// treats items alone. (A lock per run, never contended, hands its `a` to the thread that
    /// owns it.)
    pub fn for_runs<A: Send, B: Sync>(
        &self,
        items: usize,
        (a, a_item): (&mut [A], usize),
        (b, b_item): (&[B], usize),
        f: impl Fn(&mut [A], &[B]) + Sync,
    ) {
        assert!(a.len() >= items * a_item && (b.is_empty() || b.len() >= items * b_item));
        let per = items.div_ceil(self.n_threads()).max(1);
        let runs: Vec<std::sync::Mutex<(&mut [A], &[B])>> = a[..items * a_item]
            .chunks_mut(per * a_item)
            .enumerate()
            .map(|(i, run)| {
                let n = run.len() / a_item;
                let b = if b.is_empty() {
                    b
                } else {
                    &b[i * per * b_item..(i * per + n) * b_item]
                };
                std::sync::Mutex::new((run, b))
            })
            .collect();
        self.run(|i, _| {
            if let Some(run) = runs.get(i) {
                let mut run = run.lock().unwrap_or_else(|e| e.into_inner());
                let (a, b) = &mut *run;
                f(a, b);
            }
        });
    }
}

impl Drop for ThreadPool {
    fn drop(&mut self) {
        self.shared.shutdown.store(true, Ordering::SeqCst);
        {
            let _l = self.shared.lock.lock().unwrap_or_else(|e| e.into_inner());
            self.shared.wake.notify_all();
        }
        for h in self.handles.drain(..) {
            let _ = h.join();
        }
    }
}

impl std::fmt::Debug for ThreadPool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ThreadPool")
            .field("n_threads", &self.n_threads())
            .finish()
    }
}

/// Raw output pointer shared by the threads of one product (`matmul`, the interleaved
/// products): each thread writes its own disjoint elements.
#[derive(Clone, Copy)]
pub(crate) struct OutPtr(pub(crate) *mut f32);

impl OutPtr {
    /// Pointer to element `i` (a method, so closures capture the whole `Sync` wrapper).
    #[inline(always)]
    pub(crate) fn at(self, i: usize) -> *mut f32 {
        self.0.wrapping_add(i)
    }
}

// SAFETY: an `OutPtr` is made from a `&mut [f32]` that its product holds for the whole
// `ThreadPool::run`, and the threads of the run write disjoint elements through it.
unsafe impl Send for OutPtr {}
// SAFETY: as above.
unsafe impl Sync for OutPtr {}

#[cfg(test)]
mod tests {
    use super::*;

    fn assert_send_sync<T: Send + Sync>() {}

    #[test]
    fn pool_is_send_sync() {
        assert_send_sync::<ThreadPool>();
    }

    #[test]
    fn runs_every_index_many_times() {
        for n in [1, 2, 3, 4] {
            let pool = ThreadPool::new(n);
            assert_eq!(pool.n_threads(), n);
            let counts: Vec<AtomicUsize> = (0..n).map(|_| AtomicUsize::new(0)).collect();
            let total = AtomicUsize::new(0);
            for r in 0..2000 {
                pool.run(|i, nt| {
                    assert_eq!(nt, n);
                    counts[i].fetch_add(1, Ordering::Relaxed);
                    total.fetch_add(r, Ordering::Relaxed);
                });
            }
            for c in &counts {
                assert_eq!(c.load(Ordering::Relaxed), 2000);
            }
            assert_eq!(total.load(Ordering::Relaxed), n * (0..2000).sum::<usize>());
        }
    }

    #[test]
    fn results_visible_after_run_and_parking_works() {
        let pool = ThreadPool::new(3);
        let mut data = vec![0u64; 3000];
        for round in 0..20u64 {
            let ptr = data.as_mut_ptr() as usize;
            pool.run(|i, n| {
                for j in (i..3000).step_by(n) {
                    // SAFETY (test): each index j is written by exactly one thread.
                    unsafe { *(ptr as *mut u64).add(j) = j as u64 * round };
                }
            });
            assert!(data.iter().enumerate().all(|(j, &v)| v == j as u64 * round));
            if round % 5 == 0 {
                // Let the workers park, then make sure they wake up.
                std::thread::sleep(std::time::Duration::from_millis(30));
            }
        }
    }

    #[test]
    fn worker_panic_propagates_and_pool_survives() {
        let pool = ThreadPool::new(2);
        let r = catch_unwind(AssertUnwindSafe(|| {
            pool.run(|i, _| {
                if i == 1 {
                    panic!("boom in worker");
                }
            })
        }));
        assert!(r.is_err());
        let r = catch_unwind(AssertUnwindSafe(|| {
            pool.run(|i, _| {
                if i == 0 {
                    panic!("boom in caller");
                }
            })
        }));
        assert!(r.is_err());
        let hits = AtomicUsize::new(0);
        pool.run(|_, _| {
            hits.fetch_add(1, Ordering::Relaxed);
        });
        assert_eq!(hits.load(Ordering::Relaxed), 2);
    }

    #[test]
    fn shared_across_threads_and_nested() {
        let pool = Arc::new(ThreadPool::new(2));
        let total = Arc::new(AtomicUsize::new(0));
        let hs: Vec<_> = (0..3)
            .map(|_| {
                let (p, t) = (pool.clone(), total.clone());
                std::thread::spawn(move || {
                    for _ in 0..500 {
                        p.run(|_, _| {
                            t.fetch_add(1, Ordering::Relaxed);
                        });
                    }
                })
            })
            .collect();
        for h in hs {
            h.join().unwrap();
        }
        assert_eq!(total.load(Ordering::Relaxed), 3 * 500 * 2);
        let nested = AtomicUsize::new(0);
        pool.run(|_, _| {
            pool.run(|_, _| {
                nested.fetch_add(1, Ordering::Relaxed);
            });
        });
        assert_eq!(nested.load(Ordering::Relaxed), 4);
    }

    #[test]
    #[ignore]
    fn run_overhead() {
        let pool = ThreadPool::new(2);
        let t = std::time::Instant::now();
        let iters = 100_000;
        for _ in 0..iters {
            pool.run(|_, _| {});
        }
        eprintln!(
            "run overhead: {:.2} us",
            t.elapsed().as_secs_f64() * 1e6 / iters as f64
        );
    }
}
