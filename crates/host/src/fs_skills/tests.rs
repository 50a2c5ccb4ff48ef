use std::sync::Arc;

use quiver_registry::skill::{MAX_ASSET_BYTES, MAX_SKILL_BYTES, TieredSkills};

use super::*;

fn write(path: &Path, text: &str) {
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    std::fs::write(path, text).unwrap();
}

fn load(dirs: &[PathBuf]) -> DirSkills {
    DirSkills::load(SkillTier::User, dirs)
}

fn asset_names(b: &Bundle) -> Vec<String> {
    b.assets.iter().map(|a| a.name.clone()).collect()
}

fn skill_md(name: &str, description: &str) -> String {
    format!("---\nname: {name}\ndescription: {description}\n---\nDo the {name} steps.\n")
}

#[test]
fn a_directory_of_skills_loads_each_with_its_files() {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path().join("skills");
    write(
        &root.join("pdf-report/SKILL.md"),
        &skill_md("pdf-report", "Builds PDF reports."),
    );
    write(&root.join("pdf-report/scripts/build.py"), "print(1)");
    write(&root.join("pdf-report/.cache"), "x");
    write(
        &root.join("csv-clean/SKILL.md"),
        &skill_md("csv-clean", "Cleans CSV files."),
    );
    // Not a skill: no SKILL.md.
    write(&root.join("notes/readme.txt"), "x");
    let set = load(std::slice::from_ref(&root));
    assert_eq!(set.problems, []);
    let names: Vec<&str> = set.skills.iter().map(|s| s.meta.name.as_str()).collect();
    assert_eq!(names, ["csv-clean", "pdf-report"]);
    assert_eq!(asset_names(&set.skills[1]), ["scripts/build.py"]);
    assert_eq!(asset_names(&set.skills[0]), Vec::<String>::new());
    // A directory that is itself a skill.
    let one = load(&[root.join("pdf-report")]);
    assert_eq!(one.skills.len(), 1);
    // One listed twice, the second time by another path, is read once.
    let twice = load(&[root.clone(), root.join("../skills")]);
    assert_eq!(
        (twice.skills.len(), twice.problems.len()),
        (2, 0),
        "{twice:?}"
    );
    // A link named for the skill, to a directory named otherwise (a versioned store).
    let store = tmp.path().join("store/pdf-report-1.2");
    std::fs::create_dir_all(store.parent().unwrap()).unwrap();
    std::fs::rename(root.join("pdf-report"), &store).unwrap();
    std::os::unix::fs::symlink(&store, root.join("pdf-report")).unwrap();
    let linked = load(std::slice::from_ref(&root));
    assert_eq!(linked.problems, [], "{linked:?}");
    assert_eq!(linked.skills.len(), 2);
}

/// Past the most a skill serves, files are counted and reported: 1500 files beside a
/// `SKILL.md` are 1000 assets and a problem naming the 500 more.
#[test]
fn a_skill_serves_at_most_its_share_of_assets_and_says_so() {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path().join("many");
    write(&root.join("SKILL.md"), &skill_md("many", "Has many files."));
    for i in 0..1500 {
        write(&root.join(format!("data/f{i:04}.txt")), "x");
    }
    let set = load(&[root]);
    assert_eq!(set.skills.len(), 1, "{set:?}");
    let skill = &set.skills[0];
    assert_eq!(skill.assets.len(), walk::MAX_ASSETS);
    assert_eq!(skill.assets[0].name, "data/f0000.txt");
    assert_eq!(set.problems.len(), 1, "{:?}", set.problems);
    assert!(
        set.problems[0]
            .reason
            .contains("1000 assets are served; 500 more files beside it are not"),
        "{:?}",
        set.problems
    );
}

#[test]
fn what_cannot_be_loaded_is_reported_with_its_path() {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path().join("skills");
    write(
        &root.join("wrong-dir/SKILL.md"),
        &skill_md("other-name", "Mismatched."),
    );
    write(&root.join("no-front/SKILL.md"), "Just text.\n");
    write(
        &root.join("huge/SKILL.md"),
        &"x".repeat(MAX_SKILL_BYTES as usize + 1),
    );
    write(
        &root.join("lower/skill.md"),
        &skill_md("lower", "Lower-case file."),
    );
    std::fs::create_dir_all(root.join("isdir/SKILL.md")).unwrap();
    // A link to nothing and a FIFO: each a problem, not skipped without a word.
    std::fs::create_dir_all(root.join("dangling")).unwrap();
    std::os::unix::fs::symlink(tmp.path().join("gone.md"), root.join("dangling/SKILL.md")).unwrap();
    std::fs::create_dir_all(root.join("fifo")).unwrap();
    let made = std::process::Command::new("mkfifo")
        .arg(root.join("fifo/SKILL.md"))
        .status()
        .unwrap();
    assert!(made.success());
    // A plain folder beside the skills (shared assets) is no finding.
    std::fs::create_dir_all(root.join("assets")).unwrap();
    let empty = tmp.path().join("empty");
    std::fs::create_dir_all(&empty).unwrap();
    let missing = tmp.path().join("missing");
    let lone = tmp.path().join("lone");
    write(&lone.join("Skill.MD"), &skill_md("lone", "Odd case."));
    let set = load(&[root, empty, missing, lone]);
    assert!(set.skills.is_empty());
    let problems: Vec<String> = set
        .problems
        .iter()
        .map(|p| format!("{} | {}", p.origin, p.reason))
        .collect();
    assert_eq!(problems.len(), 10, "{problems:#?}");
    let has = |path: &str, why: &str| problems.iter().any(|p| p.contains(path) && p.contains(why));
    assert!(has("huge/SKILL.md", "at most"), "{problems:#?}");
    assert!(has("no-front/SKILL.md", "no front matter"), "{problems:#?}");
    assert!(
        has(
            "wrong-dir/SKILL.md",
            "does not match its directory `wrong-dir`"
        ),
        "{problems:#?}"
    );
    assert!(has("empty", "no skill here"), "{problems:#?}");
    assert!(
        has(
            "lower",
            "found `skill.md`, which is not read: name the file `SKILL.md`"
        ),
        "{problems:#?}"
    );
    assert!(
        has("isdir", "SKILL.md here is a directory"),
        "{problems:#?}"
    );
    assert!(has("lone", "found `Skill.MD`"), "{problems:#?}");
    assert!(
        has(
            "dangling",
            "SKILL.md here is a link whose target cannot be read"
        ),
        "{problems:#?}"
    );
    assert!(
        has("fifo", "SKILL.md here is not a regular file"),
        "{problems:#?}"
    );
    assert!(
        !problems.iter().any(|p| p.contains("assets")),
        "{problems:#?}"
    );
    assert!(
        has("missing", "cannot read the skills directory"),
        "{problems:#?}"
    );
}

/// Links are invisible, listed or read; `SKILL.md` is never an asset; hidden files, FIFOs
/// and names the validator refuses are not assets; a file swapped for a link after the
/// snapshot is not read.
#[tokio::test]
async fn assets_are_regular_files_under_the_skill_never_links() {
    use std::os::unix::fs::symlink;
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path().join("skills/pdf");
    write(&root.join("SKILL.md"), &skill_md("pdf", "Makes PDFs."));
    write(&root.join("references/api.md"), "The API.");
    write(
        &root.join("docs/SKILL.md"),
        "A nested file of that name is an asset.",
    );
    write(&root.join(".secret"), "hidden");
    write(&tmp.path().join("outside.txt"), "outside the skill");
    symlink(tmp.path().join("outside.txt"), root.join("link.txt")).unwrap();
    symlink(tmp.path(), root.join("linked-dir")).unwrap();
    write(&root.join("back\\slash.md"), "a name the validator refuses");
    let made = std::process::Command::new("mkfifo")
        .arg(root.join("pipe.md"))
        .status()
        .unwrap();
    assert!(made.success());
    let skills = load(&[tmp.path().join("skills")]);
    assert_eq!(skills.problems(), [], "{skills:?}");
    let listed: Vec<String> = skills
        .list_assets("pdf")
        .await
        .unwrap()
        .into_iter()
        .map(|a| a.name)
        .collect();
    assert_eq!(listed, ["docs/SKILL.md", "references/api.md"]);
    assert_eq!(
        skills.read_asset("pdf", "references/api.md").await.unwrap(),
        "The API."
    );
    for asset in [
        "link.txt",
        "linked-dir/outside.txt",
        ".secret",
        "pipe.md",
        "SKILL.md",
    ] {
        let e = skills.read_asset("pdf", asset).await.unwrap_err();
        assert!(
            matches!(
                e,
                SkillError::UnknownAsset { .. } | SkillError::InvalidAssetName { .. }
            ),
            "{asset}: {e:?}"
        );
    }
    // Swapped for a link after the snapshot: refused, not followed.
    std::fs::remove_file(root.join("references/api.md")).unwrap();
    symlink(
        tmp.path().join("outside.txt"),
        root.join("references/api.md"),
    )
    .unwrap();
    let e = skills
        .read_asset("pdf", "references/api.md")
        .await
        .unwrap_err();
    assert!(matches!(e, SkillError::UnknownAsset { .. }), "{e:?}");
    // A directory on the way swapped for a link: refused too.
    std::fs::remove_dir_all(root.join("docs")).unwrap();
    write(&tmp.path().join("elsewhere/SKILL.md"), "elsewhere");
    symlink(tmp.path().join("elsewhere"), root.join("docs")).unwrap();
    let e = skills.read_asset("pdf", "docs/SKILL.md").await.unwrap_err();
    assert!(matches!(e, SkillError::UnknownAsset { .. }), "{e:?}");
}

/// An asset over the cap is refused whole, even when it grew after the snapshot; invalid
/// UTF-8 and NUL bytes are refused.
#[tokio::test]
async fn assets_are_bounded_text() {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path().join("t");
    write(&root.join("SKILL.md"), &skill_md("t", "Text rules."));
    let cap = MAX_ASSET_BYTES as usize;
    std::fs::write(root.join("big.txt"), vec![b'x'; cap + 1]).unwrap();
    std::fs::write(root.join("grows.txt"), "small").unwrap();
    std::fs::write(root.join("nul.txt"), b"a\0b").unwrap();
    std::fs::write(root.join("latin1.txt"), b"caf\xe9").unwrap();
    std::fs::write(root.join("ok.txt"), vec![b'y'; cap]).unwrap();
    let skills = load(std::slice::from_ref(&root));
    std::fs::write(root.join("grows.txt"), vec![b'z'; cap + 10]).unwrap();
    for (asset, want) in [
        ("big.txt", "TooLarge"),
        ("grows.txt", "TooLarge"),
        ("nul.txt", "NUL byte"),
        ("latin1.txt", "not UTF-8"),
    ] {
        let e = skills.read_asset("t", asset).await.unwrap_err();
        let said = format!("{e:?} {e}");
        assert!(said.contains(want), "{asset}: {said}");
    }
    assert_eq!(skills.read_asset("t", "ok.txt").await.unwrap().len(), cap);
}

/// The snapshot is taken at load: a skill added, or one edited, afterwards changes nothing
/// of what the source lists or serves.
#[tokio::test]
async fn the_source_is_a_snapshot() {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path().join("skills");
    write(&root.join("a/SKILL.md"), &skill_md("a", "First."));
    let skills = load(std::slice::from_ref(&root));
    write(&root.join("b/SKILL.md"), &skill_md("b", "Second."));
    write(&root.join("a/SKILL.md"), &skill_md("a", "Edited."));
    write(&root.join("a/new.md"), "new");
    let listed = skills.list_skills().await.unwrap();
    assert_eq!(listed, [SkillMeta::new("a", "First.", SkillTier::User)]);
    assert_eq!(skills.skill_body("a").await.unwrap(), "Do the a steps.");
    assert!(skills.list_assets("a").await.unwrap().is_empty());
    assert!(matches!(
        skills.read_asset("a", "new.md").await,
        Err(SkillError::UnknownAsset { .. })
    ));
}

/// Tiers over directories: the project tier's directory is read only when trusted, and a
/// name in two tiers goes to the higher.
#[tokio::test]
async fn tier_directories_stack_behind_the_trust_gate() {
    let tmp = tempfile::tempdir().unwrap();
    let project = tmp.path().join("project");
    let user = tmp.path().join("user");
    write(
        &project.join("review/SKILL.md"),
        &skill_md("review", "Project review."),
    );
    write(
        &user.join("review/SKILL.md"),
        &skill_md("review", "User review."),
    );
    write(
        &user.join("notes/SKILL.md"),
        &skill_md("notes", "User notes."),
    );
    for (trusted, review) in [(true, "Project review."), (false, "User review.")] {
        let sources: Vec<(SkillTier, Arc<dyn SkillSource>)> = vec![
            (
                SkillTier::Project,
                Arc::new(DirSkills::load(
                    SkillTier::Project,
                    std::slice::from_ref(&project),
                )),
            ),
            (
                SkillTier::User,
                Arc::new(DirSkills::load(
                    SkillTier::User,
                    std::slice::from_ref(&user),
                )),
            ),
        ];
        let (stack, report) = TieredSkills::build(sources, trusted).await;
        let listed = stack.list_skills().await.unwrap();
        let review_meta = listed.iter().find(|m| m.name == "review").unwrap();
        assert_eq!(review_meta.description, review, "trusted: {trusted}");
        assert_eq!(report.shadowed.len(), usize::from(trusted));
        assert_eq!(report.withheld, usize::from(!trusted));
    }
}

#[test]
fn command_files_load_from_their_directories() {
    let tmp = tempfile::tempdir().unwrap();
    let first = tmp.path().join("first");
    let second = tmp.path().join("second");
    write(
        &first.join("review.md"),
        "---\ndescription: Reviews.\n---\nReview $1.\n",
    );
    write(&first.join("notes.txt"), "not a command");
    write(&second.join("review.md"), "Second review.");
    write(&second.join("ship.md"), "Ship $ARGUMENTS.");
    write(&second.join("empty.md"), "");
    std::fs::create_dir_all(second.join("folder.md")).unwrap();
    let (commands, problems) = load_commands(&[first, second, tmp.path().join("missing")]);
    let names: Vec<&str> = commands.iter().map(|c| c.name.as_str()).collect();
    assert_eq!(names, ["review", "review", "ship"]);
    assert_eq!(commands[0].template, "Review $1.");
    let problems: Vec<String> = problems
        .iter()
        .map(|p| format!("{} | {}", p.origin, p.reason))
        .collect();
    assert_eq!(problems.len(), 2, "{problems:#?}");
    assert!(
        problems[0].contains("empty.md | no prompt text"),
        "{problems:#?}"
    );
    assert!(
        problems[1].contains("missing | cannot read the commands directory"),
        "{problems:#?}"
    );
}
