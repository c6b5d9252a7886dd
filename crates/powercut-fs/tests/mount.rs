//! The file system mounted for real (`/dev/fuse`): what a power cut keeps and what it drops.

use std::fs::{self, File};
use std::io::Write;
use std::os::unix::fs::FileExt;
use std::path::PathBuf;

use statestore_powercut_fs::{Cut, PowerCutMount, SECTOR};

/// A backing directory and a mount of it, in one temporary directory.
struct Rig {
    mount: PowerCutMount,
    _dir: tempfile::TempDir,
}

impl Rig {
    fn new() -> Rig {
        let dir = tempfile::tempdir().unwrap();
        let (backing, mountpoint) = (dir.path().join("backing"), dir.path().join("mnt"));
        fs::create_dir(&backing).unwrap();
        fs::create_dir(&mountpoint).unwrap();
        let mount = PowerCutMount::mount(&backing, &mountpoint).expect("mount (needs /dev/fuse)");
        Rig { mount, _dir: dir }
    }

    fn path(&self, name: &str) -> PathBuf {
        self.mount.mountpoint().join(name)
    }

    fn backing(&self, name: &str) -> PathBuf {
        self.mount.backing().join(name)
    }
}

#[test]
fn a_write_not_synced_is_read_back_and_gone_after_a_cut() {
    let mut rig = Rig::new();
    let mut file = File::create(rig.path("a")).unwrap();
    file.write_all(b"unsynced").unwrap();
    assert_eq!(fs::read(rig.path("a")).unwrap(), b"unsynced");
    assert_eq!(fs::metadata(rig.path("a")).unwrap().len(), 8);
    // Not on the backing file: only in memory.
    assert_eq!(fs::read(rig.backing("a")).unwrap(), b"");
    drop(file);
    assert_eq!(rig.mount.pending_bytes(), 8);
    let report = rig.mount.cut(Cut::Clean).unwrap();
    assert_eq!((report.files, report.lost_bytes), (1, 8));
    // The name was metadata: it stays, empty.
    assert_eq!(fs::read(rig.path("a")).unwrap(), b"");
}

#[test]
fn a_synced_write_stays_and_what_follows_it_does_not() {
    let mut rig = Rig::new();
    let file = File::create(rig.path("log")).unwrap();
    file.write_all_at(b"first", 0).unwrap();
    file.sync_data().unwrap();
    file.write_all_at(b"-second", 5).unwrap();
    assert_eq!(fs::read(rig.path("log")).unwrap(), b"first-second");
    drop(file);
    rig.mount.cut(Cut::Clean).unwrap();
    assert_eq!(fs::read(rig.path("log")).unwrap(), b"first");
    // An overwrite of synced data, not synced, is undone.
    let file = File::options().write(true).open(rig.path("log")).unwrap();
    file.write_all_at(b"FI", 0).unwrap();
    assert_eq!(fs::read(rig.path("log")).unwrap(), b"FIrst");
    drop(file);
    rig.mount.cut(Cut::Clean).unwrap();
    assert_eq!(fs::read(rig.path("log")).unwrap(), b"first");
}

#[test]
fn fsync_of_one_file_does_not_sync_another() {
    let mut rig = Rig::new();
    let (a, b) = (File::create(rig.path("a")).unwrap(), File::create(rig.path("b")).unwrap());
    a.write_all_at(b"aaa", 0).unwrap();
    b.write_all_at(b"bbb", 0).unwrap();
    a.sync_all().unwrap();
    drop((a, b));
    rig.mount.cut(Cut::Clean).unwrap();
    assert_eq!(fs::read(rig.path("a")).unwrap(), b"aaa");
    assert_eq!(fs::read(rig.path("b")).unwrap(), b"");
}

#[test]
fn renames_unlinks_links_and_truncations_reach_the_backing_directory_at_once() {
    let mut rig = Rig::new();
    fs::create_dir(rig.path("dir")).unwrap();
    fs::write(rig.path("dir/tmp"), b"synced").unwrap();
    File::open(rig.path("dir/tmp")).unwrap().sync_all().unwrap();
    fs::rename(rig.path("dir/tmp"), rig.path("dir/current")).unwrap();
    fs::write(rig.path("doomed"), b"x").unwrap();
    fs::remove_file(rig.path("doomed")).unwrap();
    fs::hard_link(rig.path("dir/current"), rig.path("linked")).unwrap();
    fs::remove_file(rig.path("dir/current")).unwrap();
    // Writes through the new name after a rename are still the file's, and unsynced.
    let file = File::options().append(true).open(rig.path("linked")).unwrap();
    (&file).write_all(b"+more").unwrap();
    assert_eq!(fs::read(rig.path("linked")).unwrap(), b"synced+more");
    file.set_len(3).unwrap();
    assert_eq!(fs::read(rig.path("linked")).unwrap(), b"syn");
    drop(file);
    rig.mount.cut(Cut::Clean).unwrap();
    assert!(!rig.path("dir/tmp").exists() && !rig.path("dir/current").exists() && !rig.path("doomed").exists());
    // The truncation was metadata: it held.
    assert_eq!(fs::read(rig.path("linked")).unwrap(), b"syn");
    let mut names: Vec<_> = fs::read_dir(rig.mount.mountpoint()).unwrap().map(|e| e.unwrap().file_name()).collect();
    names.sort();
    assert_eq!(names, ["dir", "linked"]);
}

#[test]
fn a_file_renamed_before_its_sync_is_synced_under_its_new_name() {
    let mut rig = Rig::new();
    let file = File::create(rig.path("a.tmp")).unwrap();
    file.write_all_at(b"content", 0).unwrap();
    fs::rename(rig.path("a.tmp"), rig.path("a")).unwrap();
    file.sync_all().unwrap();
    drop(file);
    rig.mount.cut(Cut::Clean).unwrap();
    assert_eq!(fs::read(rig.path("a")).unwrap(), b"content");
}

#[test]
fn a_torn_cut_keeps_a_prefix_of_whole_sectors() {
    for _ in 0..8 {
        let mut rig = Rig::new();
        let file = File::create(rig.path("f")).unwrap();
        file.write_all_at(&[7u8; 100], 0).unwrap();
        file.sync_data().unwrap();
        let written: Vec<u8> = (0..4000u32).map(|i| (i % 251) as u8 + 1).collect();
        file.write_all_at(&written, 100).unwrap();
        drop(file);
        let report = rig.mount.cut(Cut::Torn).unwrap();
        let content = fs::read(rig.path("f")).unwrap();
        assert_eq!(content.len() as u64, 100 + report.kept_bytes);
        assert_eq!(&content[..100], &[7u8; 100]);
        assert_eq!(&content[100..], &written[..content.len() - 100]);
        assert!(
            content.len() == 4100 || content.len() == 100 || (content.len() as u64).is_multiple_of(SECTOR),
            "{}",
            content.len()
        );
    }
}

#[test]
fn a_dropped_mount_is_unmounted() {
    let rig = Rig::new();
    let mountpoint = rig.mount.mountpoint().to_string_lossy().into_owned();
    assert!(fs::read_to_string("/proc/self/mounts").unwrap().contains(&mountpoint));
    drop(rig);
    assert!(!fs::read_to_string("/proc/self/mounts").unwrap().contains(&mountpoint));
}
