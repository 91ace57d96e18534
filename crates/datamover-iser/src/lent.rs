//! Registered memory lent to the layers above, so read data is produced where its RDMA Write
//! leaves from and write data is consumed where its RDMA Read landed: the backend's one copy
//! is the only one. A RAM LUN whose image is registered in the connection's protection
//! domain ([`crate::target_device::LunImage`], recognised by its [`storage::Registration`])
//! needs not even that: its bytes leave from where they lie. A read buffer's note
//! ([`storage::BufNote::Registered`]) says where its data lies as the device addresses it,
//! so the datamover builds the RDMA Write's SGE from it ([`RegisteredReadBuffers::sge_of`]).
//! A region leaves as `Bytes` over its own memory ([`view`]); the pool gets it back when the
//! last holder lets go, never while an operation still uses it.

use std::sync::Arc;

use bytes::{Bytes, BytesMut};
use datamover::budget::Reservation;
use rdma::{MemoryRegion, Sge};
use storage::{BufNote, Held, ImageMemory, ReadBuf, ReadBufSource, Registered, Registration};

use crate::endpoint::Device;
use crate::mr_pool::{MrPool, PooledMr};

/// The first `len` bytes of a leased region, as `Bytes` (no copy). The caller must have
/// finished writing them: the region is read-only from here on.
pub fn view<P: Device>(lease: Arc<PooledMr<P>>, len: usize) -> Bytes {
    view_holding(lease, len, Reservation::none())
}

/// [`view`], with the memory budget's `held` reservation given back when the last holder
/// lets go.
pub fn view_holding<P: Device>(lease: Arc<PooledMr<P>>, len: usize, held: Reservation) -> Bytes {
    assert!(len <= lease.mr().len(), "view beyond the region");
    held.travel_with(RegionView { lease, len })
}

/// A read served where it lies in a LUN image registered in the lender's domain; holds the
/// reader's range lock (no atomic write may change the bytes) until the RDMA Write has sent
/// them.
struct ImageRead {
    image: Arc<dyn ImageMemory>,
    reg: Registration,
    offset: usize,
    len: usize,
    _hold: Option<Held>,
}

impl ImageRead {
    fn bytes(&self) -> &[u8] {
        self.image.bytes_at(self.offset, self.len)
    }
}

struct RegionView<P: Device> {
    lease: Arc<PooledMr<P>>,
    len: usize,
}

impl<P: Device> AsRef<[u8]> for RegionView<P> {
    fn as_ref(&self) -> &[u8] {
        &self.lease.mr().as_bytes()[..self.len]
    }
}

struct ImageView(Arc<ImageRead>);

impl AsRef<[u8]> for ImageView {
    fn as_ref(&self) -> &[u8] {
        self.0.bytes()
    }
}

/// Lends read buffers that are regions of a connection's RDMA Write pool, or that take a
/// LUN image registered in the connection's protection domain where it lies.
pub struct RegisteredReadBuffers<P: Device> {
    pool: Arc<MrPool<P>>,
    /// The connection's shared protection domain (0: none; then no image is taken).
    domain: usize,
}

impl<P: Device> RegisteredReadBuffers<P> {
    pub fn new(pool: Arc<MrPool<P>>, domain: usize) -> Self {
        RegisteredReadBuffers { pool, domain }
    }

    /// The SGE that sends `data` from where it lies, and whether that is a LUN image: when
    /// `note` says `data` lies in memory registered in this lender's domain (its own regions,
    /// or an image there). `None`: the data must be copied into a region first.
    pub fn sge_of(&self, note: Option<&BufNote>, data: &[u8]) -> Option<(Sge, bool)> {
        let Some(BufNote::Registered(at)) = note else {
            return None;
        };
        if at.domain != self.domain {
            return None;
        }
        let addr = at.addr_of(data)?;
        let sge = Sge {
            lkey: at.lkey,
            addr,
            len: u32::try_from(data.len()).ok()?,
        };
        Some((sge, at.in_image))
    }
}

impl<P: Device> std::fmt::Debug for RegisteredReadBuffers<P> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("RegisteredReadBuffers")
    }
}

impl<P: Device> ReadBufSource for RegisteredReadBuffers<P> {
    fn lend(&self, len: usize) -> Box<dyn ReadBuf> {
        Box::new(RegisteredReadBuf {
            pool: self.pool.clone(),
            domain: self.domain,
            want: len,
            state: State::Empty,
        })
    }
}

/// A read buffer in registered memory: a pool region taken at the first copy, or a range of
/// a LUN image registered in the lender's domain. Its note says where the data lies.
struct RegisteredReadBuf<P: Device> {
    pool: Arc<MrPool<P>>,
    domain: usize,
    want: usize,
    state: State<P>,
}

enum State<P: Device> {
    Empty,
    Region {
        lease: Arc<PooledMr<P>>,
        len: usize,
    },
    /// No region could be had: plain memory, copied at the RDMA Write (which registers, and
    /// says why it cannot).
    Heap(BytesMut),
    Image(ImageRead),
}

impl<P: Device> RegisteredReadBuf<P> {
    /// Where copies go: the state after the first copy (an image range becomes a copy too, if
    /// anything is appended behind it).
    fn copying(&mut self) -> &mut State<P> {
        let want = self.want.max(self.len());
        match std::mem::replace(&mut self.state, State::Empty) {
            State::Empty => {
                self.state = match self.pool.take(want) {
                    Ok(lease) => State::Region {
                        lease: Arc::new(lease),
                        len: 0,
                    },
                    Err(_) => State::Heap(BytesMut::with_capacity(want)),
                }
            }
            State::Image(read) => {
                let mut heap = BytesMut::with_capacity(want);
                heap.extend_from_slice(read.bytes());
                self.state = State::Heap(heap);
            }
            other => self.state = other,
        }
        &mut self.state
    }
}

impl<P: Device> ReadBuf for RegisteredReadBuf<P> {
    fn put_image(&mut self, image: &Arc<dyn ImageMemory>, offset: usize, len: usize) -> bool {
        if self.domain == 0 || !matches!(self.state, State::Empty) {
            return false;
        }
        match image.registration() {
            Some(reg) if reg.domain == self.domain => {
                self.state = State::Image(ImageRead {
                    image: image.clone(),
                    reg,
                    offset,
                    len,
                    _hold: None,
                });
                true
            }
            _ => false,
        }
    }

    fn keep_until_sent(&mut self, hold: Held) {
        if let State::Image(read) = &mut self.state {
            read._hold = Some(hold);
        }
    }

    fn put(&mut self, src: &[u8]) {
        match self.copying() {
            State::Region { lease, len } => {
                lease.mr().write_at(*len, src);
                *len += src.len();
            }
            State::Heap(heap) => heap.extend_from_slice(src),
            State::Empty | State::Image(_) => unreachable!("copying() leaves a copy state"),
        }
    }

    fn put_zeros(&mut self, n: usize) {
        if let State::Heap(heap) = self.copying() {
            heap.resize(heap.len() + n, 0);
            return;
        }
        // Regions are reused: never-written ranges must be zeroed here.
        const ZEROS: [u8; 4096] = [0; 4096];
        let mut left = n;
        while left > 0 {
            let k = left.min(ZEROS.len());
            self.put(&ZEROS[..k]);
            left -= k;
        }
    }

    fn put_bytes(&mut self, data: Bytes) {
        self.put(&data);
    }

    fn len(&self) -> usize {
        match &self.state {
            State::Empty => 0,
            State::Region { len, .. } => *len,
            State::Heap(heap) => heap.len(),
            State::Image(read) => read.len,
        }
    }

    fn finish(self: Box<Self>) -> (Bytes, Option<BufNote>) {
        let domain = self.domain;
        match self.state {
            State::Empty => (Bytes::new(), None),
            State::Region { lease, len } => {
                let mr = lease.mr();
                let note = Registered {
                    domain,
                    lkey: mr.lkey(),
                    addr: mr.addr(),
                    at: mr.as_bytes().as_ptr() as usize,
                    len,
                    in_image: false,
                    held: Held::shared(lease.clone()),
                };
                (view(lease, len), Some(BufNote::Registered(note)))
            }
            State::Heap(heap) => (heap.freeze(), None),
            State::Image(read) => {
                let read = Arc::new(read);
                let note = Registered {
                    domain,
                    lkey: read.reg.lkey,
                    addr: read.reg.addr + read.offset as u64,
                    at: read.bytes().as_ptr() as usize,
                    len: read.len,
                    in_image: true,
                    held: Held::shared(read.clone()),
                };
                (
                    Bytes::from_owner(ImageView(read)),
                    Some(BufNote::Registered(note)),
                )
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rdma::{Access, Provider};
    use rnic::Rnic;

    fn pool() -> Arc<MrPool<Rnic>> {
        let dev = Arc::new(Rnic::new().unwrap());
        let pd = dev.alloc_pd().unwrap();
        MrPool::new(dev, pd, Access::NONE, 1 << 20)
    }

    #[test]
    fn read_data_is_produced_in_the_region_it_leaves_from() {
        let pool = pool();
        let lender = RegisteredReadBuffers::new(pool.clone(), 0);
        let mut buf = lender.lend(10_000);
        buf.put(b"abc");
        buf.put_zeros(5000);
        buf.put_bytes(Bytes::from_static(b"xyz"));
        let (data, note) = buf.finish();
        assert_eq!(data.len(), 5006);
        assert_eq!(&data[..3], b"abc");
        assert!(data[3..5003].iter().all(|&b| b == 0));
        assert_eq!(&data[5003..], b"xyz");
        // A slice of it (what SCSI may hand on) is sent from where it lies in the region
        // (the software RNIC addresses memory where it lies).
        let (sge, in_image) = lender.sge_of(note.as_ref(), &data[100..200]).unwrap();
        assert!(!in_image);
        assert_eq!((sge.addr, sge.len), (data[100..].as_ptr() as u64, 100));
        // Bytes from elsewhere, or no note, are not taken for the region's.
        assert!(lender.sge_of(note.as_ref(), &[1, 2, 3]).is_none());
        assert!(lender.sge_of(None, &data).is_none());
        // The region goes back to the pool only when the data and the note are both gone.
        drop(data);
        assert_eq!(pool.idle_bytes(), 0);
        drop(note);
        assert_eq!(pool.idle_bytes(), 16384);
    }

    #[test]
    fn a_reused_region_reads_as_zeros_where_zeros_were_put() {
        let pool = pool();
        let lender = RegisteredReadBuffers::new(pool, 0);
        let mut first = lender.lend(4096);
        first.put(&[0xff; 4096]);
        drop(first.finish());
        let mut second = lender.lend(4096);
        second.put_zeros(4096);
        let (data, _) = second.finish();
        assert!(data.iter().all(|&b| b == 0));
    }

    /// A LUN image registered in the connection's domain is sent from where it lies: the
    /// data is the image's memory (no pool region is taken: nothing was copied), its note
    /// names the image at the LUN offset, and the reader's hold lives until the note and
    /// data are gone. Another domain's lender does not send from it; an image of another
    /// domain (another device) is copied instead.
    #[test]
    fn a_registered_lun_image_is_read_where_it_lies() {
        use crate::target_device::TargetDevice;
        use storage::Backend;
        let rt = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        let dev = TargetDevice::new(Arc::new(Rnic::new().unwrap())).unwrap();
        let image = dev.register_image(1 << 20).unwrap();
        let lun = storage::MemoryBackend::with_image(image.clone());
        rt.block_on(lun.write_at(200_000, Bytes::from(vec![5u8; 70_000]), false))
            .unwrap();
        let pool = MrPool::new(dev.dev().clone(), dev.pd().clone(), Access::NONE, 1 << 20);
        let lender = RegisteredReadBuffers::new(pool.clone(), dev.domain());
        let mut filled = rt
            .block_on(lun.read_into(200_000, 70_000, lender.lend(70_000)))
            .unwrap();
        let hold = Arc::new(());
        filled.keep_until_sent(storage::Held::shared(hold.clone()));
        let (data, note) = filled.finish();
        assert!(data.iter().all(|&b| b == 5));
        assert_eq!(pool.idle_bytes(), 0, "no pool region was taken");
        assert_eq!(data.as_ptr() as u64, image.mr().addr() + 200_000);
        let (sge, in_image) = lender.sge_of(note.as_ref(), &data).unwrap();
        assert!(in_image, "sent from the image");
        assert_eq!(sge.lkey, image.mr().lkey());
        assert_eq!(sge.addr, image.mr().addr() + 200_000, "at the LUN offset");
        let elsewhere = TargetDevice::new(Arc::new(Rnic::new().unwrap())).unwrap();
        let stranger = RegisteredReadBuffers::new(pool.clone(), elsewhere.domain());
        assert!(stranger.sge_of(note.as_ref(), &data).is_none());
        assert_eq!(
            Arc::strong_count(&hold),
            2,
            "held while the data may be sent"
        );
        drop(data);
        assert_eq!(Arc::strong_count(&hold), 2, "held by the note too");
        drop(note);
        assert_eq!(Arc::strong_count(&hold), 1, "let go once sent");

        // Another device's image: copied into this connection's region.
        let other = TargetDevice::new(Arc::new(Rnic::new().unwrap())).unwrap();
        let foreign = storage::MemoryBackend::with_image(other.register_image(1 << 20).unwrap());
        let filled = rt
            .block_on(foreign.read_into(0, 4096, lender.lend(4096)))
            .unwrap();
        let (data, note) = filled.finish();
        assert_eq!(data.len(), 4096);
        let (_, in_image) = lender.sge_of(note.as_ref(), &data).unwrap();
        assert!(!in_image, "copied into a pool region");
    }
}
