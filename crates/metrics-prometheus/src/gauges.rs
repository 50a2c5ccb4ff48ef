//! What is read when Prometheus scrapes: the upstreams, the sessions, the working sets and
//! the execution-log writer, through functions the host gives (each adapter keeps its own
//! state; nothing is pushed here on their paths).

use std::sync::{
    Mutex, MutexGuard, PoisonError,
    atomic::{AtomicU64, Ordering},
};

use prometheus_client::{
    collector::Collector,
    encoding::{DescriptorEncoder, EncodeMetric},
    metrics::{MetricType, counter::ConstCounter, gauge::ConstGauge},
};

use crate::Count;

/// An upstream MCP server's connection state, as the metrics name it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum UpstreamState {
    /// The first connection attempt has not finished.
    Connecting,
    /// Connected: calls go through.
    Connected,
    /// A dropped connection is being dialled again.
    Reconnecting,
    /// Down; retried in the background.
    Down,
    /// Refused for good, or closed.
    Stopped,
    /// Disabled by an operator (the admin page): closed until enabled again.
    Disabled,
}

impl UpstreamState {
    const ALL: [UpstreamState; 6] = [
        UpstreamState::Connecting,
        UpstreamState::Connected,
        UpstreamState::Reconnecting,
        UpstreamState::Down,
        UpstreamState::Stopped,
        UpstreamState::Disabled,
    ];

    fn as_str(self) -> &'static str {
        match self {
            UpstreamState::Connecting => "connecting",
            UpstreamState::Connected => "connected",
            UpstreamState::Reconnecting => "reconnecting",
            UpstreamState::Down => "down",
            UpstreamState::Stopped => "stopped",
            UpstreamState::Disabled => "disabled",
        }
    }
}

/// One upstream MCP server at a scrape.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct UpstreamReading {
    /// Its configured name.
    pub server: String,
    /// Its state now.
    pub state: UpstreamState,
    /// Connection attempts.
    pub dials: u64,
    /// Successful connections (the first included).
    pub connects: u64,
    /// Connections lost after being up.
    pub drops: u64,
    /// A server that acts for the user: the users with a connection of their own now.
    pub user_connections: Option<u64>,
}

impl UpstreamReading {
    /// A reading.
    pub fn new(
        server: impl Into<String>,
        state: UpstreamState,
        dials: u64,
        connects: u64,
        drops: u64,
    ) -> Self {
        UpstreamReading {
            server: server.into(),
            state,
            dials,
            connects,
            drops,
            user_connections: None,
        }
    }

    /// The users with a connection of their own to it now (a server that acts for the user).
    pub fn with_user_connections(mut self, users: u64) -> Self {
        self.user_connections = Some(users);
        self
    }
}

/// The sessions' working sets at a scrape.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct WorkingSetsReading {
    /// Sessions held in memory.
    pub sessions: u64,
    /// Tools in all their working sets together.
    pub tools: u64,
    /// Tools in the largest working set.
    pub largest: u64,
}

impl WorkingSetsReading {
    /// A reading from each session's working-set size.
    pub fn of_sizes(sizes: impl IntoIterator<Item = usize>) -> Self {
        sizes
            .into_iter()
            .fold(WorkingSetsReading::default(), |mut r, n| {
                r.sessions += 1;
                r.tools += n as u64;
                r.largest = r.largest.max(n as u64);
                r
            })
    }
}

/// The execution-log writer's counters at a scrape.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct LogWriterReading {
    /// Rows committed.
    pub written: u64,
    /// Rows that could not be written after every retry, or past the most the writer
    /// holds while the database refuses writes: lost.
    pub dropped: u64,
    /// Whether the database refuses writes now (the writer holds the rows and retries).
    pub failing: bool,
}

impl LogWriterReading {
    /// A reading.
    pub fn new(written: u64, dropped: u64, failing: bool) -> Self {
        LogWriterReading {
            written,
            dropped,
            failing,
        }
    }
}

/// The process at a scrape.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct ProcessReading {
    /// Resident memory, in bytes.
    pub resident_bytes: u64,
    /// Bytes the allocator has handed out and not had back, where the allocator says
    /// (glibc's). Unlike the resident memory it leaves out what the allocator keeps after a
    /// free, so it is the figure that grows with a leak.
    pub heap_in_use_bytes: Option<u64>,
    /// Bytes the allocator keeps free in its heaps after frees, to hand out again, where
    /// the allocator says: neither in use nor a leak (the pages it gave back to the system
    /// are not resident).
    pub heap_free_bytes: Option<u64>,
    /// Times the allocator has been asked to give its free pages back to the system.
    pub heap_trims: Option<u64>,
    /// Of the heap in use, what an embedded database engine holds (SQLite's page caches
    /// and statements), where the store is one.
    pub embedded_store_bytes: Option<u64>,
    /// Threads.
    pub threads: u64,
    /// Open file descriptors.
    pub open_fds: u64,
}

impl ProcessReading {
    /// A reading.
    pub fn new(resident_bytes: u64, threads: u64, open_fds: u64) -> Self {
        ProcessReading {
            resident_bytes,
            heap_in_use_bytes: None,
            heap_free_bytes: None,
            heap_trims: None,
            embedded_store_bytes: None,
            threads,
            open_fds,
        }
    }

    /// With what the embedded database engine holds.
    pub fn with_embedded_store(mut self, bytes: u64) -> Self {
        self.embedded_store_bytes = Some(bytes);
        self
    }

    /// With the allocator's bytes in use.
    pub fn with_heap_in_use(mut self, bytes: u64) -> Self {
        self.heap_in_use_bytes = Some(bytes);
        self
    }

    /// With the times the allocator was asked to give its free pages back.
    pub fn with_heap_trims(mut self, trims: u64) -> Self {
        self.heap_trims = Some(trims);
        self
    }

    /// With the bytes the allocator keeps free.
    pub fn with_heap_free(mut self, bytes: u64) -> Self {
        self.heap_free_bytes = Some(bytes);
        self
    }
}

type Read<T> = Mutex<Option<Box<dyn Fn() -> T + Send + Sync>>>;

/// Locks a mutex, taking the value of one a panic poisoned (a reading is a snapshot).
pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

#[derive(Default)]
pub(crate) struct Gauges {
    pub(crate) upstreams: Read<Vec<UpstreamReading>>,
    pub(crate) working_sets: Read<WorkingSetsReading>,
    pub(crate) log_writer: Read<LogWriterReading>,
    pub(crate) process: Read<ProcessReading>,
    pub(crate) sessions_open: AtomicU64,
    /// Whether anything set `sessions_open` (a process without an MCP server has none).
    pub(crate) sessions_known: AtomicU64,
    /// Rows handed to the recorder ([`crate::recorder`]).
    pub(crate) rows_handed: Count,
}

impl std::fmt::Debug for Gauges {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Gauges").finish_non_exhaustive()
    }
}

/// One counter or gauge with no labels.
fn single(
    encoder: &mut DescriptorEncoder<'_>,
    (name, help, kind): (&str, &str, MetricType),
    value: u64,
) -> std::fmt::Result {
    let series = encoder.encode_descriptor(name, help, None, kind)?;
    match kind {
        MetricType::Counter => ConstCounter::new(value).encode(series),
        _ => ConstGauge::new(value).encode(series),
    }
}

fn gauge(
    encoder: &mut DescriptorEncoder<'_>,
    name: &str,
    help: &str,
    value: u64,
) -> std::fmt::Result {
    single(encoder, (name, help, MetricType::Gauge), value)
}

fn counter(
    encoder: &mut DescriptorEncoder<'_>,
    name: &str,
    help: &str,
    value: u64,
) -> std::fmt::Result {
    single(encoder, (name, help, MetricType::Counter), value)
}

/// A counter or gauge with one series per upstream server.
fn per_server(
    encoder: &mut DescriptorEncoder<'_>,
    (name, help, kind): (&str, &str, MetricType),
    upstreams: &[UpstreamReading],
    value: impl Fn(&UpstreamReading) -> u64,
) -> std::fmt::Result {
    let mut family = encoder.encode_descriptor(name, help, None, kind)?;
    for u in upstreams {
        let labels = [("server", u.server.as_str())];
        let series = family.encode_family(&labels)?;
        match kind {
            MetricType::Counter => ConstCounter::new(value(u)).encode(series)?,
            _ => ConstGauge::new(value(u)).encode(series)?,
        }
    }
    Ok(())
}

impl Collector for Gauges {
    fn encode(&self, mut encoder: DescriptorEncoder<'_>) -> std::fmt::Result {
        if self.sessions_known.load(Ordering::Relaxed) == 1 {
            gauge(
                &mut encoder,
                "sessions_open",
                "MCP sessions open over HTTP",
                self.sessions_open.load(Ordering::Relaxed),
            )?;
        }
        if let Some(read) = &*lock(&self.working_sets) {
            let r = read();
            gauge(
                &mut encoder,
                "working_sets",
                "Sessions whose working set is held in memory",
                r.sessions,
            )?;
            gauge(
                &mut encoder,
                "working_set_tools",
                "Tools in all the working sets together",
                r.tools,
            )?;
            gauge(
                &mut encoder,
                "working_set_tools_largest",
                "Tools in the largest working set",
                r.largest,
            )?;
        }
        let handed = self.rows_handed.load(Ordering::Relaxed);
        if let Some(read) = &*lock(&self.log_writer) {
            let r = read();
            counter(
                &mut encoder,
                "log_rows_handed",
                "Execution-log rows handed to the store's writer",
                handed,
            )?;
            counter(
                &mut encoder,
                "log_rows_written",
                "Execution-log rows committed",
                r.written,
            )?;
            counter(
                &mut encoder,
                "log_rows_dropped",
                "Execution-log rows lost: not written after every retry, or past the most the writer holds",
                r.dropped,
            )?;
            gauge(
                &mut encoder,
                "log_rows_waiting",
                "Execution-log rows handed to the writer and neither written nor dropped yet: its queue, rows waiting for room in it, the rows of answers held until they are committed (strict durability), and the rows it holds while log_failing is 1",
                handed.saturating_sub(r.written + r.dropped),
            )?;
            gauge(
                &mut encoder,
                "log_failing",
                "1 while the database refuses the execution log's writes (the writer holds the rows and retries)",
                u64::from(r.failing),
            )?;
        }
        if let Some(read) = &*lock(&self.process) {
            let r = read();
            gauge(
                &mut encoder,
                "process_resident_bytes",
                "Resident memory of the process",
                r.resident_bytes,
            )?;
            if let Some(heap) = r.heap_in_use_bytes {
                gauge(
                    &mut encoder,
                    "process_heap_in_use_bytes",
                    "Bytes the allocator has handed out and not had back (what it keeps after a free is left out: a leak grows this, not only the resident memory)",
                    heap,
                )?;
            }
            if let Some(free) = r.heap_free_bytes {
                gauge(
                    &mut encoder,
                    "process_heap_free_bytes",
                    "Bytes the allocator keeps free in its heaps after frees, to hand out again (its whole free pages are given back to the system every 10 s, so not all of them are resident)",
                    free,
                )?;
            }
            if let Some(trims) = r.heap_trims {
                counter(
                    &mut encoder,
                    "process_heap_trims",
                    "Times the allocator was asked to give its free pages back to the system",
                    trims,
                )?;
            }
            if let Some(store) = r.embedded_store_bytes {
                gauge(
                    &mut encoder,
                    "process_store_engine_bytes",
                    "Of the heap in use, what the embedded SQLite store holds: its page caches (up to about 2 MiB per connection) and statements",
                    store,
                )?;
            }
            gauge(
                &mut encoder,
                "process_threads",
                "Threads of the process",
                r.threads,
            )?;
            gauge(
                &mut encoder,
                "process_open_fds",
                "Open file descriptors of the process",
                r.open_fds,
            )?;
        }
        if let Some(read) = &*lock(&self.upstreams) {
            let ups = read();
            let mut family = encoder.encode_descriptor(
                "upstream_state",
                "1 for each upstream MCP server's current state, 0 for the others",
                None,
                MetricType::Gauge,
            )?;
            for u in &ups {
                for state in UpstreamState::ALL {
                    let labels = [("server", u.server.as_str()), ("state", state.as_str())];
                    ConstGauge::new(u64::from(u.state == state))
                        .encode(family.encode_family(&labels)?)?;
                }
            }
            per_server(
                &mut encoder,
                (
                    "upstream_dials",
                    "Connection attempts to each upstream MCP server",
                    MetricType::Counter,
                ),
                &ups,
                |u| u.dials,
            )?;
            per_server(
                &mut encoder,
                (
                    "upstream_reconnects",
                    "Connections to each upstream MCP server after its first",
                    MetricType::Counter,
                ),
                &ups,
                |u| u.connects.saturating_sub(1),
            )?;
            per_server(
                &mut encoder,
                (
                    "upstream_drops",
                    "Connections to each upstream MCP server lost after being up",
                    MetricType::Counter,
                ),
                &ups,
                |u| u.drops,
            )?;
            let acting: Vec<UpstreamReading> = ups
                .iter()
                .filter(|u| u.user_connections.is_some())
                .cloned()
                .collect();
            if !acting.is_empty() {
                per_server(
                    &mut encoder,
                    (
                        "upstream_user_connections",
                        "Users with a connection of their own to each upstream MCP server that acts for the user",
                        MetricType::Gauge,
                    ),
                    &acting,
                    |u| u.user_connections.unwrap_or_default(),
                )?;
            }
        }
        Ok(())
    }
}
