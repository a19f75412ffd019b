//! Threads that close detached probes in the background.
//!
//! Closing a probe waits in the kernel: a uprobe_multi link for one RCU
//! grace period (about 200 ms here) and the global `dup_mmap_sem`, which
//! every `fork()` on the node needs too; a classic (perf-event) uprobe for
//! grace periods of its own, partly under the kernel's global
//! `event_mutex` (so those parts queue whatever we do), partly not (an RCU
//! tasks-trace grace period when its program goes, on 6.10 and later). So a
//! fixed pool of threads closes fds one at a time (never a thread per
//! detach), each resting as long as its last close took, so forks get
//! through in between; the parts outside the kernel's mutex overlap across
//! the pool. At shutdown they stop resting.

use std::{
    collections::VecDeque,
    os::fd::OwnedFd,
    sync::{
        Arc, Condvar, Mutex, PoisonError,
        atomic::{AtomicBool, AtomicUsize, Ordering},
    },
    time::{Duration, Instant},
};

/// One detach: its fds still open, and the flag set when none is.
struct Job {
    left: AtomicUsize,
    done: Arc<AtomicBool>,
}

#[derive(Default)]
struct Queue {
    fds: VecDeque<(OwnedFd, Arc<Job>)>,
    stop: bool,
}

/// The pool; dropping it lets the threads end once the queue is empty.
pub(super) struct Closer {
    queue: Arc<(Mutex<Queue>, Condvar)>,
    hurry: Arc<AtomicBool>,
    threads: usize,
}

impl Closer {
    /// Starts `threads` closing threads (at least one is tried; without
    /// any, fds close in place).
    pub(super) fn start(threads: usize) -> Closer {
        let queue: Arc<(Mutex<Queue>, Condvar)> = Arc::default();
        let hurry = Arc::new(AtomicBool::new(false));
        let mut started = 0;
        for i in 0..threads.max(1) {
            let (queue, hurry) = (queue.clone(), hurry.clone());
            let spawned = std::thread::Builder::new()
                .name(format!("probe-closer-{i}"))
                .spawn(move || work(&queue, &hurry));
            if spawned.is_ok() {
                started += 1;
            }
        }
        Closer {
            queue,
            hurry,
            threads: started,
        }
    }

    /// Closes `fds` in the background; `done` is set once all are closed
    /// (at once for none).
    pub(super) fn close(&self, fds: Vec<OwnedFd>, done: Arc<AtomicBool>) {
        if fds.is_empty() || self.threads == 0 {
            drop(fds);
            done.store(true, Ordering::Release);
            return;
        }
        let job = Arc::new(Job {
            left: AtomicUsize::new(fds.len()),
            done,
        });
        let (lock, cv) = &*self.queue;
        let mut q = lock.lock().unwrap_or_else(PoisonError::into_inner);
        q.fds.extend(fds.into_iter().map(|fd| (fd, job.clone())));
        drop(q);
        cv.notify_all();
    }

    /// From now on the threads close without resting (shutdown).
    pub(super) fn hurry(&self) {
        self.hurry.store(true, Ordering::Relaxed);
    }
}

impl Drop for Closer {
    fn drop(&mut self) {
        let (lock, cv) = &*self.queue;
        lock.lock().unwrap_or_else(PoisonError::into_inner).stop = true;
        cv.notify_all();
    }
}

fn work(queue: &(Mutex<Queue>, Condvar), hurry: &AtomicBool) {
    let (lock, cv) = queue;
    loop {
        let next = {
            let mut q = lock.lock().unwrap_or_else(PoisonError::into_inner);
            loop {
                if let Some(item) = q.fds.pop_front() {
                    break Some(item);
                }
                if q.stop {
                    break None;
                }
                q = cv.wait(q).unwrap_or_else(PoisonError::into_inner);
            }
        };
        let Some((fd, job)) = next else { return };
        let t = Instant::now();
        drop(fd);
        if job.left.fetch_sub(1, Ordering::AcqRel) == 1 {
            job.done.store(true, Ordering::Release);
        }
        if !hurry.load(Ordering::Relaxed) {
            std::thread::sleep(t.elapsed().max(Duration::from_millis(1)));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_job_is_done_when_its_last_fd_is_closed() {
        let c = Closer::start(3);
        let fds: Vec<OwnedFd> = (0..50)
            .map(|_| std::fs::File::open("/dev/null").unwrap().into())
            .collect();
        let done = Arc::new(AtomicBool::new(false));
        c.hurry();
        c.close(fds, done.clone());
        let t = Instant::now();
        while !done.load(Ordering::Acquire) {
            assert!(t.elapsed() < Duration::from_secs(10), "not closed");
            std::thread::sleep(Duration::from_millis(1));
        }
        let none = Arc::new(AtomicBool::new(false));
        c.close(Vec::new(), none.clone());
        assert!(none.load(Ordering::Acquire));
    }
}
