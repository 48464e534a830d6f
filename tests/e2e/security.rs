//! Issue 6 security: no setuid, outputs owned by the sudo user with mode 0644, and nothing
//! planted in the output directory (symlink, hard link) is ever followed or written through.

use std::{
    os::unix::fs::{MetadataExt, PermissionsExt},
    path::Path,
    process::Command,
};

use crate::common::*;

#[test]
fn refuses_to_run_setuid() {
    let _g = serial();
    if !require_root("refuses_to_run_setuid") {
        return;
    }
    let dir = out_dir("setuid");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755)).unwrap();
    let bin = dir.join("gputrace");
    std::fs::copy(GPUTRACE, &bin).unwrap();
    // Every subcommand: `demo` makes directories and loads a library its command line names,
    // `diff` reads the files it is given (here one only root may read), `check` loads programs.
    let made = dir.join("made-by-demo");
    let runs: [&[&str]; 5] = [
        &["--pid", "1", "-d", "1s"],
        &["demo", "--seconds", "1", "-o", made.to_str().unwrap()],
        &["diff", "/etc/shadow", "/etc/shadow"],
        &["check"],
        &["--help"],
    ];
    // Setuid root, and setgid root: the caller's group is not root's.
    for mode in [0o4755, 0o2755] {
        std::fs::set_permissions(&bin, std::fs::Permissions::from_mode(mode)).unwrap();
        for args in runs {
            let out = Command::new("setpriv")
                .args(["--reuid=65534", "--regid=65534", "--clear-groups"])
                .arg(&bin)
                .args(args)
                .output()
                .unwrap();
            let err = String::from_utf8_lossy(&out.stderr);
            assert_eq!(out.status.code(), Some(3), "{mode:o} {args:?}: {err}");
            assert!(err.contains("setuid"), "{mode:o} {args:?}: {err}");
            assert_eq!(err.lines().count(), 1, "{mode:o} {args:?}: {err}");
            assert!(out.stdout.is_empty(), "{mode:o} {args:?}");
        }
    }
    assert!(!made.exists());
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn outputs_belong_to_the_sudo_user_with_mode_0644() {
    let _g = serial();
    if !require_root("outputs_belong_to_the_sudo_user_with_mode_0644") {
        return;
    }
    let spin = build_c("spin", &[]);
    let base = out_dir("sudo-owner");
    std::fs::create_dir_all(&base).unwrap();
    let dir = base.join("new/sub");
    // A restrictive umask must not make the reports unreadable.
    let out = Command::new("sh")
        .args(["-c", "umask 077; exec \"$@\"", "sh", GPUTRACE, "-o"])
        .arg(&dir)
        .args(["--", spin.to_str().unwrap(), "0.3"])
        .env("SUDO_UID", "65534")
        .env("SUDO_GID", "65533")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    for name in ["report.json", "cpu.folded", "cpu.svg"] {
        let m = std::fs::metadata(dir.join(name)).unwrap();
        assert_eq!((m.uid(), m.gid()), (65534, 65533), "{name} owner");
        assert_eq!(m.mode() & 0o7777, 0o644, "{name} mode");
    }
    for d in [base.join("new"), dir.clone()] {
        let m = std::fs::metadata(&d).unwrap();
        assert_eq!((m.uid(), m.gid()), (65534, 65533), "{} owner", d.display());
    }
    // A directory that existed before keeps its owner.
    assert_eq!(std::fs::metadata(&base).unwrap().uid(), 0);
    // Without SUDO_GID: the user's primary group, not a group numbered as the user (Debian's
    // `sync`, uid 4, is in nogroup).
    let sync_gid: u32 = String::from_utf8(
        Command::new("id")
            .args(["-g", "4"])
            .output()
            .unwrap()
            .stdout,
    )
    .unwrap()
    .trim()
    .parse()
    .unwrap();
    let dir = base.join("no-gid");
    let out = Command::new(GPUTRACE)
        .arg("-o")
        .arg(&dir)
        .args(["--", "true"])
        .env("SUDO_UID", "4")
        .env_remove("SUDO_GID")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let m = std::fs::metadata(dir.join("report.json")).unwrap();
    assert_eq!((m.uid(), m.gid()), (4, sync_gid));
}

#[test]
fn planted_links_are_never_followed() {
    let _g = serial();
    if !require_root("planted_links_are_never_followed") {
        return;
    }
    let spin = build_c("spin", &[]);
    let dir = out_dir("planted");
    std::fs::create_dir_all(&dir).unwrap();
    let victims = out_dir("planted-victims");
    std::fs::create_dir_all(&victims).unwrap();
    let passwd = std::fs::read("/etc/passwd").unwrap();
    let v1 = victims.join("passwd-copy");
    let v2 = victims.join("hardlinked");
    let v3 = victims.join("probe-target");
    for v in [&v1, &v2, &v3] {
        std::fs::write(v, &passwd).unwrap();
    }
    std::os::unix::fs::symlink(&v1, dir.join("report.json")).unwrap();
    std::fs::hard_link(&v2, dir.join("cpu.svg")).unwrap();
    std::os::unix::fs::symlink(&v3, dir.join(".gputrace-write-test")).unwrap();
    let run = gputrace(&[
        "-o",
        dir.to_str().unwrap(),
        "--",
        spin.to_str().unwrap(),
        "0.3",
    ]);
    assert_eq!(run.code(), 0, "{}", run.stderr);
    for v in [&v1, &v2, &v3] {
        assert_eq!(
            std::fs::read(v).unwrap(),
            passwd,
            "{} was written",
            v.display()
        );
        assert_eq!(std::fs::symlink_metadata(v).unwrap().mode() & 0o777, 0o644);
    }
    let meta = std::fs::symlink_metadata(dir.join("report.json")).unwrap();
    assert!(meta.file_type().is_file(), "report.json is still a link");
    run.report(&dir);
    assert_eq!(std::fs::metadata(dir.join("cpu.svg")).unwrap().nlink(), 1);
    assert!(Path::new(&v2).exists());
}

/// The output directory is opened once, before the trace, and written through that handle:
/// a trailing slash or `/.` does not get a link past the check, a link another user could
/// have planted on the way is refused (one root or the user made, as `/var/run`, is
/// followed), and the directory renamed mid-trace with a link put in its place does not move
/// where the reports go.
#[test]
fn output_paths_through_links_and_renames() {
    let _g = serial();
    if !require_root("output_paths_through_links_and_renames") {
        return;
    }
    let base = out_dir("link-paths");
    let _ = std::fs::remove_dir_all(&base);
    std::fs::create_dir_all(&base).unwrap();
    std::fs::set_permissions(&base, std::fs::Permissions::from_mode(0o755)).unwrap();
    let victim = base.join("victim");
    std::fs::create_dir(&victim).unwrap();
    let as_nobody = |args: &[&str]| {
        let st = Command::new("setpriv")
            .args(["--reuid=65534", "--regid=65534", "--clear-groups"])
            .args(args)
            .status()
            .unwrap();
        assert!(st.success(), "{args:?}");
    };
    let refused = |dir: &Path, why: &str| {
        let run = gputrace(&["-o", dir.to_str().unwrap(), "--", "true"]);
        assert_eq!(run.code(), 6, "{}: {}", dir.display(), run.stderr);
        assert!(
            run.stderr.contains(why),
            "{}: {}",
            dir.display(),
            run.stderr
        );
        assert_eq!(run.stderr.lines().count(), 1, "{}", run.stderr);
    };
    // The output directory a link, however it is spelled.
    std::os::unix::fs::symlink(&victim, base.join("planted")).unwrap();
    for spelled in ["planted", "planted/", "planted/.", "victim/../planted/"] {
        refused(&base.join(spelled), "is a symbolic link");
    }
    // A link on the way that another user made, in a sticky world-writable directory (as
    // /tmp) and in a directory they own.
    let sticky = base.join("sticky");
    std::fs::create_dir(&sticky).unwrap();
    std::fs::set_permissions(&sticky, std::fs::Permissions::from_mode(0o1777)).unwrap();
    let theirs = base.join("theirs");
    std::fs::create_dir(&theirs).unwrap();
    std::os::unix::fs::chown(&theirs, Some(65534), Some(65534)).unwrap();
    for d in [&sticky, &theirs] {
        let link = d.join("evil");
        as_nobody(&["ln", "-s", victim.to_str().unwrap(), link.to_str().unwrap()]);
        refused(&link.join("out"), "another user could have planted");
    }
    assert_eq!(std::fs::read_dir(&victim).unwrap().count(), 0);
    // Root's own link on the way is followed, and so is a trusted link its target holds.
    std::os::unix::fs::symlink(&victim, base.join("ours")).unwrap();
    std::os::unix::fs::symlink("ours", base.join("ours2")).unwrap();
    let run = gputrace(&["-o", base.join("ours2/sub").to_str().unwrap(), "--", "true"]);
    assert_eq!(run.code(), 0, "{}", run.stderr);
    run.report(&victim.join("sub"));
    // Root's own link into a directory another user controls, where they put a link of
    // theirs: the target is walked by the same rules, not handed to the kernel to follow.
    as_nobody(&[
        "ln",
        "-s",
        victim.to_str().unwrap(),
        theirs.join("proj").to_str().unwrap(),
    ]);
    std::os::unix::fs::symlink(theirs.join("proj"), base.join("data")).unwrap();
    refused(
        &base.join("data/out"),
        "proj is a symbolic link another user could have planted",
    );
    // A loop of links.
    std::os::unix::fs::symlink("loop-b", base.join("loop-a")).unwrap();
    std::os::unix::fs::symlink("loop-a", base.join("loop-b")).unwrap();
    refused(
        &base.join("loop-a/out"),
        "too many levels of symbolic links",
    );
    // Renamed mid-trace by the other user, a link to the victim put in its place: the reports
    // go where the directory went.
    let out = theirs.join("out");
    let script = format!(
        "sleep 0.3; mv {0} {0}.old; ln -s {1} {0}; sleep 0.2",
        out.display(),
        victim.join("later").display()
    );
    std::fs::create_dir(victim.join("later")).unwrap();
    let run = gputrace(&[
        "-o",
        out.to_str().unwrap(),
        "--",
        "setpriv",
        "--reuid=65534",
        "--regid=65534",
        "--clear-groups",
        "sh",
        "-c",
        &script,
    ]);
    assert_eq!(run.code(), 0, "{}", run.stderr);
    assert!(
        std::fs::symlink_metadata(&out)
            .unwrap()
            .file_type()
            .is_symlink(),
        "the swap did not happen"
    );
    run.report(&theirs.join("out.old"));
    assert_eq!(std::fs::read_dir(victim.join("later")).unwrap().count(), 0);
    let _ = std::fs::remove_dir_all(&base);
}
