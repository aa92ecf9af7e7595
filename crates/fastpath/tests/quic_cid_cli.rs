//! `fastpath lb quic-cid` as a backend's operator runs it: the draft's test
//! vectors through the command line, random nonces that differ, and the
//! refusals a mistyped flag gets.

mod common;

use common::{fastpath, json};

const KEY: &str = "8f95f09245765f80256934e50c66207f";

#[test]
fn encode_gives_the_drafts_connection_id_and_decode_reads_it_back() {
    // draft-ietf-quic-load-balancers-21, "Encrypted CIDs", the first row.
    let enc = json(&[
        "lb",
        "quic-cid",
        "encode",
        "--server-id-len",
        "3",
        "--nonce-len",
        "4",
        "--key",
        KEY,
        "--length-self-encoding",
        "--server-id",
        "ed793a",
        "--nonce",
        "ee080dbf",
        "--format",
        "json",
    ]);
    assert_eq!(enc["cid"], "0720b1d07b359d3c");
    assert_eq!(enc["encoding"], "four-pass");
    assert_eq!(enc["routable"], true);
    let dec = json(&[
        "lb",
        "quic-cid",
        "decode",
        "--server-id-len",
        "3",
        "--nonce-len",
        "4",
        "--key",
        KEY,
        "0720b1d07b359d3c",
        "--format",
        "json",
    ]);
    assert_eq!(dec["server_id"], "ed793a");
    assert_eq!(dec["nonce"], "ee080dbf");
    assert_eq!(dec["codepoint"], 0);
}

#[test]
fn random_nonces_differ_and_route_to_the_same_server() {
    let cids: Vec<String> = (0..4)
        .map(|_| {
            let enc = json(&[
                "lb",
                "quic-cid",
                "encode",
                "--codepoint",
                "2",
                "--server-id-len",
                "2",
                "--nonce-len",
                "6",
                "--key",
                KEY,
                "--server-id",
                "0a01",
                "--format",
                "json",
            ]);
            enc["cid"].as_str().expect("cid").to_string()
        })
        .collect();
    for (i, a) in cids.iter().enumerate() {
        for b in &cids[i + 1..] {
            assert_ne!(a, b, "two connection IDs alike: the nonce is not random");
        }
        let dec = json(&[
            "lb",
            "quic-cid",
            "decode",
            "--codepoint",
            "2",
            "--server-id-len",
            "2",
            "--nonce-len",
            "6",
            "--key",
            KEY,
            a,
            "--format",
            "json",
        ]);
        assert_eq!(dec["server_id"], "0a01", "{a}");
        assert_eq!(dec["codepoint"], 2);
    }
}

#[test]
fn unroutable_connection_ids_exit_1_and_say_why() {
    let out = fastpath()
        .args([
            "lb",
            "quic-cid",
            "decode",
            "--server-id-len",
            "3",
            "--nonce-len",
            "4",
            "e720b1d07b359d3c",
            "--format",
            "json",
        ])
        .output()
        .expect("run");
    assert_eq!(out.status.code(), Some(1));
    let doc: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json on stdout");
    assert_eq!(doc["routable"], false);
    assert!(
        doc["unroutable"]
            .as_str()
            .expect("reason")
            .contains("0b111"),
        "{doc}"
    );
}

#[test]
fn mistakes_are_refused_by_name() {
    for (args, says) in [
        (vec!["--key", "00ff"], "16 (32 hex digits)"),
        (vec!["--key", "0g"], "not hex"),
        (vec!["--codepoint", "7"], "codepoint 7"),
        (vec!["--nonce-len", "3"], "nonce length 3"),
    ] {
        let mut cmd = fastpath();
        cmd.args([
            "lb",
            "quic-cid",
            "encode",
            "--server-id-len",
            "3",
            "--server-id",
            "010203",
        ]);
        if !args.contains(&"--nonce-len") {
            cmd.args(["--nonce-len", "4"]);
        }
        cmd.args(&args);
        let out = cmd.output().expect("run");
        assert!(!out.status.success(), "{args:?} accepted");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains(says), "{args:?}: {err}");
    }
    let out = fastpath()
        .args([
            "lb",
            "quic-cid",
            "encode",
            "--server-id-len",
            "3",
            "--nonce-len",
            "4",
            "--server-id",
            "0102",
        ])
        .output()
        .expect("run");
    assert!(String::from_utf8_lossy(&out.stderr)
        .contains("server ID is 2 octets, the configuration says 3"));
}
