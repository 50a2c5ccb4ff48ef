//! [`TestPostgres`]: a PostgreSQL server of one test's own.

use std::{
    net::TcpListener,
    path::{Path, PathBuf},
    process::{Command, Output},
};

use tempfile::TempDir;

/// The superuser every test server has, and its password (the server asks for it over
/// TCP: a refused password can be tested).
pub(crate) const USER: &str = "quiver";
/// The superuser's password.
pub const PASSWORD: &str = "quiver-test-password";

/// The TLS a [`TestPostgres::start_tls`] server speaks: its certificate and key (PEM).
#[derive(Debug, Clone)]
pub struct ServerTls {
    /// The server's certificate chain, PEM.
    pub cert_pem: String,
    /// The server's private key, PEM.
    pub key_pem: String,
    /// Whether TCP connections must use TLS (`hostssl` lines only in `pg_hba.conf`).
    pub only: bool,
}

/// A PostgreSQL server in a temp dir, listening on 127.0.0.1 on a free port. Dropping it
/// stops the server (immediate mode) and deletes its files.
#[derive(Debug)]
pub struct TestPostgres {
    dir: TempDir,
    bin: PathBuf,
    port: u16,
    /// `runuser -u postgres --` when the test runs as root (the server refuses root).
    as_user: Option<String>,
    settings: Vec<(String, String)>,
    running: bool,
}

/// Where the server binaries are: `initdb` on the PATH (its symlink followed), else the
/// newest `/usr/lib/postgresql/*/bin`.
fn bin_dir() -> Result<PathBuf, String> {
    if let Some(path) = std::env::var_os("PATH") {
        for dir in std::env::split_paths(&path) {
            let initdb = dir.join("initdb");
            if initdb.is_file() {
                let real = std::fs::canonicalize(&initdb).unwrap_or(initdb);
                if let Some(parent) = real.parent() {
                    return Ok(parent.to_path_buf());
                }
            }
        }
    }
    let mut versions: Vec<PathBuf> = std::fs::read_dir("/usr/lib/postgresql")
        .map(|d| {
            d.filter_map(|e| e.ok())
                .map(|e| e.path().join("bin"))
                .collect()
        })
        .unwrap_or_default();
    versions.retain(|p| p.join("initdb").is_file());
    versions.sort();
    versions.pop().ok_or_else(|| {
        "no `initdb` on the PATH nor under /usr/lib/postgresql (install PostgreSQL: on Debian `apt-get install postgresql`; .ci/setup-peers does)".to_owned()
    })
}

fn running_as_root() -> bool {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata("/proc/self").is_ok_and(|m| m.uid() == 0)
}

fn free_port() -> Result<u16, String> {
    let l = TcpListener::bind("127.0.0.1:0").map_err(|e| format!("no free port: {e}"))?;
    l.local_addr()
        .map(|a| a.port())
        .map_err(|e| format!("no free port: {e}"))
}

fn text(out: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

impl TestPostgres {
    /// Starts a server with the settings tests want (no `fsync`: nothing here must survive
    /// a machine crash). Panics, naming why, when it cannot: a test that needs PostgreSQL
    /// fails rather than skips.
    pub fn start() -> TestPostgres {
        Self::start_with(&[("fsync", "off"), ("synchronous_commit", "off")])
    }

    /// Starts a server with `settings` (`-c name=value`), as [`TestPostgres::start`] does.
    pub fn start_with(settings: &[(&str, &str)]) -> TestPostgres {
        Self::start_inner(settings, None)
    }

    /// Starts a server that speaks TLS with `tls`'s certificate and key, as
    /// [`TestPostgres::start`] does. With [`ServerTls::only`], its `pg_hba.conf` admits TCP
    /// connections only over TLS (`hostssl`); the Unix socket [`TestPostgres::psql`] uses
    /// stays open.
    pub fn start_tls(tls: &ServerTls) -> TestPostgres {
        Self::start_inner(
            &[
                ("fsync", "off"),
                ("synchronous_commit", "off"),
                ("ssl", "on"),
            ],
            Some(tls),
        )
    }

    fn start_inner(settings: &[(&str, &str)], tls: Option<&ServerTls>) -> TestPostgres {
        match Self::try_start(settings, tls) {
            Ok(pg) => pg,
            Err(why) => panic!(
                "cannot start a PostgreSQL server for this test: {why}\n(tests that need PostgreSQL fail rather than skip)"
            ),
        }
    }

    fn try_start(
        settings: &[(&str, &str)],
        tls: Option<&ServerTls>,
    ) -> Result<TestPostgres, String> {
        let bin = bin_dir()?;
        let dir = tempfile::Builder::new()
            .prefix("quiver-pg-")
            .tempdir()
            .map_err(|e| format!("no temp dir: {e}"))?;
        let as_user = running_as_root().then(|| "postgres".to_owned());
        if let Some(user) = &as_user {
            let out = Command::new("chown")
                .args(["-R", user])
                .arg(dir.path())
                .output()
                .map_err(|e| format!("chown: {e}"))?;
            if !out.status.success() {
                return Err(format!(
                    "cannot hand the temp dir to the `{user}` user: {}",
                    text(&out)
                ));
            }
        }
        let pg = TestPostgres {
            port: free_port()?,
            bin,
            as_user,
            settings: settings
                .iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                .collect(),
            running: false,
            dir,
        };
        let pwfile = pg.dir.path().join("pw");
        std::fs::write(&pwfile, PASSWORD).map_err(|e| format!("password file: {e}"))?;
        if let Some(user) = &pg.as_user {
            let _ = Command::new("chown").arg(user).arg(&pwfile).output();
        }
        let out = pg
            .command("initdb")
            .arg("-D")
            .arg(pg.data())
            .args(["-U", USER, "-E", "UTF8", "--no-sync", "--auth-local=trust"])
            .arg("--auth-host=scram-sha-256")
            .arg(format!("--pwfile={}", pwfile.display()))
            .output()
            .map_err(|e| format!("initdb: {e}"))?;
        if !out.status.success() {
            return Err(format!("initdb failed: {}", text(&out)));
        }
        if let Some(tls) = tls {
            pg.install_tls(tls)?;
        }
        let mut pg = pg;
        pg.start_again();
        Ok(pg)
    }

    /// Writes the certificate and key where the server looks for them (`server.crt`,
    /// `server.key` in its data directory, the key readable by the server's user only), and
    /// with [`ServerTls::only`] turns every `host` line of `pg_hba.conf` into `hostssl`.
    fn install_tls(&self, tls: &ServerTls) -> Result<(), String> {
        use std::os::unix::fs::PermissionsExt;
        let data = self.data();
        let cert = data.join("server.crt");
        let key = data.join("server.key");
        std::fs::write(&cert, &tls.cert_pem).map_err(|e| format!("server.crt: {e}"))?;
        std::fs::write(&key, &tls.key_pem).map_err(|e| format!("server.key: {e}"))?;
        std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o600))
            .map_err(|e| format!("server.key: {e}"))?;
        if let Some(user) = &self.as_user {
            let out = Command::new("chown")
                .arg(user)
                .arg(&cert)
                .arg(&key)
                .output()
                .map_err(|e| format!("chown: {e}"))?;
            if !out.status.success() {
                return Err(format!(
                    "cannot hand the TLS files to `{user}`: {}",
                    text(&out)
                ));
            }
        }
        if tls.only {
            let hba = data.join("pg_hba.conf");
            let conf = std::fs::read_to_string(&hba).map_err(|e| format!("pg_hba.conf: {e}"))?;
            let conf: String = conf
                .lines()
                .map(|l| match l.strip_prefix("host ") {
                    Some(rest) => format!("hostssl {rest}\n"),
                    None => format!("{l}\n"),
                })
                .collect();
            std::fs::write(&hba, conf).map_err(|e| format!("pg_hba.conf: {e}"))?;
        }
        Ok(())
    }

    fn data(&self) -> PathBuf {
        self.dir.path().join("data")
    }

    fn command(&self, tool: &str) -> Command {
        let program = self.bin.join(tool);
        let mut c = match &self.as_user {
            Some(user) => {
                let mut c = Command::new("runuser");
                c.args(["-u", user, "--"]).arg(program);
                c
            }
            None => Command::new(program),
        };
        // The server's user may not enter the test's working directory.
        c.current_dir(self.dir.path());
        c
    }

    /// Starts the server again after [`TestPostgres::stop`] (same port, same data).
    pub fn start_again(&mut self) {
        let mut options = format!(
            "-p {} -k {} -c listen_addresses=127.0.0.1",
            self.port,
            self.dir.path().display()
        );
        for (k, v) in &self.settings {
            options.push_str(&format!(" -c {k}={v}"));
        }
        let log = self.dir.path().join("server.log");
        let out = self
            .command("pg_ctl")
            .arg("-D")
            .arg(self.data())
            .args(["-w", "-t", "60", "-o", &options, "-l"])
            .arg(&log)
            .arg("start")
            .output();
        match out {
            Ok(out) if out.status.success() => self.running = true,
            other => {
                let why = match other {
                    Ok(out) => text(&out),
                    Err(e) => e.to_string(),
                };
                let tail = std::fs::read_to_string(&log).unwrap_or_default();
                panic!(
                    "cannot start a PostgreSQL server for this test: pg_ctl start failed: {why}\n{tail}\n(tests that need PostgreSQL fail rather than skip)"
                );
            }
        }
    }

    /// Stops the server (fast mode: connections are cut), keeping its data.
    pub fn stop(&mut self) {
        self.pg_ctl_stop("fast");
    }

    fn pg_ctl_stop(&mut self, mode: &str) {
        if !self.running {
            return;
        }
        let _ = self
            .command("pg_ctl")
            .arg("-D")
            .arg(self.data())
            .args(["-w", "-m", mode, "stop"])
            .output();
        self.running = false;
    }

    /// The port it listens on.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// The URL of database `db` as the superuser, password included.
    pub fn url(&self, db: &str) -> String {
        format!("postgres://{USER}:{PASSWORD}@127.0.0.1:{}/{db}", self.port)
    }

    /// Creates database `db`.
    pub fn create_database(&self, db: &str) {
        self.psql("postgres", &format!("CREATE DATABASE \"{db}\""));
    }

    /// Runs `sql` in database `db` (over the Unix socket) and returns what `psql -At`
    /// printed. Panics when it fails.
    pub fn psql(&self, db: &str, sql: &str) -> String {
        let out = self
            .command("psql")
            .args(["-X", "-q", "-At", "-v", "ON_ERROR_STOP=1", "-h"])
            .arg(self.dir.path())
            .args([
                "-p",
                &self.port.to_string(),
                "-U",
                USER,
                "-d",
                db,
                "-c",
                sql,
            ])
            .output()
            .expect("psql runs");
        assert!(out.status.success(), "psql {sql:?}: {}", text(&out));
        String::from_utf8_lossy(&out.stdout).trim().to_owned()
    }

    /// The server's data directory's parent (socket, log).
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }
}

impl Drop for TestPostgres {
    fn drop(&mut self) {
        self.pg_ctl_stop("immediate");
    }
}
