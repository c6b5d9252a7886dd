//! The CLI's own command line, without a broker or a cluster: help, version and usage errors.
//! (Everything against a real cluster is in crates/node/tests/cli.rs, which runs this binary.)

use std::process::Command;

fn cli(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_statestore-cli")).args(args).output().unwrap()
}

#[test]
fn help_version_and_usage_errors() {
    let help = cli(&["--help"]);
    assert_eq!(help.status.code(), Some(0));
    let text = String::from_utf8_lossy(&help.stdout);
    for word in ["get", "set", "del", "vdel", "watch", "lock", "cluster", "Exit codes", "--cafile", "-h, --host"] {
        assert!(text.contains(word), "{word} missing from:\n{text}");
    }
    // `-h` is the broker host in every subcommand too (as in mosquitto_pub), never help.
    let host = cli(&["get", "-h", "127.0.0.1", "-p", "1", "--timeout", "1", "k"]);
    assert_eq!(host.status.code(), Some(3), "{}", String::from_utf8_lossy(&host.stderr));
    assert!(String::from_utf8_lossy(&host.stderr).contains("127.0.0.1:1"), "{}", String::from_utf8_lossy(&host.stderr));
    // Every subcommand's help ends with examples, as etcdctl's do.
    for sub in [
        &["get"][..],
        &["set"],
        &["del"],
        &["vdel"],
        &["keys"],
        &["watch"],
        &["lock"],
        &["load"],
        &["cluster", "status"],
        &["cluster", "add-learner"],
        &["cluster", "remove"],
        &["snapshot", "save"],
        &["snapshot", "restore"],
    ] {
        let mut args = sub.to_vec();
        args.push("--help");
        let help = cli(&args);
        assert_eq!(help.status.code(), Some(0), "{args:?}");
        let text = String::from_utf8_lossy(&help.stdout);
        assert!(text.contains("Usage") && text.contains("Example"), "{args:?} has no examples:\n{text}");
    }
    let version = cli(&["--version"]);
    assert_eq!(version.status.code(), Some(0));
    assert!(String::from_utf8_lossy(&version.stdout).starts_with("statestore-cli "));
    for args in [&["set"][..], &["get"], &["nope"], &["--port", "x", "get", "k"], &["--cert", "c", "get", "k"]] {
        let output = cli(args);
        assert_eq!(output.status.code(), Some(64), "{args:?}: {}", String::from_utf8_lossy(&output.stderr));
        assert!(!output.stderr.is_empty());
    }
}
