//! The region's byte layout and the validation of its header.
//!
//! ```text
//! offset 0                 Header (HEADER_SIZE = 4096 bytes, one page)
//! offset 4096              ProcEntry × process_slots (256 bytes each)
//! offset object_offset     the object's state (object_size bytes)
//! total_size               object_offset + object_size, rounded up to 4096
//! ```
//!
//! The header holds only fixed-size integers at fixed offsets ([`RawHeader`]
//! is `repr(C)` and its size is asserted at compile time). Every field except
//! `ready` is written once, by the initialiser, under an exclusive `flock`,
//! and never changes afterwards; a checksum over those immutable fields lets
//! a reader detect a scribbled header. `ready` is written last.
//!
//! [`decode_and_validate`] turns header bytes into a [`HeaderInfo`] or into an
//! error that names the bad value and the limit; nothing read from a region
//! is trusted before it passes through here.

use serde::Serialize;

use crate::error::{Error, Result};

/// `b"SHMSCHED"` read as a little-endian u64.
pub const MAGIC: u64 = u64::from_le_bytes(*b"SHMSCHED");
/// The layout version this build reads and writes.
pub const LAYOUT_VERSION: u32 = 2;
/// Size of the header page.
pub const HEADER_SIZE: u32 = 4096;
/// Size of one process-table entry (its type's size: 256 bytes, asserted
/// in `proc_table.rs`; larger under the model checker).
pub const PROC_ENTRY_SIZE: u64 = std::mem::size_of::<super::proc_table::ProcEntry>() as u64;
/// Upper bound on `process_slots`.
pub const MAX_PROCESS_SLOTS: u32 = 4096;
/// Upper bound on an object's size (1 GiB).
pub const MAX_OBJECT_SIZE: u64 = 1 << 30;
/// Value of the `ready` word once initialisation has completed ("REDY").
pub const READY: u32 = u32::from_le_bytes(*b"REDY");
/// Byte offset of the `ready` word in the header.
pub const READY_OFFSET: usize = 152;
/// Byte offset of the checksum; the checksum covers bytes `0..CHECKSUM_OFFSET`.
pub const CHECKSUM_OFFSET: usize = 144;

const PAGE: u64 = 4096;

/// What kind of object a region holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
#[repr(u32)]
pub enum ObjectKind {
    /// A concurrency [`Scheduler`](crate::scheduler).
    Scheduler = 1,
    /// A token-bucket limiter.
    Limiter = 2,
    /// A fair-share ledger.
    FairShare = 3,
}

impl ObjectKind {
    /// The kind stored as `raw`, if it is one this build knows.
    pub fn from_u32(raw: u32) -> Option<ObjectKind> {
        match raw {
            1 => Some(ObjectKind::Scheduler),
            2 => Some(ObjectKind::Limiter),
            3 => Some(ObjectKind::FairShare),
            _ => None,
        }
    }

    /// A lower-case name for messages and the CLI.
    pub fn name(self) -> &'static str {
        match self {
            ObjectKind::Scheduler => "scheduler",
            ObjectKind::Limiter => "limiter",
            ObjectKind::FairShare => "fair-share",
        }
    }
}

/// The header as it lies in the region (native endianness; a region is
/// shared by processes of one host only).
///
/// Written by the initialiser under an exclusive `flock`; immutable after
/// `ready` is set, except by scribblers, which validation catches.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct RawHeader {
    /// [`MAGIC`].
    pub magic: u64,
    /// [`LAYOUT_VERSION`].
    pub layout_version: u32,
    /// [`ObjectKind`] as u32.
    pub kind: u32,
    /// [`HEADER_SIZE`].
    pub header_size: u32,
    /// Number of process-table entries.
    pub process_slots: u32,
    /// Offset of the process table (= `header_size`).
    pub proc_table_offset: u64,
    /// Offset of the object area (128-byte aligned).
    pub object_offset: u64,
    /// Size of the object area as the object asked for it.
    pub object_size: u64,
    /// Size of the whole file.
    pub total_size: u64,
    /// The object's parameters (for example its `max`).
    pub params: [u64; 8],
    /// `CLOCK_MONOTONIC` at creation, in ns.
    pub clock_epoch_ns: u64,
    /// Wall-clock creation time, ms since the Unix epoch.
    pub created_at_unix_ms: u64,
    /// Pid of the initialising process (informational only).
    pub created_pid: i32,
    /// Zero.
    pub _pad0: u32,
    /// FNV-1a 64 of bytes `0..CHECKSUM_OFFSET`.
    pub checksum: u64,
    /// [`READY`] once initialised; written last with Release ordering.
    pub ready: u32,
    /// Zero.
    pub _pad1: u32,
}

const _: () = assert!(std::mem::size_of::<RawHeader>() == 160);
const _: () = assert!(std::mem::size_of::<RawHeader>() <= HEADER_SIZE as usize);
const _: () = assert!(std::mem::align_of::<RawHeader>() == 8);

/// The validated, immutable part of a region's header.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct HeaderInfo {
    /// The object kind.
    pub kind: ObjectKind,
    /// Layout version.
    pub layout_version: u32,
    /// Header size in bytes.
    pub header_size: u32,
    /// Number of process-table entries.
    pub process_slots: u32,
    /// Offset of the process table.
    pub proc_table_offset: u64,
    /// Offset of the object area.
    pub object_offset: u64,
    /// Size of the object area.
    pub object_size: u64,
    /// Size of the whole region file.
    pub total_size: u64,
    /// The object's parameters.
    pub params: [u64; 8],
    /// `CLOCK_MONOTONIC` at creation (ns).
    pub clock_epoch_ns: u64,
    /// Wall-clock creation time (ms since the Unix epoch).
    pub created_at_unix_ms: u64,
    /// Pid of the creating process (informational; pids are not trusted).
    pub created_pid: i32,
}

/// `(object_offset, total_size)` for a region with these sizes, or an error
/// naming the value that is out of range.
pub fn compute_layout(process_slots: u32, object_size: u64) -> Result<(u64, u64)> {
    if process_slots == 0 || process_slots > MAX_PROCESS_SLOTS {
        return Err(Error::InvalidArgument(format!(
            "process_slots {process_slots} out of range 1..={MAX_PROCESS_SLOTS}"
        )));
    }
    if object_size > MAX_OBJECT_SIZE {
        return Err(Error::InvalidArgument(format!(
            "object size {object_size} exceeds the limit of {MAX_OBJECT_SIZE} bytes"
        )));
    }
    let object_offset = u64::from(HEADER_SIZE) + u64::from(process_slots) * PROC_ENTRY_SIZE;
    let end = object_offset + object_size;
    let total = end.div_ceil(PAGE) * PAGE;
    Ok((object_offset, total))
}

/// FNV-1a, 64-bit. Not cryptographic: it detects scribbles, not attackers
/// (who have write access to the region anyway).
pub fn fnv1a64(bytes: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for &b in bytes {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h
}

/// Serialises a header (with its checksum filled in and `ready` as given).
pub fn encode(info: &HeaderInfo, ready: u32) -> [u8; std::mem::size_of::<RawHeader>()] {
    let raw = RawHeader {
        magic: MAGIC,
        layout_version: info.layout_version,
        kind: info.kind as u32,
        header_size: info.header_size,
        process_slots: info.process_slots,
        proc_table_offset: info.proc_table_offset,
        object_offset: info.object_offset,
        object_size: info.object_size,
        total_size: info.total_size,
        params: info.params,
        clock_epoch_ns: info.clock_epoch_ns,
        created_at_unix_ms: info.created_at_unix_ms,
        created_pid: info.created_pid,
        _pad0: 0,
        checksum: 0,
        ready,
        _pad1: 0,
    };
    let mut buf = [0u8; std::mem::size_of::<RawHeader>()];
    // SAFETY: `buf` is exactly `size_of::<RawHeader>()` bytes; write_unaligned
    // has no alignment requirement, and RawHeader is Copy with no drop glue.
    unsafe { std::ptr::write_unaligned(buf.as_mut_ptr().cast::<RawHeader>(), raw) };
    let sum = fnv1a64(&buf[..CHECKSUM_OFFSET]);
    buf[CHECKSUM_OFFSET..CHECKSUM_OFFSET + 8].copy_from_slice(&sum.to_ne_bytes());
    buf
}

/// Reads a [`RawHeader`] out of at least `size_of::<RawHeader>()` bytes.
pub fn raw_from_bytes(bytes: &[u8; std::mem::size_of::<RawHeader>()]) -> RawHeader {
    // SAFETY: the array is exactly the size of RawHeader, read_unaligned needs
    // no alignment, and every bit pattern is a valid RawHeader (all fields are
    // plain integers).
    unsafe { std::ptr::read_unaligned(bytes.as_ptr().cast::<RawHeader>()) }
}

/// What the header bytes say about the region's state.
#[derive(Debug)]
pub enum HeaderState {
    /// Empty, or an initialiser died half-way (our magic without the ready
    /// mark): safe to (re)initialise under the exclusive lock, provided no
    /// live process is registered in it.
    Uninitialised,
    /// Initialised and valid.
    Ready(HeaderInfo),
}

/// Validates header bytes read from a file of `file_size` bytes.
///
/// Header bytes carrying our magic without the ready mark (an initialiser
/// died) are [`HeaderState::Uninitialised`]. Anything else that fails
/// validation is an error, all-zero bytes included: a foreign file is never
/// overwritten. (An empty file has no header bytes; the caller treats it as
/// uninitialised.)
pub fn decode_and_validate(
    bytes: &[u8; std::mem::size_of::<RawHeader>()],
    file_size: u64,
) -> Result<HeaderState> {
    let raw = raw_from_bytes(bytes);
    if raw.magic != MAGIC {
        return Err(Error::BadRegion(format!(
            "bad magic {:#018x} (expected {MAGIC:#018x}, \"SHMSCHED\"): not a shmsched region",
            raw.magic
        )));
    }
    if raw.ready != READY {
        return Ok(HeaderState::Uninitialised);
    }
    if raw.layout_version != LAYOUT_VERSION {
        return Err(Error::VersionMismatch {
            found: raw.layout_version,
            expected: LAYOUT_VERSION,
        });
    }
    if raw.header_size != HEADER_SIZE {
        return Err(Error::BadRegion(format!(
            "header size {} but the layout fixes it at {HEADER_SIZE}",
            raw.header_size
        )));
    }
    if raw.process_slots == 0 || raw.process_slots > MAX_PROCESS_SLOTS {
        return Err(Error::BadRegion(format!(
            "process_slots {} out of range 1..={MAX_PROCESS_SLOTS}",
            raw.process_slots
        )));
    }
    if raw.object_size > MAX_OBJECT_SIZE {
        return Err(Error::BadRegion(format!(
            "object size {} exceeds the limit of {MAX_OBJECT_SIZE} bytes",
            raw.object_size
        )));
    }
    if raw.proc_table_offset != u64::from(HEADER_SIZE) {
        return Err(Error::BadRegion(format!(
            "process table offset {} but the layout puts it at {HEADER_SIZE}",
            raw.proc_table_offset
        )));
    }
    let (object_offset, total) = compute_layout(raw.process_slots, raw.object_size)
        .map_err(|e| Error::BadRegion(e.to_string()))?;
    if raw.object_offset != object_offset {
        return Err(Error::BadRegion(format!(
            "object offset {} but {} process slots put it at {object_offset}",
            raw.object_offset, raw.process_slots
        )));
    }
    if raw.total_size != total {
        return Err(Error::BadRegion(format!(
            "total size {} but the layout computes {total}",
            raw.total_size
        )));
    }
    let sum = fnv1a64(&bytes[..CHECKSUM_OFFSET]);
    if raw.checksum != sum {
        return Err(Error::BadRegion(format!(
            "header checksum {:#018x} does not match the contents ({sum:#018x}): the header was overwritten",
            raw.checksum
        )));
    }
    let kind = ObjectKind::from_u32(raw.kind).ok_or_else(|| {
        Error::BadRegion(format!(
            "unknown object kind {} (known: 1 scheduler, 2 limiter, 3 fair-share)",
            raw.kind
        ))
    })?;
    if file_size != total {
        return Err(Error::BadRegion(format!(
            "region file is {file_size} bytes but its header says {total}"
        )));
    }
    Ok(HeaderState::Ready(HeaderInfo {
        kind,
        layout_version: raw.layout_version,
        header_size: raw.header_size,
        process_slots: raw.process_slots,
        proc_table_offset: raw.proc_table_offset,
        object_offset: raw.object_offset,
        object_size: raw.object_size,
        total_size: raw.total_size,
        params: raw.params,
        clock_epoch_ns: raw.clock_epoch_ns,
        created_at_unix_ms: raw.created_at_unix_ms,
        created_pid: raw.created_pid,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> HeaderInfo {
        let (object_offset, total_size) = compute_layout(4, 200).unwrap();
        HeaderInfo {
            kind: ObjectKind::Scheduler,
            layout_version: LAYOUT_VERSION,
            header_size: HEADER_SIZE,
            process_slots: 4,
            proc_table_offset: HEADER_SIZE.into(),
            object_offset,
            object_size: 200,
            total_size,
            params: [1, 2, 3, 4, 5, 6, 7, 8],
            clock_epoch_ns: 99,
            created_at_unix_ms: 1234,
            created_pid: 42,
        }
    }

    #[test]
    fn field_offsets_are_fixed() {
        let h = RawHeader::default();
        let base = &h as *const RawHeader as usize;
        assert_eq!(&h.ready as *const u32 as usize - base, READY_OFFSET);
        assert_eq!(&h.checksum as *const u64 as usize - base, CHECKSUM_OFFSET);
        assert_eq!(&h.params as *const _ as usize - base, 56);
        assert_eq!(&h.clock_epoch_ns as *const u64 as usize - base, 120);
    }

    #[test]
    fn layout_is_aligned() {
        let (o, t) = compute_layout(128, 1000).unwrap();
        assert_eq!(o, 4096 + 128 * 256);
        assert_eq!(o % 128, 0);
        assert_eq!(t % 4096, 0);
        assert!(t >= o + 1000);
        assert!(compute_layout(0, 1).is_err());
        assert!(compute_layout(4097, 1).is_err());
        assert!(compute_layout(1, MAX_OBJECT_SIZE + 1).is_err());
    }

    #[test]
    fn roundtrip_and_state() {
        let h = sample();
        let b = encode(&h, READY);
        match decode_and_validate(&b, h.total_size).unwrap() {
            HeaderState::Ready(got) => assert_eq!(got, h),
            other => panic!("{other:?}"),
        }
        let b = encode(&h, 0);
        assert!(matches!(
            decode_and_validate(&b, h.total_size).unwrap(),
            HeaderState::Uninitialised
        ));
        // Zeros are not ours: a file of zeros is somebody's data.
        let zero = [0u8; 160];
        let e = decode_and_validate(&zero, 1 << 20).unwrap_err();
        assert!(e.to_string().contains("bad magic"), "{e}");
    }

    #[test]
    fn every_single_byte_scribble_is_detected_or_harmless() {
        let h = sample();
        let good = encode(&h, READY);
        for i in 0..CHECKSUM_OFFSET {
            for v in [0u8, 0xff, 0x5a] {
                let mut b = good;
                if b[i] == v {
                    continue;
                }
                b[i] = v;
                // Must not panic; must not validate as the same header.
                if let Ok(HeaderState::Ready(got)) = decode_and_validate(&b, h.total_size) {
                    panic!("scribble at byte {i} accepted: {got:?}");
                }
            }
        }
    }
}
