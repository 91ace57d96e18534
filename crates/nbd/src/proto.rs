//! The NBD protocol, sans IO: the server's side of the fixed newstyle handshake and option
//! haggling ([`Handshake`]), transmission-phase request framing and checks
//! ([`Transmission::parse`]) and reply encoding, simple or structured ([`Transmission::encode`]).
//! Bytes in, bytes and decisions out: no sockets, no tasks, no clocks.
//!
//! Wire facts follow the NBD protocol document (`doc/proto.md` of the NetworkBlockDevice
//! project); every number on the wire is big-endian.

use bytes::{Buf, Bytes, BytesMut};

/// `NBDMAGIC`, the first eight bytes the server sends.
pub const NBD_MAGIC: u64 = 0x4e42_444d_4147_4943;
/// `IHAVEOPT`: the newstyle server greeting's second word and every option's first.
pub const IHAVEOPT: u64 = 0x4948_4156_454f_5054;
/// First word of every option reply.
pub const OPTION_REPLY_MAGIC: u64 = 0x0003_e889_0455_65a9;
pub const REQUEST_MAGIC: u32 = 0x2560_9513;
pub const SIMPLE_REPLY_MAGIC: u32 = 0x6744_6698;
pub const STRUCTURED_REPLY_MAGIC: u32 = 0x668e_33ef;

/// Handshake flags (server) and client flags.
pub const FLAG_FIXED_NEWSTYLE: u16 = 1 << 0;
pub const FLAG_NO_ZEROES: u16 = 1 << 1;
pub const FLAG_C_FIXED_NEWSTYLE: u32 = 1 << 0;
pub const FLAG_C_NO_ZEROES: u32 = 1 << 1;

/// Transmission flags.
pub mod tflag {
    pub const HAS_FLAGS: u16 = 1 << 0;
    pub const READ_ONLY: u16 = 1 << 1;
    pub const SEND_FLUSH: u16 = 1 << 2;
    pub const SEND_FUA: u16 = 1 << 3;
    pub const ROTATIONAL: u16 = 1 << 4;
    pub const SEND_TRIM: u16 = 1 << 5;
    pub const SEND_WRITE_ZEROES: u16 = 1 << 6;
    pub const SEND_DF: u16 = 1 << 7;
    pub const CAN_MULTI_CONN: u16 = 1 << 8;
}

/// Option codes.
pub mod opt {
    pub const EXPORT_NAME: u32 = 1;
    pub const ABORT: u32 = 2;
    pub const LIST: u32 = 3;
    pub const STARTTLS: u32 = 5;
    pub const INFO: u32 = 6;
    pub const GO: u32 = 7;
    pub const STRUCTURED_REPLY: u32 = 8;
}

/// Option reply types.
pub mod rep {
    pub const ACK: u32 = 1;
    pub const SERVER: u32 = 2;
    pub const INFO: u32 = 3;
    pub const ERR_UNSUP: u32 = 0x8000_0001;
    pub const ERR_POLICY: u32 = 0x8000_0002;
    pub const ERR_INVALID: u32 = 0x8000_0003;
    pub const ERR_UNKNOWN: u32 = 0x8000_0006;
}

/// `NBD_REP_INFO` item types.
pub mod info {
    pub const EXPORT: u16 = 0;
    pub const NAME: u16 = 1;
    pub const DESCRIPTION: u16 = 2;
    pub const BLOCK_SIZE: u16 = 3;
}

/// Request types.
pub mod cmd {
    pub const READ: u16 = 0;
    pub const WRITE: u16 = 1;
    pub const DISC: u16 = 2;
    pub const FLUSH: u16 = 3;
    pub const TRIM: u16 = 4;
    pub const WRITE_ZEROES: u16 = 6;
}

/// Command flags.
pub mod cflag {
    pub const FUA: u16 = 1 << 0;
    pub const NO_HOLE: u16 = 1 << 1;
    pub const DF: u16 = 1 << 2;
}

/// Structured reply chunk flags and types.
pub const REPLY_FLAG_DONE: u16 = 1 << 0;
pub const REPLY_TYPE_NONE: u16 = 0;
pub const REPLY_TYPE_OFFSET_DATA: u16 = 1;
pub const REPLY_TYPE_ERROR: u16 = 0x8001;

/// The error values a reply may carry.
pub mod errno {
    pub const EPERM: u32 = 1;
    pub const EIO: u32 = 5;
    pub const EINVAL: u32 = 22;
    pub const ENOSPC: u32 = 28;
    pub const ESHUTDOWN: u32 = 108;
}

/// Bytes of a request header, of a simple reply header, of a structured chunk header.
pub const REQUEST_LEN: usize = 28;
pub const SIMPLE_REPLY_LEN: usize = 16;
pub const CHUNK_HEADER_LEN: usize = 20;

/// Option data larger than this ends the connection (the longest legitimate option, GO
/// with a 4096-byte name and a few info requests, is far below it).
pub const MAX_OPTION_LEN: u32 = 16 << 10;
/// Options a client may send before choosing an export.
pub const MAX_OPTIONS: u32 = 1024;

/// Size constraints advertised with `NBD_INFO_BLOCK_SIZE`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BlockSizes {
    /// Smallest addressable unit (1: any byte offset; the driver read-modify-writes).
    pub minimum: u32,
    /// Size and alignment at which I/O is efficient (the LUN's block, at least 4 KiB).
    pub preferred: u32,
    /// Largest READ or WRITE payload accepted in one request.
    pub maximum: u32,
}

/// What the server exports: one device.
#[derive(Debug, Clone)]
pub struct Export {
    /// The name `NBD_OPT_LIST` shows; the empty (default) name selects the export too.
    pub name: String,
    /// Shown by `NBD_OPT_LIST` and `NBD_INFO_DESCRIPTION`.
    pub description: String,
    /// Bytes.
    pub size: u64,
    pub read_only: bool,
    pub block_sizes: BlockSizes,
}

impl Export {
    /// Whether the client's export name selects this export.
    pub fn matches(&self, name: &str) -> bool {
        name.is_empty() || name == self.name
    }

    /// The transmission flags, given whether structured replies were negotiated.
    pub fn transmission_flags(&self, structured: bool) -> u16 {
        let mut f = tflag::HAS_FLAGS | tflag::SEND_FLUSH | tflag::CAN_MULTI_CONN;
        if self.read_only {
            f |= tflag::READ_ONLY;
        } else {
            f |= tflag::SEND_FUA | tflag::SEND_TRIM | tflag::SEND_WRITE_ZEROES;
        }
        if structured {
            // Every read is answered by one content chunk, so "don't fragment" costs nothing.
            f |= tflag::SEND_DF;
        }
        f
    }
}

/// A client that broke the protocol: its connection ends (a hard disconnect).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ProtoError {
    /// Client flags with bits the server did not offer.
    ClientFlags(u32),
    /// An option not starting with `IHAVEOPT`.
    OptionMagic(u64),
    /// Option data longer than [`MAX_OPTION_LEN`].
    OptionTooLong { option: u32, len: u32 },
    /// More than [`MAX_OPTIONS`] options without choosing an export.
    TooManyOptions,
    /// `NBD_OPT_EXPORT_NAME` of an export that does not exist (it cannot be answered with
    /// an error).
    UnknownExport(String),
    /// A request not starting with `NBD_REQUEST_MAGIC`.
    RequestMagic(u32),
}

impl std::fmt::Display for ProtoError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ProtoError::ClientFlags(v) => write!(
                f,
                "client flags 0x{v:08x} set bits the server did not offer"
            ),
            ProtoError::OptionMagic(v) => {
                write!(f, "option magic 0x{v:016x} is not IHAVEOPT")
            }
            ProtoError::OptionTooLong { option, len } => {
                write!(
                    f,
                    "option {option} carries {len} bytes (limit {MAX_OPTION_LEN})"
                )
            }
            ProtoError::TooManyOptions => {
                write!(
                    f,
                    "more than {MAX_OPTIONS} options without choosing an export"
                )
            }
            ProtoError::UnknownExport(n) => {
                write!(f, "NBD_OPT_EXPORT_NAME of unknown export {n:?}")
            }
            ProtoError::RequestMagic(v) => {
                write!(f, "request magic 0x{v:08x} is not NBD_REQUEST_MAGIC")
            }
        }
    }
}

impl std::error::Error for ProtoError {}

/// Where the handshake stands after the bytes given so far.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Progress {
    /// Send the output, read more.
    NeedMore,
    /// Send the output; the transmission phase begins ([`Handshake::finish`]).
    Transmission,
    /// The client aborted (`NBD_OPT_ABORT`): send the output and close.
    Abort,
    /// The client chose an export with `NBD_OPT_EXPORT_NAME` from a handshake that refuses
    /// it ([`Handshake::refusing`]); that option cannot be answered with an error, so the
    /// connection ends (a hard disconnect).
    Refused,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum HsState {
    ClientFlags,
    Options,
    Done,
}

/// The server's side of the fixed newstyle handshake for one client.
#[derive(Debug)]
pub struct Handshake {
    export: Export,
    input: BytesMut,
    output: Vec<u8>,
    state: HsState,
    no_zeroes: bool,
    structured: bool,
    options: u32,
    /// Why every option is refused ([`Handshake::refusing`]).
    refusal: Option<String>,
}

impl Handshake {
    /// A handshake whose greeting (`NBDMAGIC`, `IHAVEOPT`, handshake flags) is already in
    /// the output.
    pub fn new(export: Export) -> Handshake {
        let mut output = Vec::with_capacity(18);
        output.extend_from_slice(&NBD_MAGIC.to_be_bytes());
        output.extend_from_slice(&IHAVEOPT.to_be_bytes());
        output.extend_from_slice(&(FLAG_FIXED_NEWSTYLE | FLAG_NO_ZEROES).to_be_bytes());
        Handshake {
            export,
            input: BytesMut::new(),
            output,
            state: HsState::ClientFlags,
            no_zeroes: false,
            structured: false,
            options: 0,
            refusal: None,
        }
    }

    /// The same handshake refusing the client: every option but `NBD_OPT_ABORT` is answered
    /// with `NBD_REP_ERR_POLICY` and `reason` (the error a client reports to its user), so
    /// the client gives up by itself, as the protocol asks of a server that will not serve
    /// it; `NBD_OPT_EXPORT_NAME`, which has no error reply, ends in [`Progress::Refused`].
    pub fn refusing(self, reason: String) -> Handshake {
        Handshake {
            refusal: Some(reason),
            ..self
        }
    }

    /// The bytes to send now (emptied).
    pub fn take_output(&mut self) -> Vec<u8> {
        std::mem::take(&mut self.output)
    }

    /// Whether the client negotiated structured replies.
    pub fn structured(&self) -> bool {
        self.structured
    }

    /// Takes bytes from the client and handles every complete message in them.
    pub fn receive(&mut self, data: &[u8]) -> Result<Progress, ProtoError> {
        self.input.extend_from_slice(data);
        loop {
            match self.state {
                HsState::Done => return Ok(Progress::Transmission),
                HsState::ClientFlags => {
                    if self.input.len() < 4 {
                        return Ok(Progress::NeedMore);
                    }
                    let flags = self.input.get_u32();
                    if flags & !(FLAG_C_FIXED_NEWSTYLE | FLAG_C_NO_ZEROES) != 0 {
                        return Err(ProtoError::ClientFlags(flags));
                    }
                    self.no_zeroes = flags & FLAG_C_NO_ZEROES != 0;
                    self.state = HsState::Options;
                }
                HsState::Options => {
                    if self.input.len() < 16 {
                        return Ok(Progress::NeedMore);
                    }
                    let magic = u64::from_be_bytes(self.input[0..8].try_into().expect("8"));
                    if magic != IHAVEOPT {
                        return Err(ProtoError::OptionMagic(magic));
                    }
                    let option = u32::from_be_bytes(self.input[8..12].try_into().expect("4"));
                    let len = u32::from_be_bytes(self.input[12..16].try_into().expect("4"));
                    if len > MAX_OPTION_LEN {
                        return Err(ProtoError::OptionTooLong { option, len });
                    }
                    if self.input.len() < 16 + len as usize {
                        return Ok(Progress::NeedMore);
                    }
                    self.options += 1;
                    if self.options > MAX_OPTIONS {
                        return Err(ProtoError::TooManyOptions);
                    }
                    self.input.advance(16);
                    let body = self.input.split_to(len as usize);
                    match self.option(option, &body)? {
                        Progress::NeedMore => {}
                        Progress::Transmission => {
                            self.state = HsState::Done;
                            return Ok(Progress::Transmission);
                        }
                        Progress::Abort => return Ok(Progress::Abort),
                        Progress::Refused => return Ok(Progress::Refused),
                    }
                }
            }
        }
    }

    /// The transmission phase after [`Progress::Transmission`], and the bytes the client sent
    /// past the handshake (requests already).
    pub fn finish(self) -> (Transmission, BytesMut) {
        let t = Transmission::new(self.export, self.structured);
        (t, self.input)
    }

    fn reply(&mut self, option: u32, kind: u32, payload: &[u8]) {
        self.output
            .extend_from_slice(&OPTION_REPLY_MAGIC.to_be_bytes());
        self.output.extend_from_slice(&option.to_be_bytes());
        self.output.extend_from_slice(&kind.to_be_bytes());
        self.output
            .extend_from_slice(&(payload.len() as u32).to_be_bytes());
        self.output.extend_from_slice(payload);
    }

    fn info(&mut self, option: u32, item: u16, payload: &[u8]) {
        let mut p = Vec::with_capacity(2 + payload.len());
        p.extend_from_slice(&item.to_be_bytes());
        p.extend_from_slice(payload);
        self.reply(option, rep::INFO, &p);
    }

    fn option(&mut self, option: u32, data: &[u8]) -> Result<Progress, ProtoError> {
        if let Some(reason) = self.refusal.clone() {
            return Ok(match option {
                opt::ABORT => {
                    self.reply(option, rep::ACK, &[]);
                    Progress::Abort
                }
                opt::EXPORT_NAME => Progress::Refused,
                _ => {
                    self.reply(option, rep::ERR_POLICY, reason.as_bytes());
                    Progress::NeedMore
                }
            });
        }
        match option {
            opt::EXPORT_NAME => {
                let name = String::from_utf8_lossy(data).into_owned();
                if !self.export.matches(&name) {
                    return Err(ProtoError::UnknownExport(name));
                }
                self.output
                    .extend_from_slice(&self.export.size.to_be_bytes());
                let flags = self.export.transmission_flags(self.structured);
                self.output.extend_from_slice(&flags.to_be_bytes());
                if !self.no_zeroes {
                    self.output.extend_from_slice(&[0u8; 124]);
                }
                Ok(Progress::Transmission)
            }
            opt::ABORT => {
                self.reply(option, rep::ACK, &[]);
                Ok(Progress::Abort)
            }
            opt::LIST => {
                if !data.is_empty() {
                    self.reply(option, rep::ERR_INVALID, b"NBD_OPT_LIST carries no data");
                    return Ok(Progress::NeedMore);
                }
                let name = self.export.name.clone().into_bytes();
                let mut p = Vec::with_capacity(4 + name.len() + self.export.description.len());
                p.extend_from_slice(&(name.len() as u32).to_be_bytes());
                p.extend_from_slice(&name);
                p.extend_from_slice(self.export.description.as_bytes());
                self.reply(option, rep::SERVER, &p);
                self.reply(option, rep::ACK, &[]);
                Ok(Progress::NeedMore)
            }
            opt::STARTTLS => {
                self.reply(option, rep::ERR_POLICY, b"this server does not offer TLS");
                Ok(Progress::NeedMore)
            }
            opt::STRUCTURED_REPLY => {
                if !data.is_empty() {
                    self.reply(
                        option,
                        rep::ERR_INVALID,
                        b"NBD_OPT_STRUCTURED_REPLY carries no data",
                    );
                    return Ok(Progress::NeedMore);
                }
                self.structured = true;
                self.reply(option, rep::ACK, &[]);
                Ok(Progress::NeedMore)
            }
            opt::INFO | opt::GO => self.info_or_go(option, data),
            _ => {
                let msg = format!("option {option} is not supported");
                self.reply(option, rep::ERR_UNSUP, msg.as_bytes());
                Ok(Progress::NeedMore)
            }
        }
    }

    fn info_or_go(&mut self, option: u32, data: &[u8]) -> Result<Progress, ProtoError> {
        let Some((name, requests)) = parse_info_request(data) else {
            self.reply(
                option,
                rep::ERR_INVALID,
                b"malformed NBD_OPT_INFO/NBD_OPT_GO data",
            );
            return Ok(Progress::NeedMore);
        };
        if !self.export.matches(&name) {
            let msg = format!("no export named {name:?}");
            self.reply(option, rep::ERR_UNKNOWN, msg.as_bytes());
            return Ok(Progress::NeedMore);
        }
        let mut e = Vec::with_capacity(10);
        e.extend_from_slice(&self.export.size.to_be_bytes());
        e.extend_from_slice(
            &self
                .export
                .transmission_flags(self.structured)
                .to_be_bytes(),
        );
        self.info(option, info::EXPORT, &e);
        if requests.contains(&info::NAME) {
            let n = self.export.name.clone();
            self.info(option, info::NAME, n.as_bytes());
        }
        if requests.contains(&info::DESCRIPTION) && !self.export.description.is_empty() {
            let d = self.export.description.clone();
            self.info(option, info::DESCRIPTION, d.as_bytes());
        }
        // Sent whether asked or not (the protocol allows it): clients that honour it
        // keep requests within the maximum.
        let b = self.export.block_sizes;
        let mut s = Vec::with_capacity(12);
        for v in [b.minimum, b.preferred, b.maximum] {
            s.extend_from_slice(&v.to_be_bytes());
        }
        self.info(option, info::BLOCK_SIZE, &s);
        self.reply(option, rep::ACK, &[]);
        Ok(if option == opt::GO {
            Progress::Transmission
        } else {
            Progress::NeedMore
        })
    }
}

/// `NBD_OPT_INFO`/`NBD_OPT_GO` data: 32-bit name length, name, 16-bit count, that many
/// 16-bit info requests, nothing after. `None` if it is not exactly that.
fn parse_info_request(data: &[u8]) -> Option<(String, Vec<u16>)> {
    if data.len() < 6 {
        return None;
    }
    let nlen = u32::from_be_bytes(data[0..4].try_into().ok()?) as usize;
    if nlen > data.len() - 6 {
        return None;
    }
    let name = std::str::from_utf8(&data[4..4 + nlen]).ok()?.to_string();
    let at = 4 + nlen;
    let count = u16::from_be_bytes(data[at..at + 2].try_into().ok()?) as usize;
    let rest = &data[at + 2..];
    if rest.len() != 2 * count {
        return None;
    }
    let requests = rest
        .chunks_exact(2)
        .map(|c| u16::from_be_bytes([c[0], c[1]]))
        .collect();
    Some((name, requests))
}

/// A request the server carries out.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Command {
    Read {
        offset: u64,
        length: u32,
    },
    Write {
        offset: u64,
        data: Bytes,
        fua: bool,
    },
    /// Make every write answered so far durable.
    Flush,
    Trim {
        offset: u64,
        length: u32,
        fua: bool,
    },
    WriteZeroes {
        offset: u64,
        length: u32,
        fua: bool,
        /// The client wants the zeros allocated (no hole punched).
        no_hole: bool,
    },
    /// `NBD_CMD_DISC`: finish what is in flight, then close. No reply.
    Disconnect,
}

/// A request refused without touching the device: answered with this error.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refusal {
    pub errno: u32,
    pub message: String,
}

/// One request from the client.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Request {
    pub handle: u64,
    /// The request type as sent (the reply to a READ is shaped differently).
    pub kind: u16,
    pub command: Result<Command, Refusal>,
    /// Payload bytes of a refused write still to come after what [`Transmission::parse`]
    /// already took off the buffer: the caller skips them before the next request. A
    /// refused write's payload is never buffered, however long the client says it is.
    pub discard: u32,
}

impl Request {
    pub fn is_read(&self) -> bool {
        self.kind == cmd::READ
    }
}

/// What the server answers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Reply {
    /// Success of a request without data (or a read of zero bytes).
    Done { handle: u64, read: bool },
    /// A read's data, covering its whole range from `offset`.
    Data {
        handle: u64,
        offset: u64,
        data: Bytes,
    },
    /// Failure, with a message for humans when structured replies carry it.
    Error {
        handle: u64,
        read: bool,
        errno: u32,
        message: String,
    },
}

impl Reply {
    /// The error reply to a refused request.
    pub fn refused(req: &Request, r: &Refusal) -> Reply {
        Reply::Error {
            handle: req.handle,
            read: req.is_read(),
            errno: r.errno,
            message: r.message.clone(),
        }
    }
}

/// The transmission phase of one client: request framing and checks, reply encoding.
#[derive(Debug, Clone)]
pub struct Transmission {
    export: Export,
    structured: bool,
}

impl Transmission {
    pub fn new(export: Export, structured: bool) -> Transmission {
        Transmission { export, structured }
    }

    pub fn structured(&self) -> bool {
        self.structured
    }

    pub fn export(&self) -> &Export {
        &self.export
    }

    /// Bytes `buf` must hold before the request at its front is complete (0 if it is,
    /// if not even the header is in, or if it is a write that will be refused, whose
    /// payload is skipped rather than buffered). Lets a reader reserve a write's payload
    /// at once; never more than the advertised maximum.
    pub fn missing(&self, buf: &[u8]) -> usize {
        let Some(h) = Header::peek(buf) else {
            return 0;
        };
        if h.kind != cmd::WRITE || self.check(&h).is_err() {
            return 0;
        }
        (REQUEST_LEN + h.length as usize).saturating_sub(buf.len())
    }

    /// Takes the first complete request off `buf` (`None`: not complete yet). A request
    /// that cannot be served comes back with a [`Refusal`]; only framing errors, after which
    /// the stream cannot be followed, are `Err`. A refused write is answered as soon as its
    /// header is in: whatever of its payload `buf` holds is dropped and the rest is left to
    /// the caller to skip ([`Request::discard`]), so a peer's length is never allocated
    /// unless the write is carried out (and then it is at most the advertised maximum).
    pub fn parse(&self, buf: &mut BytesMut) -> Result<Option<Request>, ProtoError> {
        let Some(h) = Header::peek(buf) else {
            return Ok(None);
        };
        if h.magic != REQUEST_MAGIC {
            return Err(ProtoError::RequestMagic(h.magic));
        }
        let mut command = self.check(&h);
        let mut discard = 0;
        if h.kind == cmd::WRITE {
            match &mut command {
                Ok(Command::Write { data, .. }) => {
                    if buf.len() < REQUEST_LEN + h.length as usize {
                        return Ok(None);
                    }
                    buf.advance(REQUEST_LEN);
                    *data = buf.split_to(h.length as usize).freeze();
                }
                _ => {
                    buf.advance(REQUEST_LEN);
                    let here = buf.len().min(h.length as usize);
                    buf.advance(here);
                    discard = h.length - here as u32;
                }
            }
        } else {
            buf.advance(REQUEST_LEN);
        }
        Ok(Some(Request {
            handle: h.handle,
            kind: h.kind,
            command,
            discard,
        }))
    }

    /// The command a request header asks for, or why it is refused. A write's data is
    /// left empty (the caller fills it in once the payload is in).
    fn check(&self, h: &Header) -> Result<Command, Refusal> {
        let Header {
            flags,
            kind,
            offset,
            length,
            ..
        } = *h;
        let refuse = |errno: u32, message: String| Err(Refusal { errno, message });
        let e = &self.export;
        let mut allowed = if e.read_only { 0 } else { cflag::FUA };
        match kind {
            cmd::READ if self.structured => allowed |= cflag::DF,
            cmd::WRITE_ZEROES => allowed |= cflag::NO_HOLE,
            _ => {}
        }
        if flags & !allowed != 0 {
            return refuse(
                errno::EINVAL,
                format!("command flags 0x{flags:04x} not valid for request type {kind}"),
            );
        }
        let fua = flags & cflag::FUA != 0;
        let in_range = offset
            .checked_add(length as u64)
            .is_some_and(|end| end <= e.size);
        let past_end = || {
            format!(
                "{length} bytes at offset {offset} reach past the end of the {}-byte export",
                e.size
            )
        };
        let too_large = || {
            format!(
                "a {} of {length} bytes (the maximum is {})",
                if kind == cmd::READ { "read" } else { "write" },
                e.block_sizes.maximum
            )
        };
        let writes = matches!(kind, cmd::WRITE | cmd::TRIM | cmd::WRITE_ZEROES);
        if writes && e.read_only {
            return refuse(errno::EPERM, "the export is read-only".into());
        }
        match kind {
            cmd::READ => {
                if length > e.block_sizes.maximum {
                    return refuse(errno::EINVAL, too_large());
                }
                if !in_range {
                    return refuse(errno::EINVAL, past_end());
                }
                Ok(Command::Read { offset, length })
            }
            cmd::WRITE => {
                // The protocol's answer to a payload beyond the advertised maximum is
                // EINVAL (as for a read); the payload is then skipped, not buffered.
                if length > e.block_sizes.maximum {
                    return refuse(errno::EINVAL, too_large());
                }
                if !in_range {
                    return refuse(errno::ENOSPC, past_end());
                }
                Ok(Command::Write {
                    offset,
                    data: Bytes::new(),
                    fua,
                })
            }
            cmd::DISC => Ok(Command::Disconnect),
            cmd::FLUSH => {
                if offset != 0 || length != 0 {
                    return refuse(
                        errno::EINVAL,
                        "NBD_CMD_FLUSH with a nonzero offset or length".into(),
                    );
                }
                Ok(Command::Flush)
            }
            cmd::TRIM => {
                if !in_range {
                    return refuse(errno::EINVAL, past_end());
                }
                Ok(Command::Trim {
                    offset,
                    length,
                    fua,
                })
            }
            cmd::WRITE_ZEROES => {
                if !in_range {
                    return refuse(errno::ENOSPC, past_end());
                }
                Ok(Command::WriteZeroes {
                    offset,
                    length,
                    fua,
                    no_hole: flags & cflag::NO_HOLE != 0,
                })
            }
            other => refuse(errno::EINVAL, format!("unknown request type {other}")),
        }
    }

    /// The bytes of a reply: a header and, for read data, the data itself (sent after the
    /// header, not copied into it).
    pub fn encode(&self, reply: &Reply) -> (Vec<u8>, Bytes) {
        encode_reply(self.structured, reply)
    }
}

/// The fixed part of a request, as sent.
#[derive(Debug, Clone, Copy)]
struct Header {
    magic: u32,
    flags: u16,
    kind: u16,
    handle: u64,
    offset: u64,
    length: u32,
}

impl Header {
    /// The header at the front of `buf`, if all of it is in.
    fn peek(buf: &[u8]) -> Option<Header> {
        let b: &[u8; REQUEST_LEN] = buf.get(..REQUEST_LEN)?.try_into().ok()?;
        let u16_at = |i: usize| u16::from_be_bytes([b[i], b[i + 1]]);
        let u32_at = |i: usize| u32::from_be_bytes([b[i], b[i + 1], b[i + 2], b[i + 3]]);
        let u64_at = |i: usize| (u64::from(u32_at(i)) << 32) | u64::from(u32_at(i + 4));
        Some(Header {
            magic: u32_at(0),
            flags: u16_at(4),
            kind: u16_at(6),
            handle: u64_at(8),
            offset: u64_at(16),
            length: u32_at(24),
        })
    }
}

/// Encodes `reply` as a simple reply or, when structured replies were negotiated, as the
/// chunks the protocol requires (every read answered structured; other successes simple).
pub fn encode_reply(structured: bool, reply: &Reply) -> (Vec<u8>, Bytes) {
    match reply {
        Reply::Done { handle, read } => {
            if structured && *read {
                (
                    chunk_header(REPLY_FLAG_DONE, REPLY_TYPE_NONE, *handle, 0),
                    Bytes::new(),
                )
            } else {
                (simple_header(0, *handle), Bytes::new())
            }
        }
        Reply::Data {
            handle,
            offset,
            data,
        } => {
            if !structured {
                return (simple_header(0, *handle), data.clone());
            }
            if data.is_empty() {
                return (
                    chunk_header(REPLY_FLAG_DONE, REPLY_TYPE_NONE, *handle, 0),
                    Bytes::new(),
                );
            }
            // One content chunk, final: the data is complete before its header is sent.
            let len = 8 + data.len() as u32;
            let mut h = chunk_header(REPLY_FLAG_DONE, REPLY_TYPE_OFFSET_DATA, *handle, len);
            h.extend_from_slice(&offset.to_be_bytes());
            (h, data.clone())
        }
        Reply::Error {
            handle,
            errno,
            message,
            ..
        } => {
            let errno = if *errno == 0 { errno::EIO } else { *errno };
            if !structured {
                // No payload after an error, even for a read.
                return (simple_header(errno, *handle), Bytes::new());
            }
            let msg = truncate_utf8(message, 1024).as_bytes();
            let len = 6 + msg.len() as u32;
            let mut h = chunk_header(REPLY_FLAG_DONE, REPLY_TYPE_ERROR, *handle, len);
            h.extend_from_slice(&errno.to_be_bytes());
            h.extend_from_slice(&(msg.len() as u16).to_be_bytes());
            h.extend_from_slice(msg);
            (h, Bytes::new())
        }
    }
}

fn simple_header(errno: u32, handle: u64) -> Vec<u8> {
    let mut h = Vec::with_capacity(SIMPLE_REPLY_LEN);
    h.extend_from_slice(&SIMPLE_REPLY_MAGIC.to_be_bytes());
    h.extend_from_slice(&errno.to_be_bytes());
    h.extend_from_slice(&handle.to_be_bytes());
    h
}

fn chunk_header(flags: u16, kind: u16, handle: u64, len: u32) -> Vec<u8> {
    let mut h = Vec::with_capacity(CHUNK_HEADER_LEN + 8);
    h.extend_from_slice(&STRUCTURED_REPLY_MAGIC.to_be_bytes());
    h.extend_from_slice(&flags.to_be_bytes());
    h.extend_from_slice(&kind.to_be_bytes());
    h.extend_from_slice(&handle.to_be_bytes());
    h.extend_from_slice(&len.to_be_bytes());
    h
}

fn truncate_utf8(s: &str, max: usize) -> &str {
    if s.len() <= max {
        return s;
    }
    let mut end = max;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    &s[..end]
}

#[cfg(test)]
mod tests;
