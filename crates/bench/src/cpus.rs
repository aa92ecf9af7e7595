//! Where a bench's threads run: pinning a thread, a process or the calling
//! thread to CPUs, and undoing it. Every bench that compares against a
//! peer says where its threads ran, and most place them, so they share
//! these instead of each carrying its own affinity calls.
//!
//! A refusal (a CPU that is not online, a thread that has exited) is
//! answered with `false` or a count, never an error: the bench then runs
//! where the scheduler puts it and its report says so.

use rustix::process::Pid;
use rustix::thread::CpuSet;

/// The set of `cpus`; CPUs beyond what a set can hold are left out.
pub(crate) fn set(cpus: &[usize]) -> CpuSet {
    let mut s = CpuSet::new();
    for &c in cpus.iter().filter(|&&c| c < CpuSet::MAX_CPU) {
        s.set(c);
    }
    s
}

/// The calling thread's CPU set, if the kernel tells it.
pub(crate) fn affinity() -> Option<CpuSet> {
    rustix::thread::sched_getaffinity(None).ok()
}

/// The CPUs the calling thread may run on, in order; none if the kernel
/// does not tell.
pub(crate) fn allowed() -> Vec<usize> {
    affinity()
        .map(|s| (0..CpuSet::MAX_CPU).filter(|&c| s.is_set(c)).collect())
        .unwrap_or_default()
}

/// Sets the calling thread's CPU set to `s`; false if refused.
pub(crate) fn set_affinity(s: &CpuSet) -> bool {
    rustix::thread::sched_setaffinity(None, s).is_ok()
}

/// Pins the calling thread to `cpu`; false if refused.
pub(crate) fn pin_current(cpu: usize) -> bool {
    set_affinity(&set(&[cpu]))
}

/// Pins thread `tid` (`None`: the calling one) to `cpus`; false if
/// refused.
pub(crate) fn pin(tid: Option<Pid>, cpus: &[usize]) -> bool {
    rustix::thread::sched_setaffinity(tid, &set(cpus)).is_ok()
}

/// Pins thread (or process) `tid` to `cpu`; `tid` 0 is the calling
/// thread.
pub(crate) fn pin_tid(tid: i32, cpu: usize) -> bool {
    pin(Pid::from_raw(tid), &[cpu])
}

/// Lets thread `tid` (0: the calling one) run on every CPU again.
pub(crate) fn unpin_tid(tid: i32) -> bool {
    let all: Vec<usize> = (0..CpuSet::MAX_CPU).collect();
    // The kernel keeps the CPUs that exist.
    pin(Pid::from_raw(tid), &all)
}

/// The threads of process `pid` now (`/proc/PID/task`); none if it is
/// gone.
pub(crate) fn threads_of(pid: u32) -> Vec<i32> {
    std::fs::read_dir(format!("/proc/{pid}/task"))
        .map(|d| {
            d.flatten()
                .filter_map(|e| e.file_name().to_str()?.parse::<i32>().ok())
                .collect()
        })
        .unwrap_or_default()
}

/// Pins every thread of process `pid` to `cpus`, each even after one is
/// refused; returns (threads pinned, threads found).
pub(crate) fn pin_process(pid: u32, cpus: &[usize]) -> (usize, usize) {
    let tids = threads_of(pid);
    let pinned = tids
        .iter()
        .filter(|&&t| t > 0 && pin(Pid::from_raw(t), cpus))
        .count();
    (pinned, tids.len())
}

/// Whether every thread of `pid` was pinned to `cpu` ([`pin_process`]),
/// and it had any.
pub(crate) fn pin_whole_process(pid: u32, cpu: usize) -> bool {
    let (pinned, found) = pin_process(pid, &[cpu]);
    found > 0 && pinned == found
}

/// Pins the thread behind `h` to `cpu`; false if refused. (A join handle
/// names a pthread, not a thread id, so this one goes through libc.)
pub(crate) fn pin_thread<T>(h: &std::thread::JoinHandle<T>, cpu: usize) -> bool {
    use std::os::unix::thread::JoinHandleExt;
    if cpu >= libc::CPU_SETSIZE as usize {
        return false;
    }
    // SAFETY: cpu_set_t is plain data; all-zero is the empty set.
    let mut s: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    // SAFETY: CPU_SET writes inside the set: cpu is below CPU_SETSIZE.
    unsafe { libc::CPU_SET(cpu, &mut s) };
    // SAFETY: the thread behind `h` is alive while its handle is not
    // joined; `s` is a live cpu_set_t and the size its size.
    unsafe {
        libc::pthread_setaffinity_np(h.as_pthread_t(), std::mem::size_of::<libc::cpu_set_t>(), &s)
            == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pinning_the_calling_thread_moves_it_and_can_be_undone() {
        let Some(before) = affinity() else {
            panic!("sched_getaffinity refused on this machine");
        };
        let first = (0..CpuSet::MAX_CPU)
            .find(|&c| before.is_set(c))
            .expect("the calling thread may run somewhere");
        let t = std::thread::spawn(move || {
            assert!(pin_current(first));
            let now = affinity().expect("readable");
            let on: Vec<usize> = (0..CpuSet::MAX_CPU).filter(|&c| now.is_set(c)).collect();
            assert_eq!(on, vec![first]);
            assert_eq!(rustix::thread::sched_getcpu(), first);
            assert!(unpin_tid(0));
            let after = affinity().expect("readable");
            assert_eq!(after.count(), before.count(), "every CPU it had, again");
        });
        t.join().expect("the pinned thread");
    }

    #[test]
    fn a_spawned_thread_is_pinned_through_its_handle() {
        let before = affinity().expect("readable");
        let last = (0..CpuSet::MAX_CPU)
            .rev()
            .find(|&c| before.is_set(c))
            .expect("some CPU");
        let (tx, rx) = std::sync::mpsc::channel::<()>();
        let h = std::thread::spawn(move || {
            let _ = rx.recv();
            affinity().map(|s| {
                (0..CpuSet::MAX_CPU)
                    .filter(|&c| s.is_set(c))
                    .collect::<Vec<_>>()
            })
        });
        assert!(pin_thread(&h, last));
        tx.send(()).expect("the thread waits");
        assert_eq!(h.join().expect("joined"), Some(vec![last]));
    }

    #[test]
    fn a_process_is_pinned_thread_by_thread_and_a_gone_one_is_not() {
        let me = std::process::id();
        let before = affinity().expect("readable");
        let cpus: Vec<usize> = (0..CpuSet::MAX_CPU).filter(|&c| before.is_set(c)).collect();
        // Pinning this process to every CPU it may use changes nothing
        // but must reach all of its threads.
        let (pinned, found) = pin_process(me, &cpus);
        assert!(found >= 1);
        assert_eq!(pinned, found);
        // PIDs stop at 2^22 (pid_max's ceiling): this one is no process.
        assert_eq!(pin_process(1 << 23, &cpus), (0, 0));
        assert!(!pin_whole_process(1 << 23, cpus[0]));
    }
}
