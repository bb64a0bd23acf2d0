//! Single-process region behaviour: naming, modes, create/open/remove,
//! anonymous regions, binding, mismatches and corrupt headers.

mod region_util;
use region_util as common;

use std::fs::OpenOptions;
use std::os::unix::fs::FileExt;
use std::sync::Arc;

use common::{spec, unique_name, Cleanup, OBJ_SIZE};
use shmsched::region::{ObjectKind, ObjectSpec, ProcState, Region, RegionOptions};
use shmsched::Error;

#[test]
fn create_open_open_or_create_remove() {
    let name = unique_name("basic");
    let _c = Cleanup(name.clone());
    let r = Region::create(&name).unwrap();
    assert_eq!(
        r.path().unwrap().to_str().unwrap(),
        format!("/dev/shm/shmsched.{name}")
    );
    assert_eq!(r.mode().unwrap(), 0o600);
    assert!(
        r.info().unwrap().is_none(),
        "fresh region is not initialised"
    );

    match Region::create(&name).unwrap_err() {
        Error::Io { op, source, .. } => {
            assert_eq!(op, "create");
            assert_eq!(source.kind(), std::io::ErrorKind::AlreadyExists);
        }
        e => panic!("unexpected {e}"),
    }

    let m = r.bind(ObjectKind::Scheduler, Some(&spec(8))).unwrap();
    let h = m.header();
    assert_eq!(h.kind, ObjectKind::Scheduler);
    assert_eq!(h.params[0], 8);
    assert_eq!(h.process_slots, 128);
    assert_eq!(h.object_size, OBJ_SIZE as u64);
    assert_eq!(h.object_offset % 128, 0);
    assert_eq!(h.created_pid as u32, std::process::id());
    // init ran on the object area
    // SAFETY (test): the object area is OBJ_SIZE >= 16 bytes.
    let word = unsafe { std::ptr::read(m.object_ptr().add(8) as *const u64) };
    assert_eq!(word, 0xabcd_ef01_2345_6789);
    assert_eq!(r.info().unwrap(), Some(h));

    // Binding again through the same Region shares the mapping.
    let m2 = r.bind(ObjectKind::Scheduler, Some(&spec(8))).unwrap();
    assert!(Arc::ptr_eq(&m, &m2));

    // Another opener sees the same header without a spec.
    let o = Region::open(&name).unwrap();
    let mo = o.bind(ObjectKind::Scheduler, None).unwrap();
    assert_eq!(mo.header(), h);
    let oc = Region::open_or_create(&name).unwrap();
    assert_eq!(
        oc.bind(ObjectKind::Scheduler, Some(&spec(8)))
            .unwrap()
            .header(),
        h
    );

    Region::remove(&name).unwrap();
    match Region::open(&name).unwrap_err() {
        Error::Io { source, .. } => assert_eq!(source.kind(), std::io::ErrorKind::NotFound),
        e => panic!("unexpected {e}"),
    }
    // Still usable by those who have it open.
    assert_eq!(m.header(), h);
}

#[test]
fn open_or_create_creates_with_mode() {
    let name = unique_name("ooc");
    let _c = Cleanup(name.clone());
    let r = Region::open_or_create_with(
        &name,
        RegionOptions {
            mode: 0o660,
            process_slots: 3,
        },
    )
    .unwrap();
    assert_eq!(r.mode().unwrap(), 0o660, "umask must not weaken the mode");
    let m = r.bind(ObjectKind::Scheduler, Some(&spec(1))).unwrap();
    assert_eq!(m.process_slots(), 3);
}

#[test]
fn group_mode_and_world_writable_refused() {
    let name = unique_name("mode");
    let _c = Cleanup(name.clone());
    let r = Region::create_with(
        &name,
        RegionOptions {
            mode: 0o640,
            ..Default::default()
        },
    )
    .unwrap();
    assert_eq!(r.mode().unwrap(), 0o640);
    drop(r);
    Region::remove(&name).unwrap();

    for mode in [0o666, 0o602, 0o4600] {
        let e = Region::create_with(
            &name,
            RegionOptions {
                mode,
                ..Default::default()
            },
        )
        .unwrap_err();
        assert!(matches!(e, Error::InvalidArgument(_)), "{mode:o}: {e}");
        assert!(e.to_string().contains(&format!("{mode:o}")), "{e}");
    }
    assert!(
        Region::open(&name).is_err(),
        "refused create must not leave a file"
    );
}

#[test]
fn bad_names_are_refused() {
    for bad in ["", ".", "..", "a\0b"] {
        assert!(matches!(
            Region::create(bad).unwrap_err(),
            Error::InvalidArgument(_)
        ));
    }
    let e = Region::create(&"x".repeat(201)).unwrap_err();
    assert!(matches!(e, Error::InvalidArgument(_)), "{e}");
    let e = Region::create_with(
        &unique_name("slots"),
        RegionOptions {
            process_slots: 0,
            ..Default::default()
        },
    )
    .unwrap_err();
    assert!(e.to_string().contains("process_slots 0"), "{e}");
}

#[test]
fn anonymous_region_binds() {
    let r = Region::anonymous().unwrap();
    assert!(r.path().is_none());
    assert!(r.info().unwrap().is_none());
    let e = r.bind(ObjectKind::Scheduler, None).unwrap_err();
    assert!(
        matches!(&e, Error::BadRegion(m) if m.contains("not initialised")),
        "{e}"
    );
    let m = r.bind(ObjectKind::Scheduler, Some(&spec(4))).unwrap();
    assert_eq!(r.info().unwrap().unwrap(), m.header());
    let me = m.me().unwrap();
    assert_eq!(m.me().unwrap(), me);
    assert!(m.is_alive(me.idx).unwrap());
    let procs = m.live_processes().unwrap();
    assert_eq!(procs.len(), 1);
    assert_eq!(procs[0].idx, me.idx);
    assert_eq!(procs[0].owner, me.owner);
    assert_eq!(procs[0].pid as u32, std::process::id());
    assert!(procs[0].alive);
    assert!(m.proc_entry(m.process_slots()).is_err());
}

#[test]
fn mismatches_name_both_values() {
    let r = Region::anonymous().unwrap();
    r.bind(ObjectKind::Scheduler, Some(&spec(8))).unwrap();

    // Fresh handles (no shared mapping cache) of the same memfd are
    // obtained through a named region instead.
    let name = unique_name("mismatch");
    let _c = Cleanup(name.clone());
    let a = Region::create(&name).unwrap();
    let _ma = a.bind(ObjectKind::Scheduler, Some(&spec(8))).unwrap();

    let e = Region::open(&name)
        .unwrap()
        .bind(ObjectKind::Scheduler, Some(&spec(9)))
        .unwrap_err();
    let msg = e.to_string();
    assert!(matches!(e, Error::Mismatch(_)), "{msg}");
    assert!(msg.contains('8') && msg.contains('9'), "{msg}");

    let e = Region::open(&name)
        .unwrap()
        .bind(ObjectKind::Limiter, None)
        .unwrap_err();
    let msg = e.to_string();
    assert!(
        matches!(
            e,
            Error::WrongKind {
                found: ObjectKind::Scheduler,
                expected: ObjectKind::Limiter
            }
        ),
        "{msg}"
    );
    assert!(
        msg.contains("scheduler") && msg.contains("limiter"),
        "{msg}"
    );

    let other = ObjectSpec {
        object_size: OBJ_SIZE + 8,
        ..spec(8)
    };
    let e = Region::open(&name)
        .unwrap()
        .bind(ObjectKind::Scheduler, Some(&other))
        .unwrap_err();
    let msg = e.to_string();
    assert!(matches!(e, Error::Mismatch(_)), "{msg}");
    assert!(msg.contains("256") && msg.contains("264"), "{msg}");

    // The same handle with a mismatching spec also fails (cached mapping).
    assert!(matches!(
        a.bind(ObjectKind::Scheduler, Some(&spec(1))).unwrap_err(),
        Error::Mismatch(_)
    ));
}

/// Creates an initialised named region, returns (name, cleanup, path).
fn initialised(tag: &str) -> (String, Cleanup, std::path::PathBuf) {
    let name = unique_name(tag);
    let c = Cleanup(name.clone());
    let r = Region::create(&name).unwrap();
    r.bind(ObjectKind::Scheduler, Some(&spec(8))).unwrap();
    let p = r.path().unwrap().to_path_buf();
    (name, c, p)
}

fn scribble(path: &std::path::Path, offset: u64, bytes: &[u8]) {
    let f = OpenOptions::new().write(true).open(path).unwrap();
    f.write_all_at(bytes, offset).unwrap();
}

/// Binds a fresh handle both with and without a spec, and `info()`; all must
/// fail with BadRegion containing every needle.
fn expect_bad(name: &str, needles: &[&str]) {
    for e in [
        Region::open(name)
            .unwrap()
            .bind(ObjectKind::Scheduler, Some(&spec(8)))
            .unwrap_err(),
        Region::open(name)
            .unwrap()
            .bind(ObjectKind::Scheduler, None)
            .unwrap_err(),
        Region::open(name).unwrap().info().unwrap_err(),
    ] {
        let msg = e.to_string();
        let version = needles[0].starts_with("layout version");
        assert!(
            matches!(e, Error::BadRegion(_)) != version
                && matches!(e, Error::VersionMismatch { .. }) == version,
            "{msg}"
        );
        for n in needles {
            assert!(msg.contains(n), "{msg:?} lacks {n:?}");
        }
    }
}

#[test]
fn corrupt_headers_are_clear_errors() {
    // magic
    let (name, _c, p) = initialised("magic");
    scribble(&p, 0, b"NOTOURS!");
    expect_bad(&name, &["bad magic", "not a shmsched region"]);

    // layout version (offset 8)
    let (name, _c, p) = initialised("version");
    scribble(&p, 8, &7u32.to_ne_bytes());
    expect_bad(&name, &["layout version 7", "version 2"]);

    // process_slots (offset 20): 0 and 5000
    let (name, _c, p) = initialised("slots0");
    scribble(&p, 20, &0u32.to_ne_bytes());
    expect_bad(&name, &["process_slots 0", "1..=4096"]);
    let (name, _c, p) = initialised("slots5000");
    scribble(&p, 20, &5000u32.to_ne_bytes());
    expect_bad(&name, &["process_slots 5000", "4096"]);

    // process_slots changed to another legal value: offsets no longer match
    let (name, _c, p) = initialised("slots7");
    scribble(&p, 20, &7u32.to_ne_bytes());
    expect_bad(&name, &["object offset", "7 process slots"]);

    // object offset (offset 32)
    let (name, _c, p) = initialised("objoff");
    scribble(&p, 32, &12345u64.to_ne_bytes());
    expect_bad(&name, &["object offset 12345"]);

    // total size (offset 48)
    let (name, _c, p) = initialised("total");
    scribble(&p, 48, &(1u64 << 40).to_ne_bytes());
    expect_bad(&name, &["total size 1099511627776"]);

    // a parameter (offset 56): only the checksum can tell
    let (name, _c, p) = initialised("checksum");
    scribble(&p, 56, &9u64.to_ne_bytes());
    expect_bad(&name, &["checksum"]);

    // kind (offset 12): caught by the checksum too
    let (name, _c, p) = initialised("kind");
    scribble(&p, 12, &99u32.to_ne_bytes());
    expect_bad(&name, &["checksum"]);

    // truncated file
    let (name, _c, p) = initialised("trunc");
    let total = std::fs::metadata(&p).unwrap().len();
    OpenOptions::new()
        .write(true)
        .open(&p)
        .unwrap()
        .set_len(total - 4096)
        .unwrap();
    expect_bad(&name, &[&format!("{}", total - 4096), &format!("{total}")]);
    // truncated into the header
    OpenOptions::new()
        .write(true)
        .open(&p)
        .unwrap()
        .set_len(100)
        .unwrap();
    let e = Region::open(&name)
        .unwrap()
        .bind(ObjectKind::Scheduler, None)
        .unwrap_err();
    assert!(matches!(e, Error::BadRegion(_)), "{e}");
}

#[test]
fn foreign_file_is_never_overwritten() {
    let dir = std::env::temp_dir().join(unique_name("foreign"));
    std::fs::write(&dir, b"precious data, not a region").unwrap();
    let path = dir.to_str().unwrap();
    let e = Region::open_or_create(path)
        .unwrap()
        .bind(ObjectKind::Scheduler, Some(&spec(8)))
        .unwrap_err();
    assert!(
        matches!(&e, Error::BadRegion(m) if m.contains("bad magic")),
        "{e}"
    );
    assert_eq!(std::fs::read(&dir).unwrap(), b"precious data, not a region");
    std::fs::remove_file(&dir).unwrap();
}

#[test]
fn scribbled_process_entries_are_errors() {
    let (name, _c, p) = initialised("entry");
    let r = Region::open(&name).unwrap();
    let m = r.bind(ObjectKind::Scheduler, None).unwrap();
    let idx = m.process_slots() - 1;
    let entry_off = m.header().proc_table_offset + u64::from(idx) * 256;
    scribble(&p, entry_off, &77u32.to_ne_bytes());
    assert_eq!(m.proc_entry(idx).unwrap().state_raw(), 77);
    let e = m.proc_entry(idx).unwrap().state(idx).unwrap_err();
    assert!(e.to_string().contains("state 77"), "{e}");
    let e = m.live_processes().unwrap_err();
    assert!(e.to_string().contains("state 77"), "{e}");
    // A reaper repairs it (nobody holds its lock) and reports it.
    let mut released = vec![];
    let e = m.reap_dead(&mut |i, o| released.push((i, o))).unwrap_err();
    assert!(e.to_string().contains("state 77"), "{e}");
    assert_eq!(released.len(), 1);
    assert_eq!(released[0].0, idx);
    assert_eq!(
        m.proc_entry(idx).unwrap().state(idx).unwrap(),
        ProcState::Free
    );
    assert!(m.live_processes().unwrap().is_empty());
    let e = m.proc_entry(m.process_slots()).unwrap_err();
    assert!(e.to_string().contains("out of range"), "{e}");
}

#[test]
fn deregister_frees_and_reregister_gets_new_owner() {
    let r = Region::anonymous_with(RegionOptions {
        process_slots: 1,
        ..Default::default()
    })
    .unwrap();
    let m = r.bind(ObjectKind::Scheduler, Some(&spec(1))).unwrap();
    let a = m.me().unwrap();
    assert_eq!(a.idx, 0);
    m.proc_entry(0).unwrap().obj[3].store(5, std::sync::atomic::Ordering::Relaxed);
    m.deregister().unwrap();
    let e = m.proc_entry(0).unwrap();
    assert_eq!(e.state(0).unwrap(), ProcState::Free);
    assert!(!m.is_alive(0).unwrap());
    let b = m.me().unwrap();
    assert_eq!(b.idx, 0);
    assert_ne!(b.owner, a.owner);
    assert_eq!(b.generation(), a.generation() + 1);
    assert_eq!(e.obj[3].load(std::sync::atomic::Ordering::Relaxed), 0);
    // Nothing to reap: we are alive.
    assert_eq!(
        m.reap_dead(&mut |_, _| panic!("reaped a live process"))
            .unwrap(),
        0
    );
}

#[test]
fn threads_binding_through_separate_handles_agree() {
    // Each handle binds through its own open file description, so flock
    // excludes threads of one process too: one initialisation, one header.
    let name = unique_name("threads");
    let _c = Cleanup(name.clone());
    let barrier = Arc::new(std::sync::Barrier::new(8));
    let handles: Vec<_> = (0..8)
        .map(|_| {
            let (name, barrier) = (name.clone(), barrier.clone());
            std::thread::spawn(move || {
                let r = Region::open_or_create(&name).unwrap();
                barrier.wait();
                let m = r.bind(ObjectKind::Scheduler, Some(&spec(3))).unwrap();
                let id = m.me().unwrap();
                (m, id)
            })
        })
        .collect();
    let got: Vec<_> = handles.into_iter().map(|h| h.join().unwrap()).collect();
    let h0 = got[0].0.header();
    let mut idxs = std::collections::HashSet::new();
    for (m, id) in &got {
        assert_eq!(m.header(), h0);
        assert!(idxs.insert(id.idx), "two handles share entry {}", id.idx);
        assert!(got[0].0.is_alive(id.idx).unwrap());
    }
}
