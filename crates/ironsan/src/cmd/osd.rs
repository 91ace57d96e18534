//! `ironsan osd URL <command>`: an OSD-2 client over iSCSI or iSER. Each command is one OSD
//! CDB (236 bytes, in an Extended CDB AHS) built by the `osd` crate; attribute lists and the
//! data ride in one bidirectional command where the standard puts them.

use std::io::{Read, Write};
use std::path::PathBuf;
use std::time::Instant;

use anyhow::{bail, Context, Result};
use bytes::Bytes;
use clap::Subcommand;
use iscsi_initiator::{CommandRequest, CommandResult, IscsiUrl, Session};
use osd::attr::{number, page, AttrId, Attribute};
use osd::client::{self, Request};
use report::{Cell, LinePlot, Series, Table, TickLabels};

use super::blockbench::write_file;
use super::initiator::{run_interruptible, LoginOpts};

#[derive(clap::Args)]
pub struct OsdArgs {
    /// iscsi://HOST[:PORT]/TARGET-IQN/LUN or iser://... naming an OSD logical unit
    pub url: String,
    #[command(subcommand)]
    pub command: OsdCommand,
    #[command(flatten)]
    pub login: LoginOpts,
}

#[derive(Subcommand)]
pub enum OsdCommand {
    /// FORMAT OSD: remove every partition and object (capacity 0 keeps the configured one).
    Format {
        #[arg(long, default_value = "0", value_parser = size)]
        capacity: u64,
    },
    /// CREATE PARTITION (without an id the device chooses one); prints its id.
    CreatePartition { partition: Option<Id> },
    /// REMOVE PARTITION (it must hold no objects).
    RemovePartition { partition: Id },
    /// CREATE a user object (without an id the device chooses one); prints its id.
    Create { partition: Id, object: Option<Id> },
    /// REMOVE a user object.
    Remove { partition: Id, object: Id },
    /// CREATE COLLECTION; prints its id.
    CreateCollection {
        partition: Id,
        collection: Option<Id>,
    },
    /// REMOVE COLLECTION (--force: even with members).
    RemoveCollection {
        partition: Id,
        collection: Id,
        #[arg(long)]
        force: bool,
    },
    /// WRITE stdin (or --input) into an object at --offset.
    Write {
        partition: Id,
        object: Id,
        #[arg(long, default_value = "0", value_parser = size)]
        offset: u64,
        #[arg(long, short)]
        input: Option<PathBuf>,
    },
    /// APPEND stdin (or --input) to an object; prints where it landed.
    Append {
        partition: Id,
        object: Id,
        #[arg(long, short)]
        input: Option<PathBuf>,
    },
    /// READ an object to stdout (or --output); default: from --offset to its end.
    Read {
        partition: Id,
        object: Id,
        #[arg(long, default_value = "0", value_parser = size)]
        offset: u64,
        #[arg(long, value_parser = size)]
        length: Option<u64>,
        #[arg(long, short)]
        output: Option<PathBuf>,
    },
    /// CLEAR (zero) a byte range of an object.
    Clear(ObjectRange),
    /// PUNCH (deallocate) a byte range of an object.
    Punch(ObjectRange),
    /// FLUSH an object, a partition (no object) or the whole OSD (neither).
    Flush {
        partition: Option<Id>,
        object: Option<Id>,
    },
    /// LIST the partitions (no partition given) or the objects of a partition.
    List { partition: Option<Id> },
    /// LIST COLLECTION: the members of a collection.
    ListCollection { partition: Id, collection: Id },
    /// GET ATTRIBUTES: one attribute, or a whole page (no number).
    GetAttr {
        partition: Id,
        object: Id,
        page: Id,
        number: Option<Id>,
    },
    /// SET ATTRIBUTES: one attribute; VALUE is text, or hex bytes after 0x.
    SetAttr {
        partition: Id,
        object: Id,
        page: Id,
        number: Id,
        value: String,
    },
    /// Object bench: create, write, read and remove rates per object size.
    Bench(ObjectBenchArgs),
}

/// A byte range of one object.
#[derive(clap::Args)]
pub struct ObjectRange {
    partition: Id,
    object: Id,
    #[arg(long, value_parser = size)]
    offset: u64,
    #[arg(long, value_parser = size)]
    length: u64,
}

#[derive(clap::Args)]
pub struct ObjectBenchArgs {
    /// Object sizes: one (1m) or a doubling sweep (4k..16m).
    #[arg(long, default_value = "4k..16m")]
    pub size: String,
    /// Bytes written (and read) per size; the object count is this over the size (2..256).
    #[arg(long, default_value = "64MiB", value_parser = size)]
    pub bytes: u64,
    #[arg(long)]
    pub json: Option<PathBuf>,
    #[arg(long)]
    pub csv: Option<PathBuf>,
    #[arg(long)]
    pub svg: Option<PathBuf>,
}

/// An id, page or attribute number: decimal or 0x-hex.
#[derive(Clone, Copy, Debug)]
pub struct Id(u64);

impl std::str::FromStr for Id {
    type Err = String;
    fn from_str(s: &str) -> Result<Id, String> {
        let v = match s.strip_prefix("0x").or_else(|| s.strip_prefix("0X")) {
            Some(hex) => u64::from_str_radix(hex, 16),
            None => s.parse(),
        };
        v.map(Id)
            .map_err(|_| format!("'{s}' is not a number (decimal or 0x-hex)"))
    }
}

fn size(s: &str) -> Result<u64, String> {
    report::parse_size(s).map_err(|e| e.to_string())
}

fn u32_id(what: &str, id: Id) -> Result<u32> {
    u32::try_from(id.0).with_context(|| format!("{what} 0x{:x} does not fit in 32 bits", id.0))
}

pub fn run(args: OsdArgs) -> Result<()> {
    let url = IscsiUrl::parse_lun(&args.url)?;
    let cfg = args.login.config(&url)?;
    run_interruptible(&args.login, async {
        let s = transports::connect_session(&url, cfg).await?;
        let osd = Osd {
            lun: s.default_lun(),
            session: &s,
        };
        let r = osd.run(args.command).await;
        let _ = s.logout().await;
        r
    })
}

struct Osd<'a> {
    session: &'a Session,
    lun: u16,
}

impl Osd<'_> {
    /// Sends one OSD command; the data-in of a GOOD status (or of a READ past the end).
    /// The request's data-out becomes the command's without a copy.
    async fn send(&self, what: &str, req: Request) -> Result<CommandResult> {
        let cmd = CommandRequest::with_data(
            self.lun,
            req.cdb.encode().to_vec(),
            Bytes::from(req.data_out),
            req.data_in_len,
        );
        let r = self.session.execute(cmd).await?;
        if read_past_end(&r) {
            return Ok(r);
        }
        Ok(r.good(what)?)
    }

    /// Sends a command that retrieves attributes; the attributes.
    async fn retrieve(&self, what: &str, req: Request) -> Result<Vec<Attribute>> {
        let at = req.retrieved_at().unwrap_or(0);
        let r = self.send(what, req).await?;
        client::parse_retrieved(&r.data, at)
            .map_err(|e| anyhow::anyhow!("{what}: retrieved attributes: {e:?}"))
    }

    /// The current command page of a command that asked for it: the id it created.
    async fn created(&self, what: &str, req: Request) -> Result<client::CurrentCommand> {
        let attrs = self.retrieve(what, req).await?;
        client::current_command(&attrs)
            .with_context(|| format!("{what}: the target returned no current command page"))
    }

    async fn logical_length(&self, partition: u64, object: u64) -> Result<u64> {
        let ids = [AttrId {
            page: page::USER_INFO,
            number: number::LOGICAL_LENGTH,
        }];
        let req = client::get_attributes(partition, object, &ids, 64);
        let attrs = self.retrieve("GET ATTRIBUTES", req).await?;
        match attrs.first().and_then(|a| a.value.as_deref()) {
            Some(v) if v.len() == 8 => Ok(u64::from_be_bytes(v.try_into().expect("8 bytes"))),
            _ => bail!("the object's logical length attribute is missing"),
        }
    }

    async fn list_all(&self, mut next: impl FnMut(u64) -> Request) -> Result<Vec<u64>> {
        let mut ids = Vec::new();
        let mut from = 0;
        for _ in 0..100_000 {
            let r = self.send("LIST", next(from)).await?;
            let page =
                client::parse_list(&r.data).map_err(|e| anyhow::anyhow!("LIST data: {e:?}"))?;
            ids.extend(page.ids);
            if page.continuation == 0 {
                return Ok(ids);
            }
            from = page.continuation;
        }
        bail!("LIST did not end after 100000 pages")
    }

    async fn run(&self, cmd: OsdCommand) -> Result<()> {
        use OsdCommand as C;
        match cmd {
            C::Format { capacity } => {
                self.send("FORMAT OSD", client::format(capacity)).await?;
            }
            C::CreatePartition { partition } => {
                let req = client::create_partition(partition.map_or(0, |p| p.0));
                let cc = self.created("CREATE PARTITION", req).await?;
                println!("0x{:x}", cc.partition);
            }
            C::RemovePartition { partition } => {
                self.send("REMOVE PARTITION", client::remove_partition(partition.0))
                    .await?;
            }
            C::Create { partition, object } => {
                let req = client::create(partition.0, object.map_or(0, |o| o.0), 1);
                let cc = self.created("CREATE", req).await?;
                println!("0x{:x}", cc.object);
            }
            C::Remove { partition, object } => {
                self.send("REMOVE", client::remove(partition.0, object.0))
                    .await?;
            }
            C::CreateCollection {
                partition,
                collection,
            } => {
                let req = client::create_collection(partition.0, collection.map_or(0, |c| c.0));
                let cc = self.created("CREATE COLLECTION", req).await?;
                println!("0x{:x}", cc.object);
            }
            C::RemoveCollection {
                partition,
                collection,
                force,
            } => {
                let req = client::remove_collection(partition.0, collection.0, force);
                self.send("REMOVE COLLECTION", req).await?;
            }
            C::Write {
                partition,
                object,
                offset,
                input,
            } => {
                let data = read_input(input.as_ref())?;
                let req = client::write(partition.0, object.0, offset, &data);
                self.send("WRITE", req).await?;
            }
            C::Append {
                partition,
                object,
                input,
            } => {
                let data = read_input(input.as_ref())?;
                let cc = self
                    .created("APPEND", client::append(partition.0, object.0, &data))
                    .await?;
                if let Some(at) = cc.append_address {
                    println!("appended {} bytes at {at}", data.len());
                }
            }
            C::Read {
                partition,
                object,
                offset,
                length,
                output,
            } => {
                self.read(partition.0, object.0, offset, length, output)
                    .await?
            }
            C::Clear(r) => {
                let req = client::clear(r.partition.0, r.object.0, r.offset, r.length);
                self.send("CLEAR", req).await?;
            }
            C::Punch(r) => {
                let req = client::punch(r.partition.0, r.object.0, r.offset, r.length);
                self.send("PUNCH", req).await?;
            }
            C::Flush { partition, object } => {
                let req = match (partition, object) {
                    (Some(p), Some(o)) => client::flush(p.0, o.0),
                    (Some(p), None) => client::flush_partition(p.0),
                    _ => client::flush_osd(),
                };
                self.send("FLUSH", req).await?;
            }
            C::List { partition } => {
                let pid = partition.map_or(0, |p| p.0);
                for id in self
                    .list_all(|from| client::list(pid, from, 64 << 10))
                    .await?
                {
                    println!("0x{id:x}");
                }
            }
            C::ListCollection {
                partition,
                collection,
            } => {
                let (p, c) = (partition.0, collection.0);
                for id in self
                    .list_all(|from| client::list_collection(p, c, from, 64 << 10))
                    .await?
                {
                    println!("0x{id:x}");
                }
            }
            C::GetAttr {
                partition,
                object,
                page,
                number,
            } => {
                let page = u32_id("page", page)?;
                let req = match number {
                    Some(n) => {
                        let ids = [AttrId {
                            page,
                            number: u32_id("attribute number", n)?,
                        }];
                        client::get_attributes(partition.0, object.0, &ids, 64 << 10)
                    }
                    None => client::get_page(partition.0, object.0, page, 64 << 10),
                };
                for a in self.retrieve("GET ATTRIBUTES", req).await? {
                    println!("{}", describe_attribute(&a));
                }
            }
            C::SetAttr {
                partition,
                object,
                page,
                number,
                value,
            } => {
                let value = parse_value(&value)?;
                let a = Attribute::new(u32_id("page", page)?, u32_id("number", number)?, value);
                let req = client::set_attributes(partition.0, object.0, &[a]);
                self.send("SET ATTRIBUTES", req).await?;
            }
            C::Bench(b) => self.bench(&b).await?,
        }
        Ok(())
    }

    async fn read(
        &self,
        partition: u64,
        object: u64,
        offset: u64,
        length: Option<u64>,
        output: Option<PathBuf>,
    ) -> Result<()> {
        let len = match length {
            Some(l) => l,
            None => self
                .logical_length(partition, object)
                .await?
                .saturating_sub(offset),
        };
        let mut out: Box<dyn Write> = match &output {
            Some(p) => Box::new(
                std::fs::File::create(p).with_context(|| format!("creating {}", p.display()))?,
            ),
            None => Box::new(std::io::stdout().lock()),
        };
        // In pieces the target's data-in limit allows.
        let mut at = 0u64;
        while at < len {
            let n = (len - at).min(16 << 20) as u32;
            let r = self
                .send("READ", client::read(partition, object, offset + at, n))
                .await?;
            out.write_all(&r.data)?;
            if r.data.len() < n as usize {
                break; // the object ends here
            }
            at += u64::from(n);
        }
        out.flush()?;
        Ok(())
    }

    async fn bench(&self, a: &ObjectBenchArgs) -> Result<()> {
        let sizes = super::blockbench::sizes(&a.size)?;
        let cc = self
            .created("CREATE PARTITION", client::create_partition(0))
            .await?;
        let pid = cc.partition;
        let mut table = Table::new([
            "size",
            "objects",
            "create/s",
            "write MB/s",
            "read MB/s",
            "remove/s",
        ]);
        let mut series: [Vec<(f64, f64)>; 2] = [Vec::new(), Vec::new()];
        let counts: Vec<u64> = sizes
            .iter()
            .map(|&size| (a.bytes / u64::from(size)).clamp(2, 256))
            .collect();
        // Four commands per object: create, write, read, remove.
        let bar = super::progress::steps(4 * counts.iter().sum::<u64>(), "osd bench");
        for (&size, &count) in sizes.iter().zip(&counts) {
            bar.set_message(report::format_size(u64::from(size)));
            let row = self.bench_size(pid, size, count, &bar).await?;
            table.push_row([
                Cell::Text(report::format_size(u64::from(size))),
                Cell::Int(count as i64),
                Cell::float(row[0], 0),
                Cell::float(row[1], 1),
                Cell::float(row[2], 1),
                Cell::float(row[3], 0),
            ]);
            series[0].push((f64::from(size), row[1]));
            series[1].push((f64::from(size), row[2]));
        }
        bar.finish_and_clear();
        self.send("REMOVE PARTITION", client::remove_partition(pid))
            .await?;
        print!("{table}");
        write_reports(a, &table, series)
    }

    /// create/s, write MB/s, read MB/s, remove/s for `count` objects of `size` bytes; `bar`
    /// counts the commands.
    async fn bench_size(
        &self,
        pid: u64,
        size: u32,
        count: u64,
        bar: &indicatif::ProgressBar,
    ) -> Result<[f64; 4]> {
        let data = pattern(size as usize);
        let t = Instant::now();
        let mut ids = Vec::with_capacity(count as usize);
        for _ in 0..count {
            ids.push(
                self.created("CREATE", client::create(pid, 0, 1))
                    .await?
                    .object,
            );
            bar.inc(1);
        }
        let create = count as f64 / t.elapsed().as_secs_f64();
        let t = Instant::now();
        for &id in &ids {
            self.send("WRITE", client::write(pid, id, 0, &data)).await?;
            bar.inc(1);
        }
        let write = (count * u64::from(size)) as f64 / t.elapsed().as_secs_f64() / 1e6;
        let t = Instant::now();
        for &id in &ids {
            let r = self.send("READ", client::read(pid, id, 0, size)).await?;
            if r.data[..] != data[..] {
                bail!("object 0x{id:x} read back differs from what was written");
            }
            bar.inc(1);
        }
        let read = (count * u64::from(size)) as f64 / t.elapsed().as_secs_f64() / 1e6;
        let t = Instant::now();
        for &id in &ids {
            self.send("REMOVE", client::remove(pid, id)).await?;
            bar.inc(1);
        }
        let remove = count as f64 / t.elapsed().as_secs_f64();
        Ok([create, write, read, remove])
    }
}

fn write_reports(a: &ObjectBenchArgs, table: &Table, series: [Vec<(f64, f64)>; 2]) -> Result<()> {
    if let Some(p) = &a.json {
        write_file(p, &table.to_json_string())?;
    }
    if let Some(p) = &a.csv {
        write_file(p, &table.to_csv())?;
    }
    if let Some(p) = &a.svg {
        let [w, r] = series;
        let plot = LinePlot {
            title: "OSD object write and read throughput".into(),
            x_label: "object size".into(),
            y_label: "MB/s".into(),
            x_log2: true,
            y_log: false,
            x_ticks: TickLabels::Bytes,
            y_ticks: TickLabels::Number,
            series: vec![Series::new("write", w), Series::new("read", r)],
        };
        write_file(p, &plot.to_svg())?;
    }
    Ok(())
}

/// RECOVERED ERROR, READ PAST END OF USER OBJECT: the data up to the end came with it.
fn read_past_end(r: &CommandResult) -> bool {
    r.status == iscsi_initiator::scsi::status::CHECK_CONDITION
        && iscsi_initiator::scsi::Sense::parse(&r.sense)
            .is_some_and(|s| (s.key, s.asc, s.ascq) == osd::sense::READ_PAST_END)
}

fn read_input(input: Option<&PathBuf>) -> Result<Vec<u8>> {
    let mut data = Vec::new();
    match input {
        Some(p) => {
            data = std::fs::read(p).with_context(|| format!("reading {}", p.display()))?;
        }
        None => {
            std::io::stdin().read_to_end(&mut data)?;
        }
    }
    Ok(data)
}

fn parse_value(v: &str) -> Result<Vec<u8>> {
    match v.strip_prefix("0x") {
        Some(hex) if hex.len() % 2 == 0 => (0..hex.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(&hex[i..i + 2], 16))
            .collect::<Result<_, _>>()
            .with_context(|| format!("value {v:?}: not hex bytes")),
        Some(_) => bail!("value {v:?}: hex needs an even number of digits"),
        None => Ok(v.as_bytes().to_vec()),
    }
}

/// `page 0x1 attr 0x82 = 4096 (0x0000000000001000)`: numbers of 8 bytes or fewer also in
/// decimal, printable text as text.
fn describe_attribute(a: &Attribute) -> String {
    let head = format!("page 0x{:x} attr 0x{:x}", a.page, a.number);
    let Some(v) = &a.value else {
        return format!("{head} undefined");
    };
    let hex: String = v.iter().map(|b| format!("{b:02x}")).collect();
    if !v.is_empty() && v.len() <= 8 && a.number != 0 {
        let n = v.iter().fold(0u64, |n, b| (n << 8) | u64::from(*b));
        return format!("{head} = {n} (0x{hex})");
    }
    match std::str::from_utf8(v) {
        Ok(s) if !s.is_empty() && s.chars().all(|c| !c.is_control() || c == '\0') => {
            format!("{head} = {:?}", s.trim_end_matches('\0'))
        }
        _ => format!("{head} = 0x{hex}"),
    }
}

/// Bytes that differ per position, so a misplaced block shows.
fn pattern(len: usize) -> Vec<u8> {
    (0..len).map(|i| (i * 7 + i / 4096) as u8).collect()
}
