//! The packaging files: the systemd unit in `docs/` checks with `systemd-analyze verify`.

use std::process::Command;

/// `docs/quiver.service`, with its `ExecStart` pointed at the binary under test (verify
/// checks that the command exists), passes `systemd-analyze verify` with nothing to say.
#[test]
fn the_systemd_unit_verifies() {
    let unit = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../docs/quiver.service"
    ))
    .expect("docs/quiver.service");
    assert!(
        unit.contains("ExecStart=/usr/local/bin/quiver "),
        "the unit starts the installed binary: {unit}"
    );
    let dir = crate::Scratch::new("unit");
    let path = dir.join("quiver.service");
    std::fs::write(
        &path,
        unit.replace("/usr/local/bin/quiver", env!("CARGO_BIN_EXE_quiver")),
    )
    .unwrap();
    let out = Command::new("systemd-analyze")
        .arg("verify")
        .arg(&path)
        .output()
        .expect("systemd-analyze runs (Debian's `systemd` package)");
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{said}");
    assert_eq!(said.trim(), "", "verify has nothing to say about the unit");
}
