//! Stdio children: spawned in their own process group, killed with their parent (Linux
//! `PR_SET_PDEATHSIG`), and killed and reaped — the whole group — on close.

use std::{
    collections::BTreeMap,
    path::PathBuf,
    process::Stdio,
    sync::{Arc, Mutex},
};

use super::config::Secret;
use tokio::{
    io::{AsyncBufReadExt, BufReader},
    process::{Child, ChildStdin, ChildStdout, Command},
};

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
#[allow(unsafe_code)]
fn kill_group(pgid: u32) {
    // SAFETY: kill(2) with a negative pid only signals the group; it has no memory effects.
    unsafe {
        libc::kill(-(pgid as libc::pid_t), libc::SIGKILL);
    }
}

/// A running stdio child. Dropping it kills the group (tokio's `kill_on_drop` kills and
/// reaps the leader in the background); [`ChildGuard::shutdown`] kills and reaps it now, and
/// takes its pid off the server's list.
pub(crate) struct ChildGuard {
    child: Option<Child>,
    pid: Option<u32>,
    pids: Arc<Mutex<Vec<u32>>>,
}

impl std::fmt::Debug for ChildGuard {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ChildGuard")
            .field("pid", &self.pid)
            .finish()
    }
}

impl ChildGuard {
    /// Kills the child's process group and waits for the leader to be reaped.
    pub(crate) async fn shutdown(&mut self) {
        let pid = self.pid.take();
        if let Some(pid) = pid {
            kill_group(pid);
        }
        if let Some(mut child) = self.child.take() {
            // Kills the leader if needed and waits for it: reaped once this returns.
            let _ = child.kill().await;
            if let Some(pid) = pid {
                self.pids
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .retain(|p| *p != pid);
            }
        }
    }
}

impl Drop for ChildGuard {
    fn drop(&mut self) {
        if let Some(pid) = self.pid.take() {
            kill_group(pid);
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
    cwd: Option<&PathBuf>,
    pids: &Arc<Mutex<Vec<u32>>>,
) -> std::io::Result<(ChildGuard, ChildStdout, ChildStdin)> {
    let mut cmd = Command::new(command);
    cmd.args(args)
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
        pids.lock().unwrap_or_else(|p| p.into_inner()).push(pid);
    }
    let stdout = child
        .stdout
        .take()
        .ok_or_else(|| std::io::Error::other("no stdout"))?;
    let stdin = child
        .stdin
        .take()
        .ok_or_else(|| std::io::Error::other("no stdin"))?;
    if let Some(stderr) = child.stderr.take() {
        let server = server.to_owned();
        tokio::spawn(async move {
            let mut lines = BufReader::new(stderr).lines();
            while let Ok(Some(line)) = lines.next_line().await {
                tracing::debug!(target: "quiver_mcp_adapter::stderr", server = %server, "{line}");
            }
        });
    }
    Ok((
        ChildGuard {
            child: Some(child),
            pid,
            pids: pids.clone(),
        },
        stdout,
        stdin,
    ))
}
