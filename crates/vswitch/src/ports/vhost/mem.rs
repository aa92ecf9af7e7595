//! Guest memory as the frontend shares it: one file descriptor per region,
//! each mapped here, and the two translations the port needs:
//!
//! - guest-physical addresses (what descriptors hold) to our pointers;
//! - the frontend's own virtual addresses (what `SET_VRING_ADDR` holds:
//!   QEMU names the rings by where they lie in *its* address space) to our
//!   pointers.
//!
//! Both refuse any range that does not lie wholly inside one region, and
//! take their own address type ([`GuestAddr`], [`FrontendAddr`]) so that
//! one cannot be passed for the other. What they hand out is a
//! [`GuestSlice`]: a range proven inside one mapping at construction, whose
//! copy methods are the only code that touches guest bytes. They copy
//! (never make a Rust reference into guest memory, which the guest may
//! rewrite at any moment), so a racing guest garbles only its own data.
//!
//! The files are the frontend's, not ours. A file that shrank after we
//! mapped it would turn our next read of the lost pages into SIGBUS, so a
//! region is taken only from a memfd sealed against shrinking
//! (`F_SEAL_SHRINK`, which QEMU's `memory-backend-memfd` sets by default)
//! and at least as long as the region claims, checked with `fstat` while
//! the seal already holds. A memfd on hugetlbfs is refused as well: it can
//! be sealed, but a hole punched in it makes the next touch of those pages
//! need a fresh huge page, and with the pool exhausted that touch is
//! SIGBUS (the port does not recover from SIGBUS; see the module above for
//! what a frontend can still do).

use std::fs::File;
use std::marker::PhantomData;
use std::os::fd::AsFd;
use std::ptr::NonNull;

use memmap2::MmapRaw;

/// The most regions one memory table may hold (QEMU sends at most 8 without
/// `CONFIGURE_MEM_SLOTS`, which is not offered).
pub const MAX_REGIONS: usize = 8;
/// The largest region accepted (1 TiB): beyond it a size is a mistake or an
/// attack on our address space, not a guest.
pub const MAX_REGION_SIZE: u64 = 1 << 40;

/// `statfs`'s `f_type` for hugetlbfs (linux/magic.h).
const HUGETLBFS_MAGIC: u64 = 0x9584_58f6;

/// A guest-physical address: what descriptors hold.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct GuestAddr(pub u64);

/// An address in the frontend's own address space: what `SET_VRING_ADDR`
/// holds (QEMU names the rings by where they lie in its process).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct FrontendAddr(pub u64);

/// `len` bytes of guest memory, proven at construction to lie inside one
/// mapping of the [`GuestMemory`] it borrows (which keeps the mapping for
/// at least as long). The guest may write these bytes at any time, so they
/// are only ever copied, byte for byte, to or from memory the switch owns.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GuestSlice<'a> {
    ptr: NonNull<u8>,
    len: usize,
    _mem: PhantomData<&'a GuestMemory>,
}

impl<'a> GuestSlice<'a> {
    /// Bytes in the slice.
    #[inline]
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the slice holds no byte.
    #[inline]
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The first byte's address in our address space, for a consumer that
    /// reads the bytes later under its own contract (a frame handed to the
    /// switch in place) or for the rings' typed views.
    #[inline]
    pub fn as_ptr(&self) -> *mut u8 {
        self.ptr.as_ptr()
    }

    /// [`GuestSlice::as_ptr`], never null.
    #[inline]
    pub fn as_non_null(&self) -> NonNull<u8> {
        self.ptr
    }

    /// The `len` bytes from `off`, if they lie inside this slice.
    #[inline]
    pub fn sub(&self, off: usize, len: usize) -> Option<GuestSlice<'a>> {
        if off > self.len || len > self.len - off {
            return None;
        }
        Some(GuestSlice {
            // SAFETY: off <= self.len: at most one past the end of the
            // range this slice was proven to cover.
            ptr: unsafe { self.ptr.add(off) },
            len,
            _mem: PhantomData,
        })
    }

    /// Copy `dst.len()` bytes from offset `off` into `dst`; false (nothing
    /// copied) if they do not lie inside the slice.
    #[inline]
    pub fn read_into(&self, off: usize, dst: &mut [u8]) -> bool {
        let Some(src) = self.sub(off, dst.len()) else {
            return false;
        };
        // SAFETY: `src` lies inside a mapping that lives as long as the
        // borrow (checked by `sub` and at construction); `dst` is memory we
        // own, distinct from any mapping of guest memory. The guest may
        // write the source meanwhile: a byte copy through raw pointers
        // makes no reference to it, and a torn read garbles only its data.
        unsafe { std::ptr::copy_nonoverlapping(src.ptr.as_ptr(), dst.as_mut_ptr(), dst.len()) };
        true
    }

    /// Copy `src` to offset `off`; false (nothing copied) if it does not
    /// fit inside the slice.
    #[inline]
    pub fn write_from(&self, off: usize, src: &[u8]) -> bool {
        let Some(dst) = self.sub(off, src.len()) else {
            return false;
        };
        // SAFETY: `dst` lies inside a shared, writable mapping that lives
        // as long as the borrow (checked by `sub` and at construction);
        // `src` is memory we own, distinct from it. A guest reading or
        // writing the same bytes meanwhile sees garbled data of its own.
        unsafe { std::ptr::copy_nonoverlapping(src.as_ptr(), dst.ptr.as_ptr(), src.len()) };
        true
    }

    /// Copy `len` bytes from `src` to offset `off`; false (nothing copied)
    /// if they do not fit inside the slice.
    ///
    /// # Safety
    /// `src` must be readable for `len` bytes and must not lie in this
    /// slice's range (a frame in another port's memory, or in a buffer of
    /// the switch's).
    #[inline]
    pub unsafe fn write_from_raw(&self, off: usize, src: *const u8, len: usize) -> bool {
        let Some(dst) = self.sub(off, len) else {
            return false;
        };
        // SAFETY: `dst` lies inside a shared, writable mapping that lives
        // as long as the borrow (checked by `sub` and at construction);
        // `src` is readable for `len` bytes and distinct from it (the
        // caller's contract).
        unsafe { ::ring::device::copy_frame(src, dst.ptr.as_ptr(), len) };
        true
    }
}

/// What the frontend says about one region (`VhostUserMemoryRegion`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RegionSpec {
    /// Guest-physical address of the region's first byte.
    pub guest_phys_addr: u64,
    /// Bytes in the region.
    pub memory_size: u64,
    /// Where the frontend has the region mapped in its own address space.
    pub user_addr: u64,
    /// Where the region starts in its file.
    pub mmap_offset: u64,
}

/// Why a memory table was refused.
#[derive(Debug, thiserror::Error)]
pub enum MemError {
    /// No regions, or more than [`MAX_REGIONS`].
    #[error("{0} memory regions (1..={MAX_REGIONS} accepted)")]
    Count(usize),
    /// A region and its descriptor do not pair up.
    #[error("{regions} regions but {files} descriptors")]
    Files {
        /// Regions in the table.
        regions: usize,
        /// Descriptors with it.
        files: usize,
    },
    /// Zero bytes, too large, or an end that does not fit in 64 bits.
    #[error("region {index}: {spec:?} is impossible")]
    Impossible {
        /// Region index in the table.
        index: usize,
        /// What the frontend said.
        spec: RegionSpec,
    },
    /// Two regions share guest-physical or frontend addresses.
    #[error("regions {a} and {b} overlap")]
    Overlap {
        /// One region.
        a: usize,
        /// The other.
        b: usize,
    },
    /// The file's seals could not be read: not a memfd, so it cannot be
    /// sealed against shrinking.
    #[error("region {index}: its file is not a memfd (reading its seals; a file that can shrink would make our reads fault with SIGBUS)")]
    Seals {
        /// Region index.
        index: usize,
        /// Why `fcntl(F_GET_SEALS)` failed.
        #[source]
        source: std::io::Error,
    },
    /// The memfd can still shrink.
    #[error("region {index}: memfd not sealed against shrinking (F_SEAL_SHRINK); a frontend that truncates it would make our reads fault with SIGBUS")]
    Unsealed {
        /// Region index.
        index: usize,
    },
    /// The file system the file lives on could not be read.
    #[error("region {index}: reading its file system (fstatfs)")]
    Statfs {
        /// Region index.
        index: usize,
        /// Why `fstatfs` failed.
        #[source]
        source: std::io::Error,
    },
    /// The memfd is backed by huge pages.
    #[error("region {index}: a hugetlbfs memfd (memory-backend-memfd,hugetlb=on) is refused: after a hole is punched in it, touching those pages needs a fresh huge page and faults with SIGBUS once the pool is exhausted; give the guest ordinary memfd memory")]
    Hugetlb {
        /// Region index.
        index: usize,
    },
    /// The file's size could not be read.
    #[error("region {index}: reading its size")]
    Stat {
        /// Region index.
        index: usize,
        /// Why `fstat` failed.
        #[source]
        source: std::io::Error,
    },
    /// The file is shorter than the region claims.
    #[error("region {index}: file is {have} bytes, the region needs {need}")]
    Short {
        /// Region index.
        index: usize,
        /// Bytes in the file.
        have: u64,
        /// Bytes the region needs (offset + size).
        need: u64,
    },
    /// Mapping failed.
    #[error("region {index}: mmap")]
    Mmap {
        /// Region index.
        index: usize,
        /// Why.
        #[source]
        source: std::io::Error,
    },
}

/// One mapped region.
struct Region {
    spec: RegionSpec,
    /// The memfd's seals when it was mapped (`F_SEAL_*`).
    seals: u32,
    /// The mapping, from the page that holds the region's first byte.
    map: MmapRaw,
    /// The region's first byte in our address space.
    base: NonNull<u8>,
}

/// The guest's memory, mapped (shared, read-write).
pub struct GuestMemory {
    regions: Vec<Region>,
}

// SAFETY: the pointers point into mappings this value owns and keeps until
// it is dropped; nothing here is mutated after `map`.
unsafe impl Send for GuestMemory {}
// SAFETY: shared use only translates addresses (reads of immutable fields);
// what the pointers point at is accessed by the port that holds them.
unsafe impl Sync for GuestMemory {}

impl std::fmt::Debug for GuestMemory {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list()
            .entries(self.regions.iter().map(|r| r.spec))
            .finish()
    }
}

/// Whether `[a, a + alen)` and `[b, b + blen)` share a byte (ends checked
/// by the caller).
fn overlaps(a: u64, alen: u64, b: u64, blen: u64) -> bool {
    a < b + blen && b < a + alen
}

impl GuestMemory {
    /// Check and map a memory table: every region's file a sealed memfd at
    /// least as long as the region needs, no two regions overlapping.
    pub fn map(specs: &[RegionSpec], files: Vec<File>) -> Result<GuestMemory, MemError> {
        if specs.is_empty() || specs.len() > MAX_REGIONS {
            return Err(MemError::Count(specs.len()));
        }
        if files.len() != specs.len() {
            return Err(MemError::Files {
                regions: specs.len(),
                files: files.len(),
            });
        }
        for (index, s) in specs.iter().enumerate() {
            let ok = s.memory_size > 0
                && s.memory_size <= MAX_REGION_SIZE
                && s.guest_phys_addr.checked_add(s.memory_size).is_some()
                && s.user_addr.checked_add(s.memory_size).is_some()
                && s.mmap_offset.checked_add(s.memory_size).is_some();
            if !ok {
                return Err(MemError::Impossible { index, spec: *s });
            }
        }
        for (a, sa) in specs.iter().enumerate() {
            for (b, sb) in specs.iter().enumerate().skip(a + 1) {
                if overlaps(
                    sa.guest_phys_addr,
                    sa.memory_size,
                    sb.guest_phys_addr,
                    sb.memory_size,
                ) || overlaps(sa.user_addr, sa.memory_size, sb.user_addr, sb.memory_size)
                {
                    return Err(MemError::Overlap { a, b });
                }
            }
        }
        let page = rustix::param::page_size() as u64;
        let mut regions = Vec::with_capacity(specs.len());
        for (index, (s, file)) in specs.iter().zip(files).enumerate() {
            // The seal first, then the size: once sealed the size can only
            // grow, so what fstat says next stays true.
            let seals = rustix::fs::fcntl_get_seals(file.as_fd()).map_err(|e| MemError::Seals {
                index,
                source: e.into(),
            })?;
            if !seals.contains(rustix::fs::SealFlags::SHRINK) {
                return Err(MemError::Unsealed { index });
            }
            let fs = rustix::fs::fstatfs(&file).map_err(|e| MemError::Statfs {
                index,
                source: e.into(),
            })?;
            if fs.f_type as u64 & 0xffff_ffff == HUGETLBFS_MAGIC {
                return Err(MemError::Hugetlb { index });
            }
            let have = file
                .metadata()
                .map_err(|source| MemError::Stat { index, source })?
                .len();
            let need = s.mmap_offset + s.memory_size;
            if have < need {
                return Err(MemError::Short { index, have, need });
            }
            let start = s.mmap_offset & !(page - 1);
            let lead = s.mmap_offset - start;
            let len = usize::try_from(lead + s.memory_size)
                .map_err(|_| MemError::Impossible { index, spec: *s })?;
            let map = memmap2::MmapOptions::new()
                .offset(start)
                .len(len)
                .map_raw(&file)
                .map_err(|source| MemError::Mmap { index, source })?;
            // SAFETY: lead < page <= len, so the pointer stays inside the
            // mapping just made.
            let base = NonNull::new(unsafe { map.as_mut_ptr().add(lead as usize) }).ok_or(
                MemError::Mmap {
                    index,
                    source: std::io::Error::other("null mapping"),
                },
            )?;
            regions.push(Region {
                spec: *s,
                seals: seals.bits(),
                map,
                base,
            });
        }
        Ok(GuestMemory { regions })
    }

    /// The regions, as the frontend described them.
    pub fn specs(&self) -> impl Iterator<Item = RegionSpec> + '_ {
        self.regions.iter().map(|r| r.spec)
    }

    /// The `len` bytes at guest-physical `addr`, if they lie wholly inside
    /// one region.
    #[inline]
    pub fn gpa(&self, addr: GuestAddr, len: u64) -> Option<GuestSlice<'_>> {
        self.find(addr.0, len, |s| s.guest_phys_addr)
    }

    /// The `len` bytes the frontend has at its own address `addr`, if they
    /// lie wholly inside one region.
    pub fn user(&self, addr: FrontendAddr, len: u64) -> Option<GuestSlice<'_>> {
        self.find(addr.0, len, |s| s.user_addr)
    }

    /// The region whose range (as `start` names it) holds `[a, a + len)`,
    /// and the slice of it.
    #[inline]
    fn find(&self, a: u64, len: u64, start: impl Fn(&RegionSpec) -> u64) -> Option<GuestSlice<'_>> {
        for r in &self.regions {
            let s = &r.spec;
            if let Some(off) = a.checked_sub(start(s)) {
                if off < s.memory_size {
                    if len > s.memory_size - off {
                        return None;
                    }
                    return Some(GuestSlice {
                        // SAFETY: off + len <= memory_size: the range lies
                        // inside the mapping `r` keeps for as long as
                        // `self` (and so the slice's borrow) lives.
                        ptr: unsafe { r.base.add(off as usize) },
                        // memory_size <= MAX_REGION_SIZE and the mapping of
                        // it succeeded, so it fits in usize.
                        len: len as usize,
                        _mem: PhantomData,
                    });
                }
            }
        }
        None
    }

    /// Each region's seals when it was mapped, named (`shrink|grow|...`).
    pub fn seals(&self) -> Vec<String> {
        let names = [
            (libc::F_SEAL_SEAL, "seal"),
            (libc::F_SEAL_SHRINK, "shrink"),
            (libc::F_SEAL_GROW, "grow"),
            (libc::F_SEAL_WRITE, "write"),
            (libc::F_SEAL_FUTURE_WRITE, "future_write"),
        ];
        self.regions
            .iter()
            .map(|r| {
                names
                    .iter()
                    .filter(|(bit, _)| r.seals & *bit as u32 != 0)
                    .map(|(_, n)| *n)
                    .collect::<Vec<_>>()
                    .join("|")
            })
            .collect()
    }

    /// Bytes mapped in all.
    pub fn mapped_bytes(&self) -> u64 {
        self.regions.iter().map(|r| r.map.len() as u64).sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::FromRawFd;

    fn memfd(size: u64, seals: libc::c_int) -> File {
        // SAFETY: memfd_create with a NUL-terminated literal name.
        let fd = unsafe {
            libc::memfd_create(
                c"mem-test".as_ptr(),
                libc::MFD_CLOEXEC | libc::MFD_ALLOW_SEALING,
            )
        };
        assert!(fd >= 0);
        // SAFETY: fd is a fresh descriptor nothing else owns.
        let f = unsafe { File::from_raw_fd(fd) };
        f.set_len(size).unwrap();
        if seals != 0 {
            // SAFETY: fcntl on our own descriptor with an integer argument.
            let rc = unsafe { libc::fcntl(fd, libc::F_ADD_SEALS, seals) };
            assert_eq!(rc, 0, "add seals");
        }
        f
    }

    fn spec(gpa: u64, size: u64, ua: u64, off: u64) -> RegionSpec {
        RegionSpec {
            guest_phys_addr: gpa,
            memory_size: size,
            user_addr: ua,
            mmap_offset: off,
        }
    }

    #[test]
    fn translates_inside_and_refuses_outside() {
        let f = memfd(3 << 16, libc::F_SEAL_SHRINK);
        let g = f.try_clone().unwrap();
        let m = GuestMemory::map(
            &[
                spec(0, 1 << 16, 0x7f00_0000_0000, 0),
                spec(1 << 20, 2 << 16, 0x7f00_0010_0000, 1 << 16),
            ],
            vec![f, g],
        )
        .unwrap();
        let g = GuestAddr;
        let u = FrontendAddr;
        assert!(m.gpa(g(0), 1 << 16).is_some());
        assert!(m.gpa(g(1), 1 << 16).is_none(), "one byte past the end");
        assert!(m.gpa(g(1 << 16), 1).is_none(), "the hole between regions");
        let b = m.gpa(g(1 << 20), 1).unwrap();
        assert!(b.write_from(0, &[7]));
        assert_eq!(m.user(u(0x7f00_0010_0000), 1), Some(b));
        let mut seen = [0u8];
        assert!(b.read_into(0, &mut seen));
        assert_eq!(seen, [7]);
        assert!(!b.write_from(1, &[7]), "past the slice's end");
        assert!(m.user(u(0x7f00_0010_0000 + (2 << 16) - 1), 2).is_none());
        assert!(m.gpa(g(u64::MAX), 2).is_none());
        assert!(m.user(u(u64::MAX - 1), u64::MAX).is_none());
    }

    #[test]
    fn refuses_unsealed_short_and_overlapping_tables() {
        let e = GuestMemory::map(&[spec(0, 4096, 0, 0)], vec![memfd(4096, 0)]).unwrap_err();
        assert!(matches!(e, MemError::Unsealed { index: 0 }), "{e}");
        let e = GuestMemory::map(
            &[spec(0, 8192, 0, 0)],
            vec![memfd(4096, libc::F_SEAL_SHRINK)],
        )
        .unwrap_err();
        assert!(
            matches!(
                e,
                MemError::Short {
                    have: 4096,
                    need: 8192,
                    ..
                }
            ),
            "{e}"
        );
        let f = memfd(8192, libc::F_SEAL_SHRINK);
        let g = f.try_clone().unwrap();
        let e = GuestMemory::map(
            &[spec(0, 4096, 0, 0), spec(4095, 4096, 1 << 30, 0)],
            vec![f, g],
        )
        .unwrap_err();
        assert!(matches!(e, MemError::Overlap { a: 0, b: 1 }), "{e}");
        let e = GuestMemory::map(
            &[spec(u64::MAX, 2, 0, 0)],
            vec![memfd(4096, libc::F_SEAL_SHRINK)],
        )
        .unwrap_err();
        assert!(matches!(e, MemError::Impossible { .. }), "{e}");
        // A regular file cannot be sealed at all.
        let tmp = std::env::temp_dir().join(format!("vhost-mem-test-{}", std::process::id()));
        let reg = File::create(&tmp).unwrap();
        reg.set_len(4096).unwrap();
        std::fs::remove_file(&tmp).unwrap();
        let e = GuestMemory::map(&[spec(0, 4096, 0, 0)], vec![reg]).unwrap_err();
        assert!(
            matches!(e, MemError::Seals { .. } | MemError::Unsealed { .. }),
            "{e}"
        );
    }

    #[test]
    #[ignore = "system test: hugepages (scripts/setup.sh reserves them)"]
    fn refuses_a_sealed_hugetlbfs_memfd() {
        let huge = 2u64 << 20;
        // SAFETY: memfd_create with a NUL-terminated literal name.
        let fd = unsafe {
            libc::memfd_create(
                c"mem-test-huge".as_ptr(),
                libc::MFD_CLOEXEC | libc::MFD_ALLOW_SEALING | libc::MFD_HUGETLB,
            )
        };
        if fd < 0 {
            systest::missing(&format!(
                "a hugetlbfs memfd ({})",
                std::io::Error::last_os_error()
            ));
        }
        // SAFETY: fd is a fresh descriptor nothing else owns.
        let f = unsafe { File::from_raw_fd(fd) };
        f.set_len(huge).unwrap();
        // SAFETY: fcntl on our own descriptor with an integer argument.
        let rc = unsafe { libc::fcntl(fd, libc::F_ADD_SEALS, libc::F_SEAL_SHRINK) };
        assert_eq!(rc, 0, "hugetlbfs memfds can be sealed");
        let e = GuestMemory::map(&[spec(0, huge, 0, 0)], vec![f]).unwrap_err();
        assert!(matches!(e, MemError::Hugetlb { index: 0 }), "{e}");
        assert!(e.to_string().contains("SIGBUS"), "{e}");
    }
}
