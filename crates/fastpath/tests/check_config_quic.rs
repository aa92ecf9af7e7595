//! `fastpath lb check-config` on a configuration with `quic` VIPs: the
//! summary shows, per `quic` VIP, the QUIC-LB configurations it routes
//! connection IDs by (codepoint, encoding, server ID and nonce lengths,
//! where the key comes from) and each backend's server ID; never a key.

mod common;

use common::{fastpath, json_of};

/// The inline key and the key file's, neither of which may be printed.
const INLINE_KEY: &str = "8f95f09245765f80256934e50c66207f";
const FILE_KEY: &str = "fdf726a9893ec05c0632d3956680baf0";

fn config(key_file: &std::path::Path) -> String {
    format!(
        r#"
[encap]
source = "10.0.0.1"

[[quic_lb]]
codepoint = 0
server_id_len = 2
nonce_len = 4
length_self_encoding = true

[[quic_lb]]
codepoint = 3
server_id_len = 2
nonce_len = 14
key = "{INLINE_KEY}"

[[quic_lb]]
codepoint = 6
server_id_len = 2
nonce_len = 6
key_file = "{}"

[[pools]]
name = "h3"
backends = [
  {{ address = "10.1.0.1", name = "h3-a", quic_server_id = "0a01" }},
  {{ address = "10.1.0.2", name = "h3-b", quic_server_id = "0a02" }},
]

[[pools]]
name = "web"
backends = [{{ address = "10.2.0.1" }}]

[[vips]]
name = "h3"
address = "198.18.0.43"
port = 443
protocol = "udp"
quic = true
pool = "h3"

[[vips]]
name = "http"
address = "198.18.0.80"
port = 80
protocol = "tcp"
pool = "web"
"#,
        key_file.display()
    )
}

#[test]
fn check_config_shows_quic_configurations_and_server_ids_but_no_key() {
    let dir = std::env::temp_dir().join(format!("fastpath-check-quic-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let key_file = dir.join("quic.key");
    std::fs::write(&key_file, format!("{FILE_KEY}\n")).unwrap();
    let file = dir.join("lb.toml");
    std::fs::write(&file, config(&key_file)).unwrap();

    let out = fastpath()
        .args(["lb", "check-config"])
        .arg(&file)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8(out.stdout).unwrap();
    // One row per configuration under the quic VIP, in file order.
    let rows: Vec<Vec<&str>> = text
        .lines()
        .skip_while(|l| !l.contains("quic vip"))
        .skip(1)
        .filter(|l| !l.trim_start().starts_with('-'))
        .take(3)
        .map(|l| l.split_whitespace().collect())
        .collect();
    let key_file_cell = format!("file {}", key_file.display());
    let want: [&[&str]; 3] = [
        &[
            "h3",
            "0",
            "plaintext",
            "2",
            "octets",
            "4",
            "octets",
            "none",
            "yes",
        ],
        &[
            "3",
            "single-pass",
            "2",
            "octets",
            "14",
            "octets",
            "inline",
            "no",
        ],
        &["6", "four-pass", "2", "octets", "6", "octets", "file"],
    ];
    assert_eq!(rows.len(), 3, "{text}");
    for (row, want) in rows.iter().zip(want) {
        assert!(row.starts_with(want), "row {row:?}, want {want:?}:\n{text}");
    }
    assert!(text.contains(&key_file_cell), "{text}");
    // The non-quic VIP has no row of its own there.
    assert!(
        !text
            .lines()
            .skip_while(|l| !l.contains("quic vip"))
            .take(5)
            .any(|l| l.split_whitespace().next() == Some("http")),
        "{text}"
    );
    // Each backend's server ID beside it; "-" for one without.
    for (backend, sid) in [("h3-a", "0a01"), ("h3-b", "0a02"), ("10.2.0.1", "-")] {
        let line = text
            .lines()
            .find(|l| l.split_whitespace().any(|c| c == backend))
            .unwrap_or_else(|| panic!("no line for {backend}:\n{text}"));
        assert_eq!(line.split_whitespace().last(), Some(sid), "{line}");
    }

    let doc = json_of(
        fastpath()
            .args(["lb", "check-config", "--format", "json"])
            .arg(&file),
    );
    let q = doc["quic_lb"].as_array().expect("quic_lb in the document");
    let got: Vec<(u64, &str, u64, u64, String, bool)> = q
        .iter()
        .map(|c| {
            (
                c["codepoint"].as_u64().unwrap(),
                c["encoding"].as_str().unwrap(),
                c["server_id_len"].as_u64().unwrap(),
                c["nonce_len"].as_u64().unwrap(),
                c["key"].as_str().unwrap().to_string(),
                c["length_self_encoding"].as_bool().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        got,
        vec![
            (0, "plaintext", 2, 4, "none".to_string(), true),
            (3, "single-pass", 2, 14, "inline".to_string(), false),
            (6, "four-pass", 2, 6, key_file_cell.clone(), false),
        ]
    );
    let vips = doc["vips"].as_array().unwrap();
    assert_eq!(vips[0]["quic"], true);
    assert!(vips[1].get("quic").is_none(), "{}", vips[1]);
    let h3 = &doc["pools"][0]["backends"];
    assert_eq!(h3[0]["quic_server_id"], "0a01");
    assert_eq!(h3[1]["quic_server_id"], "0a02");
    assert!(doc["pools"][1]["backends"][0]
        .get("quic_server_id")
        .is_none());

    // Never a key, in either form.
    let json = doc.to_string();
    for key in [INLINE_KEY, FILE_KEY] {
        assert!(!text.to_lowercase().contains(key), "{text}");
        assert!(!json.to_lowercase().contains(key), "{json}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// Without `quic` VIPs nothing about QUIC is printed (the summary of an
/// ordinary file is as it was).
#[test]
fn check_config_without_quic_says_nothing_of_it() {
    let dir = std::env::temp_dir().join(format!("fastpath-check-plain-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("lb.toml");
    std::fs::write(
        &file,
        "[encap]\nsource = \"10.0.0.1\"\n\
         [[pools]]\nname = \"web\"\nbackends = [{ address = \"10.2.0.1\" }]\n\
         [[vips]]\nname = \"http\"\naddress = \"198.18.0.80\"\nport = 80\nprotocol = \"tcp\"\npool = \"web\"\n",
    )
    .unwrap();
    let out = fastpath()
        .args(["lb", "check-config"])
        .arg(&file)
        .output()
        .unwrap();
    assert!(out.status.success());
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(!text.contains("quic"), "{text}");
    let doc = json_of(
        fastpath()
            .args(["lb", "check-config", "--format", "json"])
            .arg(&file),
    );
    assert!(doc.get("quic_lb").is_none(), "{doc}");
    let _ = std::fs::remove_dir_all(&dir);
}
