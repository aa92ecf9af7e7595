//! A shared-memory ring port between two threads: one plays the switch (the
//! device side, which creates the port and hands it over on a control
//! socket), the other an application (the driver side, which attaches).
//! The application sends a batch of frames, the switch echoes each one
//! back, and both count their notifications: kicks (driver to device, a
//! VM exit in the paper) and interrupts (device to driver), in each of the
//! paper's notification modes.
//!
//! ```sh
//! cargo run -p ring --example exchange          # base, sc and csb in turn
//! cargo run -p ring --example exchange -- csb   # one mode
//! ```
//!
//! The two sides could as well be two processes: the port is a memfd and
//! two eventfds, which the attach protocol passes as descriptors.

use std::error::Error;
use std::os::fd::AsRawFd;
use std::path::Path;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc};
use std::thread;
use std::time::{Duration, Instant};

use ring::control::{self, AttachRequest, Listener, Request};
use ring::device::{DevicePort, FrameRef};
use ring::Mode;

/// Frames the application sends (and gets back).
const FRAMES: usize = 1024;
/// Most frames per send call.
const BATCH: usize = 32;
/// Gives up on anything that should have happened by then.
const PATIENCE: Duration = Duration::from_secs(10);

type AnyError = Box<dyn Error + Send + Sync>;

/// Frame `k`: 60 to 123 bytes of a pattern. The ring carries any bytes; the
/// switch would forward Ethernet frames.
fn frame(k: usize, b: &mut [u8]) -> usize {
    let len = 60 + k % 64;
    for (j, x) in b[..len].iter_mut().enumerate() {
        *x = (k * 7 + j) as u8;
    }
    len
}

/// What the switch's side counted.
#[derive(Debug)]
struct DeviceCounts {
    kicks: u64,
    irqs: u64,
    echoed: u64,
    dropped: u64,
}

fn main() -> Result<(), AnyError> {
    let modes: Vec<Mode> = match std::env::args().nth(1) {
        Some(m) => vec![m.parse::<Mode>().map_err(|e| e.to_string())?],
        None => vec![Mode::Base, Mode::Sc, Mode::Csb],
    };
    println!("{FRAMES} frames each way, at most {BATCH} per send:");
    println!("mode  driver kicks  driver irqs  device kicks  device irqs");
    for mode in modes {
        exchange(mode)?;
    }
    Ok(())
}

/// One run: start the switch thread, attach, send, check the echoes.
fn exchange(mode: Mode) -> Result<(), AnyError> {
    let path =
        std::env::temp_dir().join(format!("ring-example-{}-{mode}.sock", std::process::id()));
    let stop = Arc::new(AtomicBool::new(false));
    let (ready_tx, ready) = mpsc::channel();
    let switch = {
        let (path, stop) = (path.clone(), stop.clone());
        thread::spawn(move || switch(&path, ready_tx, &stop))
    };
    // The switch listens once its socket exists.
    ready
        .recv_timeout(PATIENCE)
        .map_err(|_| "the switch did not start")?;

    // The application's side: ask for a port, get its driver.
    let req = AttachRequest {
        name: format!("app-{mode}"),
        mode,
        itr: 0,
        slots: 256,
        buf_size: 2048,
        mac: None,
    };
    let mut port = control::attach(&path, &req)?;
    let drv = &mut port.driver;

    let mut sent = 0;
    let mut got: Vec<Vec<u8>> = Vec::with_capacity(FRAMES);
    let end = Instant::now() + PATIENCE;
    while got.len() < FRAMES {
        if Instant::now() > end {
            return Err(format!("{mode}: {} of {FRAMES} frames came back", got.len()).into());
        }
        if sent < FRAMES {
            let base = sent;
            sent += drv.send(BATCH.min(FRAMES - sent), |k, b| frame(base + k, b));
        }
        if drv.recv(usize::MAX, |f| got.push(f.to_vec())) == 0 {
            // Nothing back yet: sleep until the switch interrupts.
            drv.wait_rx(Duration::from_millis(10));
        }
    }
    let drv_stats = drv.stats;
    drop(port); // detaches: closes the control connection
    stop.store(true, Ordering::Release);
    let dev = switch.join().map_err(|_| "the switch panicked")??;
    let _ = std::fs::remove_file(&path);

    println!(
        "{:<4}  {:>12}  {:>11}  {:>12}  {:>11}",
        mode.to_string(),
        drv_stats.kicks,
        drv_stats.irqs,
        dev.kicks,
        dev.irqs
    );
    for (k, f) in got.iter().enumerate() {
        let mut want = [0u8; 2048];
        let len = frame(k, &mut want);
        assert_eq!(&f[..], &want[..len], "{mode}: frame {k} came back changed");
    }
    assert_eq!((dev.echoed, dev.dropped), (FRAMES as u64, 0));
    assert_eq!(drv_stats.tx, FRAMES as u64);
    match mode {
        // A register write per frame, so a kick per frame at least.
        Mode::Base => assert!(drv_stats.kicks >= FRAMES as u64),
        // Kicks only when the switch has said it sleeps.
        Mode::Csb => assert!(
            drv_stats.kicks < FRAMES as u64 / 4,
            "{} kicks in CSB mode",
            drv_stats.kicks
        ),
        Mode::Sc => {}
    }
    Ok(())
}

/// The switch's side: listen, create the port asked for, hand it over,
/// then echo every frame the driver sends until told to stop.
fn switch(
    path: &Path,
    ready: mpsc::Sender<()>,
    stop: &AtomicBool,
) -> Result<DeviceCounts, AnyError> {
    let listener = Listener::bind(path)?;
    let _ = ready.send(());
    let conn = until(|| Ok(listener.accept()))?;
    // Accepted connections are non-blocking (a switch serves many from
    // one event loop): wait for the request.
    let (msg, _) = until(|| match conn.recv() {
        Err(ring::Error::Sys { source, .. }) if source.kind() == std::io::ErrorKind::WouldBlock => {
            Ok(None)
        }
        Ok(None) => Err("the application hung up".into()),
        other => Ok(other?),
    })?;
    let Request::Attach(req) = serde_json::from_slice(&msg)? else {
        return Err("expected an attach request".into());
    };
    let mut dev = DevicePort::create(&req.name, req.geometry(), req.mode, req.itr)?;
    // The reply carries the port: its memory, its kick and its interrupt.
    let fds = dev.driver_fds()?;
    let reply = serde_json::json!({"ok": true, "name": req.name});
    conn.send(
        reply.to_string().as_bytes(),
        &fds.each_ref().map(|f| f.as_raw_fd()),
    )?;
    drop(fds);

    let mut frames: Vec<FrameRef> = Vec::new();
    while !stop.load(Ordering::Acquire) {
        // In the register modes a kick is when the device learns the
        // driver's counters; with a CSB it reads them on every poll.
        dev.on_kick();
        let waiting = dev.poll();
        let room = dev.rx_space();
        if waiting > 0 && room > 0 {
            frames.clear();
            let taken = dev.tx_peek(waiting.min(room), &mut frames);
            // SAFETY: tx_peek checked that each frame lies inside the port's
            // buffers, which `dev` keeps mapped; the driver does not reuse
            // them before tx_complete below.
            let (echoed, _bytes) = unsafe { dev.rx_push_batch(&frames) };
            assert_eq!(echoed, frames.len(), "room was checked");
            let now = Instant::now();
            dev.rx_publish(now);
            dev.tx_complete(taken, frames.len() as u64, now);
            continue;
        }
        if waiting > 0 {
            // Every receive slot is taken: the driver is reading them.
            thread::yield_now();
            continue;
        }
        // Idle: sleep until kicked. With a CSB the device first says it
        // sleeps (or finds work and stays awake), so that the driver kicks.
        if dev.prepare_sleep() {
            wait_readable(&dev, Duration::from_millis(10));
            dev.wake();
        }
    }
    if let Some(why) = dev.broken() {
        return Err(format!("the port broke: {why}").into());
    }
    Ok(DeviceCounts {
        kicks: dev.stats.kicks.load(Relaxed),
        irqs: dev.stats.irqs.load(Relaxed),
        echoed: dev.stats.rx_frames.load(Relaxed),
        dropped: dev.stats.rx_full.load(Relaxed),
    })
}

/// Sleeps until the port's kick eventfd is readable, without reading it:
/// `on_kick` must consume the kick, because in the register modes that is
/// when the device reads the driver's counters.
fn wait_readable(dev: &DevicePort, timeout: Duration) {
    use rustix::event::{poll, PollFd, PollFlags, Timespec};
    let t = Timespec {
        tv_sec: i64::try_from(timeout.as_secs()).unwrap_or(i64::MAX),
        tv_nsec: i64::from(timeout.subsec_nanos()),
    };
    let _ = poll(&mut [PollFd::new(dev.kick_fd(), PollFlags::IN)], Some(&t));
}

/// Calls `f` every millisecond until it has something, for at most
/// [`PATIENCE`].
fn until<T>(mut f: impl FnMut() -> Result<Option<T>, AnyError>) -> Result<T, AnyError> {
    let end = Instant::now() + PATIENCE;
    loop {
        if let Some(v) = f()? {
            return Ok(v);
        }
        if Instant::now() > end {
            return Err("timed out".into());
        }
        thread::sleep(Duration::from_millis(1));
    }
}
