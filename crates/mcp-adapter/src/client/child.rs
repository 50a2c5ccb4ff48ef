//! Stdio children: spawned in their own process group, killed with their parent (Linux
//! `PR_SET_PDEATHSIG`; their own children by a watchdog that outlives the parent), and
//! killed and reaped — the whole group — on close.

use std::{
    collections::{BTreeMap, VecDeque},
    path::PathBuf,
    process::{ExitStatus, Stdio},
    sync::{Arc, Mutex},
    time::Duration,
};

use super::config::Secret;
use crate::sync::lock;
use tokio::{
    io::{AsyncRead, AsyncReadExt},
    process::{Child, ChildStdin, ChildStdout, Command},
};

/// The longest stderr line logged; the rest of a longer line is dropped.
const MAX_STDERR_LINE: usize = 8 * 1024;

/// Appended to a stderr line that was cut.
const CUT_MARKER: &str = " [line cut at 8 KiB]";

/// How many of a child's last stderr lines are kept for the operator's diagnostics.
const STDERR_TAIL_LINES: usize = 5;

/// The longest stderr line kept in that tail (the log has it whole, up to 8 KiB).
const STDERR_TAIL_CHARS: usize = 300;

/// How a child's exit reads in a message: "exited with code 7", "was killed by signal 9
/// (SIGKILL)".
pub(crate) fn exit_text(status: ExitStatus) -> String {
    use std::os::unix::process::ExitStatusExt;
    if let Some(code) = status.code() {
        return format!("exited with code {code}");
    }
    match status.signal() {
        Some(sig) => {
            let name = match sig {
                1 => " (SIGHUP)",
                2 => " (SIGINT)",
                6 => " (SIGABRT)",
                9 => " (SIGKILL)",
                11 => " (SIGSEGV)",
                13 => " (SIGPIPE)",
                15 => " (SIGTERM)",
                _ => "",
            };
            format!("was killed by signal {sig}{name}")
        }
        None => "exited".to_owned(),
    }
}

/// Reads a child's stderr to its end and hands over each line (lossily decoded, cut at
/// [`MAX_STDERR_LINE`] bytes). Never stops before EOF on bad input: a reader that gave up
/// would close the pipe, and the child's next write to stderr would kill it (SIGPIPE).
async fn drain_lines(mut stderr: impl AsyncRead + Unpin, mut line_out: impl FnMut(String)) {
    let mut chunk = vec![0u8; 8 * 1024];
    let mut line: Vec<u8> = Vec::new();
    // The current line was cut and handed over: skip to its newline.
    let mut skipping = false;
    let mut emit = |line: &mut Vec<u8>, cut: bool| {
        if line.last() == Some(&b'\r') && !cut {
            line.pop();
        }
        let mut text = String::from_utf8_lossy(line).into_owned();
        if cut {
            text.push_str(CUT_MARKER);
        }
        line.clear();
        line_out(text);
    };
    loop {
        let n = match stderr.read(&mut chunk).await {
            Ok(0) => break,
            Ok(n) => n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => {
                tracing::debug!(error = %e, "cannot read a child's stderr");
                break;
            }
        };
        let mut rest = &chunk[..n];
        while !rest.is_empty() {
            let (part, newline) = match rest.iter().position(|b| *b == b'\n') {
                Some(i) => (&rest[..i], Some(i)),
                None => (rest, None),
            };
            if !skipping {
                let room = MAX_STDERR_LINE - line.len();
                if part.len() > room {
                    line.extend_from_slice(&part[..room]);
                    emit(&mut line, true);
                    skipping = true;
                } else {
                    line.extend_from_slice(part);
                }
            }
            match newline {
                Some(i) => {
                    if !skipping {
                        emit(&mut line, false);
                    }
                    skipping = false;
                    rest = &rest[i + 1..];
                }
                None => rest = &[],
            }
        }
    }
    if !line.is_empty() {
        emit(&mut line, false);
    }
}

/// Sets `PR_SET_PDEATHSIG` in the child before `exec`, so the kernel kills it when the
/// spawning thread's process dies, even by SIGKILL.
#[allow(unsafe_code)]
fn die_with_parent(cmd: &mut Command) {
    #[cfg(target_os = "linux")]
    {
        let parent = std::process::id() as libc::pid_t;
        // SAFETY: the closure runs in the forked child before exec and only calls
        // async-signal-safe functions (prctl, getppid, _exit); it allocates nothing and
        // touches no locks.
        unsafe {
            cmd.pre_exec(move || {
                if libc::prctl(
                    libc::PR_SET_PDEATHSIG,
                    libc::SIGKILL as libc::c_ulong,
                    0,
                    0,
                    0,
                ) != 0
                {
                    return Err(std::io::Error::last_os_error());
                }
                // The parent may have died before prctl took effect.
                if libc::getppid() != parent {
                    libc::_exit(1);
                }
                Ok(())
            });
        }
    }
    #[cfg(not(target_os = "linux"))]
    let _ = cmd;
}

/// Sends SIGKILL to a whole process group.
fn kill_group(pgid: u32) {
    signal_group(pgid, libc::SIGKILL);
}

/// Sends `signal` to a whole process group.
#[allow(unsafe_code)]
fn signal_group(pgid: u32, signal: libc::c_int) {
    // SAFETY: kill(2) with a negative pid only signals the group; it has no memory effects.
    unsafe {
        libc::kill(-(pgid as libc::pid_t), signal);
    }
}

/// How long a stdio server closed by Quiver has to exit after its stdin closed, and then
/// after SIGTERM, before its process group is killed (the MCP lifecycle's stdio shutdown).
const EXIT_GRACE: Duration = Duration::from_millis(500);
const TERM_GRACE: Duration = Duration::from_secs(2);

/// The watchdog's script: it keeps the list of live children's process groups (`+PGID`,
/// `-PGID` lines on its stdin) and, when its stdin ends (this process exited, or was
/// killed with SIGKILL), kills every group still listed. Only builtins, so it runs in any
/// POSIX `sh`; it ignores the signals a terminal or supervisor sends a whole job, so it
/// outlives this process long enough to do its work.
const WATCHDOG: &str = r#"trap '' INT HUP TERM QUIT
groups=''
while IFS= read -r line; do
  case $line in
    +*) groups="$groups ${line#+}" ;;
    -*) kept=''; for g in $groups; do [ "$g" = "${line#-}" ] || kept="$kept $g"; done; groups=$kept ;;
  esac
done
for g in $groups; do kill -9 -$g 2>/dev/null; done
"#;

/// The running watchdog: its stdin (the only writer, close-on-exec so no child holds it
/// open) and the process, kept so it is not reaped as a zombie's parent would.
struct Watchdog {
    stdin: std::process::ChildStdin,
    process: std::process::Child,
}

static WATCHDOG_PROCESS: Mutex<Option<Watchdog>> = Mutex::new(None);

/// Tells the watchdog that a process group started (`+`) or ended (`-`).
///
/// `PR_SET_PDEATHSIG` kills a child when this process dies, but not what the child
/// started: `npx` → `node`, `uv run` → `python` and `sh -c` wrappers leave their own
/// children running after a `kill -9` of Quiver. They share the child's process group, so
/// a watchdog that outlives Quiver kills the group. Started with the first child; without
/// a usable `/bin/sh` the groups are still killed on every orderly close, and the leader by
/// the kernel.
fn watch_group(sign: char, pgid: u32) {
    use std::{io::Write, os::unix::process::CommandExt};
    let mut slot = lock(&WATCHDOG_PROCESS);
    let line = format!("{sign}{pgid}\n");
    if let Some(dog) = slot.as_mut() {
        if dog.stdin.write_all(line.as_bytes()).is_ok() {
            return;
        }
        tracing::debug!("the child watchdog is gone; starting another");
        if let Some(mut gone) = slot.take() {
            let _ = gone.process.kill();
            let _ = gone.process.wait();
        }
    }
    if sign == '-' {
        return;
    }
    let started = std::process::Command::new("/bin/sh")
        .args(["-c", WATCHDOG])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        // Its own group: a terminal's Ctrl-C for Quiver's job does not reach it.
        .process_group(0)
        .spawn();
    match started {
        Ok(mut process) => {
            let Some(mut stdin) = process.stdin.take() else {
                return;
            };
            if stdin.write_all(line.as_bytes()).is_ok() {
                *slot = Some(Watchdog { stdin, process });
            }
        }
        Err(e) => tracing::debug!(error = %e, "cannot start the child watchdog (/bin/sh)"),
    }
}

/// A running stdio child. Dropping it kills the group (tokio's `kill_on_drop` kills and
/// reaps the leader in the background); [`ChildGuard::shutdown`] kills and reaps it now, and
/// takes its pid off the server's list.
pub(crate) struct ChildGuard {
    child: Option<Child>,
    pid: Option<u32>,
    pids: Arc<Mutex<Vec<u32>>>,
    /// The last [`STDERR_TAIL_LINES`] lines of its stderr.
    stderr_tail: Arc<Mutex<VecDeque<String>>>,
    /// Becomes true once its stderr has been read to the end.
    stderr_read: tokio::sync::watch::Receiver<bool>,
}

impl std::fmt::Debug for ChildGuard {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ChildGuard")
            .field("pid", &self.pid)
            .finish()
    }
}

impl ChildGuard {
    /// Resolves when the child (the group's leader) exits, with its status; never, once it
    /// was reaped by [`ChildGuard::shutdown`]. Cancel-safe.
    pub(crate) async fn exited(&mut self) -> Option<ExitStatus> {
        match self.child.as_mut() {
            Some(child) => child.wait().await.ok(),
            None => std::future::pending().await,
        }
    }

    /// Waits until the child's stderr has been read to its end (the child, and whatever it
    /// started, closed it), so its last lines are in the tail. Cancel-safe.
    pub(crate) async fn stderr_read(&mut self) {
        let _ = self.stderr_read.wait_for(|done| *done).await;
    }

    /// The child's last stderr lines, for a diagnostic; empty when it wrote none.
    pub(crate) fn stderr_tail(&self) -> String {
        let tail = lock(&self.stderr_tail);
        tail.iter().cloned().collect::<Vec<_>>().join(" | ")
    }

    /// Stops the child the way the MCP lifecycle asks of a client closing a stdio server, its
    /// stdin already closed: it has [`EXIT_GRACE`] to exit by itself (and write what it
    /// keeps), then its process group gets SIGTERM and [`TERM_GRACE`], then
    /// [`ChildGuard::shutdown`] kills what is left of the group.
    pub(crate) async fn stop(&mut self) {
        if tokio::time::timeout(EXIT_GRACE, self.exited())
            .await
            .is_err()
            && let Some(pid) = self.pid
        {
            signal_group(pid, libc::SIGTERM);
            let _ = tokio::time::timeout(TERM_GRACE, self.exited()).await;
        }
        self.shutdown().await;
    }

    /// Kills the child's process group and waits for the leader to be reaped.
    pub(crate) async fn shutdown(&mut self) {
        let pid = self.pid.take();
        if let Some(pid) = pid {
            kill_group(pid);
            watch_group('-', pid);
        }
        if let Some(mut child) = self.child.take() {
            // Kills the leader if needed and waits for it: reaped once this returns.
            let _ = child.kill().await;
            if let Some(pid) = pid {
                lock(&self.pids).retain(|p| *p != pid);
            }
        }
    }
}

impl Drop for ChildGuard {
    fn drop(&mut self) {
        if let Some(pid) = self.pid.take() {
            kill_group(pid);
            watch_group('-', pid);
            // Off the server's list too (a dial dropped midway, with its call): a pid left
            // there would name a dead process, and later maybe an unrelated one.
            lock(&self.pids).retain(|p| *p != pid);
        }
        // `child` drops with kill_on_drop; tokio reaps it in the background.
    }
}

/// Spawns a stdio server. Its stderr goes to the operator log (tracing), never to the model.
pub(crate) fn spawn(
    server: &str,
    command: &str,
    args: &[String],
    env: &BTreeMap<String, Secret>,
    inherit_env: &[String],
    cwd: Option<&PathBuf>,
    pids: &Arc<Mutex<Vec<u32>>>,
) -> std::io::Result<(ChildGuard, ChildStdout, ChildStdin)> {
    let mut cmd = Command::new(command);
    // Not Quiver's whole environment: its secrets are not the server's.
    cmd.args(args)
        .env_clear()
        .envs(super::config::inherited_env(inherit_env))
        .envs(env.iter().map(|(k, v)| (k, &v.0)))
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .process_group(0);
    if let Some(dir) = cwd {
        cmd.current_dir(dir);
    }
    die_with_parent(&mut cmd);
    let mut child = cmd.spawn()?;
    let pid = child.id();
    if let Some(pid) = pid {
        lock(pids).push(pid);
        watch_group('+', pid);
    }
    let stdout = child
        .stdout
        .take()
        .ok_or_else(|| std::io::Error::other("no stdout"))?;
    let stdin = child
        .stdin
        .take()
        .ok_or_else(|| std::io::Error::other("no stdin"))?;
    let stderr_tail = Arc::new(Mutex::new(VecDeque::new()));
    let (read_tx, stderr_read) = tokio::sync::watch::channel(false);
    if let Some(stderr) = child.stderr.take() {
        let server = server.to_owned();
        let tail = stderr_tail.clone();
        let drained = drain_lines(stderr, move |line| {
            tracing::debug!(target: "quiver_mcp_adapter::stderr", server = %server, "{line}");
            if line.trim().is_empty() {
                return;
            }
            let kept: String = quiver_contract::printable(line.trim_end())
                .chars()
                .take(STDERR_TAIL_CHARS)
                .collect();
            let mut tail = lock(&tail);
            if tail.len() == STDERR_TAIL_LINES {
                tail.pop_front();
            }
            tail.push_back(kept);
        });
        tokio::spawn(async move {
            drained.await;
            let _ = read_tx.send(true);
        });
    } else {
        let _ = read_tx.send(true);
    }
    Ok((
        ChildGuard {
            child: Some(child),
            pid,
            pids: pids.clone(),
            stderr_tail,
            stderr_read,
        },
        stdout,
        stdin,
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    async fn lines_of(input: &[u8]) -> Vec<String> {
        let mut out = Vec::new();
        drain_lines(input, |l| out.push(l)).await;
        out
    }

    #[tokio::test]
    async fn a_dropped_guard_takes_its_pid_off_the_list() {
        let pids = Arc::new(Mutex::new(Vec::new()));
        let (guard, _out, _in) = spawn(
            "t",
            "sleep",
            &["30".to_owned()],
            &BTreeMap::new(),
            &[],
            None,
            &pids,
        )
        .expect("sleep starts");
        let pid = guard.pid.expect("a pid");
        assert_eq!(*pids.lock().unwrap(), [pid]);
        drop(guard);
        assert!(pids.lock().unwrap().is_empty());
    }

    #[tokio::test]
    async fn stderr_lines_survive_bad_bytes_and_long_lines() {
        let long = vec![b'x'; 3 * MAX_STDERR_LINE + 10];
        let mut input = b"ok\r\n\xff\xfebad\nafter\n".to_vec();
        input.extend_from_slice(&long);
        input.extend_from_slice(b"\n");
        input.extend_from_slice(&vec![b'y'; MAX_STDERR_LINE]);
        input.extend_from_slice(b"\nlast without newline");
        let lines = lines_of(&input).await;
        let cut = format!("{}{CUT_MARKER}", "x".repeat(MAX_STDERR_LINE));
        let exact = "y".repeat(MAX_STDERR_LINE);
        assert_eq!(
            lines,
            [
                "ok",
                "\u{fffd}\u{fffd}bad",
                "after",
                cut.as_str(),
                exact.as_str(),
                "last without newline"
            ]
        );
    }
}
