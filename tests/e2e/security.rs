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
    std::fs::set_permissions(&bin, std::fs::Permissions::from_mode(0o4755)).unwrap();
    let out = Command::new("setpriv")
        .args(["--reuid=65534", "--regid=65534", "--clear-groups"])
        .arg(&bin)
        .args(["--pid", "1", "-d", "1s"])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(3), "{err}");
    assert!(err.contains("setuid"), "{err}");
    assert_eq!(err.lines().count(), 1, "{err}");
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
