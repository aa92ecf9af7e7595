//! The test vectors of draft-ietf-quic-load-balancers-21 (appendix "Load
//! Balancer Test Vectors" and the four-pass "Encryption Example"), each row
//! checked for internal consistency before it is trusted, and round trips
//! over every length pair the draft allows.
//!
//! Two printed rows are not consistent with themselves; the tests below name
//! them and assert exactly that, so a later draft that corrects them (or a
//! decoder that starts accepting them) shows up here:
//! - plaintext row "1 350d28b420 3487d970b 20a350d28b4203487d970b": the nonce
//!   has nine hex digits (an odd number: not whole octets), and the first
//!   octet 0x20 self-describes a length of 0 while 10 octets follow;
//! - encrypted row "3 ed793a51d49b8f5fab ee080dbf48c0d1e55d 1257...": its
//!   first octet 0x12 is config rotation 0, not 3 (its low five bits, 18,
//!   do describe the 9 + 9 octets that follow). Decoded with codepoint 0, the
//!   row's ciphertext is right.

use proptest::prelude::*;
use quic_lb::{Config, Configs, Encoding, Unroutable, MAX_PLAINTEXT_LEN, MIN_NONCE_LEN};

/// Octets from hex; `None` when the text is not whole octets of hex digits.
fn hex(s: &str) -> Option<Vec<u8>> {
    if !s.len().is_multiple_of(2) {
        return None;
    }
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(s.get(i..i + 2)?, 16).ok())
        .collect()
}

fn key(s: &str) -> [u8; 16] {
    hex(s).expect("key hex").try_into().expect("16-octet key")
}

/// One printed row: config rotation bits, server ID, nonce, connection ID.
struct Row {
    cr: u8,
    sid: &'static str,
    nonce: &'static str,
    cid: &'static str,
}

/// A row's server ID, nonce and connection ID as octets.
type Parsed = (Vec<u8>, Vec<u8>, Vec<u8>);

/// What a row says about itself, before any cryptography: whole octets, a
/// first octet that names the row's codepoint and self-describes the length
/// that follows (the appendix says every server there encodes the length).
fn consistency(row: &Row) -> Result<Parsed, String> {
    let sid = hex(row.sid).ok_or("server ID is not whole octets of hex")?;
    let nonce = hex(row.nonce).ok_or("nonce is not whole octets of hex")?;
    let cid = hex(row.cid).ok_or("connection ID is not whole octets of hex")?;
    let first = *cid.first().ok_or("empty connection ID")?;
    if first >> 5 != row.cr {
        return Err(format!(
            "first octet {first:#04x} is config rotation {}, the row says {}",
            first >> 5,
            row.cr
        ));
    }
    let described = usize::from(first & 0x1f);
    if described != cid.len() - 1 || described != sid.len() + nonce.len() {
        return Err(format!(
            "first octet describes {described} octets; {} follow it; server ID and nonce are {}",
            cid.len() - 1,
            sid.len() + nonce.len()
        ));
    }
    Ok((sid, nonce, cid))
}

const PLAINTEXT: &[Row] = &[
    Row {
        cr: 0,
        sid: "c4605e",
        nonce: "4504cc4f",
        cid: "07c4605e4504cc4f",
    },
    Row {
        cr: 1,
        sid: "350d28b420",
        nonce: "3487d970b",
        cid: "20a350d28b4203487d970b",
    },
];

const ENCRYPTED_KEY: &str = "8f95f09245765f80256934e50c66207f";

const ENCRYPTED: &[Row] = &[
    Row {
        cr: 0,
        sid: "ed793a",
        nonce: "ee080dbf",
        cid: "0720b1d07b359d3c",
    },
    Row {
        cr: 1,
        sid: "ed793a51d49b8f5fab65",
        nonce: "ee080dbf48",
        cid: "2fcc381bc74cb4fbad2823a3d1f8fed2",
    },
    Row {
        cr: 2,
        sid: "ed793a51d49b8f5f",
        nonce: "ee080dbf48c0d1e5",
        cid: "504dd2d05a7b0de9b2b9907afb5ecf8cc3",
    },
    Row {
        cr: 3,
        sid: "ed793a51d49b8f5fab",
        nonce: "ee080dbf48c0d1e55d",
        cid: "125779c9cc86beb3a3a4a3ca96fce4bfe0cdbc",
    },
];

/// Encodes a consistent row with its configuration and checks both ways:
/// the server's encoding gives the printed CID, the load balancer's decoding
/// gives the printed server ID (three or four passes) and nonce.
fn check_row(row: &Row, key: Option<[u8; 16]>, want: Encoding) {
    let (sid, nonce, cid) = consistency(row).expect("consistent row");
    let config = Config::new(row.cr, sid.len(), nonce.len(), key, true).expect("valid config");
    assert_eq!(config.encoding(), want, "row {}", row.cid);
    let ours = config.encode(&sid, &nonce, 0).expect("encode");
    assert_eq!(ours.as_bytes(), cid.as_slice(), "encoding row {}", row.cid);
    let back = config.decode(&cid).expect("routable");
    assert_eq!(back.server_id.as_bytes(), sid.as_slice());
    assert_eq!(back.nonce.as_bytes(), nonce.as_slice());
    assert_eq!(
        config.server_id(&cid).expect("routable").as_bytes(),
        sid.as_slice()
    );
}

#[test]
fn plaintext_rows_that_are_consistent_pass_and_the_other_is_named() {
    check_row(&PLAINTEXT[0], None, Encoding::Plaintext);
    let err = consistency(&PLAINTEXT[1]).expect_err("the printed row is inconsistent");
    assert!(err.contains("nonce is not whole octets"), "{err}");
}

#[test]
fn encrypted_rows_four_pass_and_single_pass() {
    let k = Some(key(ENCRYPTED_KEY));
    // Three octets of server ID, four of nonce: odd length, three passes.
    check_row(&ENCRYPTED[0], k, Encoding::FourPass);
    // Ten of server ID, five of nonce: the load balancer needs the fourth pass.
    check_row(&ENCRYPTED[1], k, Encoding::FourPass);
    // Eight and eight: one AES block.
    check_row(&ENCRYPTED[2], k, Encoding::SinglePass);
}

#[test]
fn encrypted_row_three_names_the_wrong_codepoint_and_is_right_with_its_first_octets() {
    let row = &ENCRYPTED[3];
    let err = consistency(row).expect_err("the printed row is inconsistent");
    assert!(err.contains("config rotation 0, the row says 3"), "{err}");
    check_row(
        &Row {
            cr: 0,
            sid: row.sid,
            nonce: row.nonce,
            cid: row.cid,
        },
        Some(key(ENCRYPTED_KEY)),
        Encoding::FourPass,
    );
}

#[test]
fn the_drafts_four_pass_encryption_example() {
    // Section "Encryption Example": its final CID, built by the steps it
    // prints (the XOR operand printed in its step 10 has a typo, b3e4357c for
    // the b334357c of the AES output above it; the result printed follows the
    // AES output).
    let config = Config::new(0, 3, 4, Some(key("fdf726a9893ec05c0632d3956680baf0")), true)
        .expect("valid config");
    let cid = config
        .encode(
            &hex("31441a").expect("hex"),
            &hex("9c69c275").expect("hex"),
            0,
        )
        .expect("encode");
    assert_eq!(
        cid.as_bytes(),
        hex("0767947d29be054a").expect("hex").as_slice()
    );
}

#[test]
fn unroutable_connection_ids_say_why() {
    let mut set = Configs::new();
    set.insert(Config::new(1, 3, 4, Some(key(ENCRYPTED_KEY)), true).expect("valid"))
        .expect("insert");
    assert_eq!(set.route_short(&[]), Err(Unroutable::Empty));
    assert_eq!(
        set.route_short(&[0xe7, 1, 2, 3, 4, 5, 6, 7]),
        Err(Unroutable::Reserved)
    );
    assert_eq!(
        set.route_short(&[0x47, 1, 2, 3, 4, 5, 6, 7]),
        Err(Unroutable::NoConfig(2))
    );
    assert_eq!(
        set.route_short(&[0x27, 1, 2, 3]),
        Err(Unroutable::TooShort {
            codepoint: 1,
            have: 4,
            need: 8
        })
    );
    // A long header whose DCID length disagrees with the self-described one.
    assert_eq!(
        set.route_long(&[0x27, 1, 2, 3, 4, 5, 6, 7, 8]),
        Err(Unroutable::LengthMismatch {
            described: 7,
            header: 8
        })
    );
    // The same octets in a short header: the configuration's length is
    // taken, what follows is the rest of the packet.
    assert!(set.route_short(&[0x27, 1, 2, 3, 4, 5, 6, 7, 8]).is_ok());
}

/// Every length pair the draft allows: server ID ≥ 1, nonce ≥ 4, at most 19
/// together.
fn lengths() -> impl Strategy<Value = (usize, usize)> {
    (1..=MAX_PLAINTEXT_LEN - MIN_NONCE_LEN)
        .prop_flat_map(|sid| (Just(sid), MIN_NONCE_LEN..=MAX_PLAINTEXT_LEN - sid))
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(4096))]

    /// A server's connection ID routes to its server at every length pair,
    /// with and without a key, self-describing or not; the nonce comes back
    /// whole; and a short header (the CID followed by the packet) routes the
    /// same.
    #[test]
    fn round_trips_over_every_length_pair(
        (sid_len, nonce_len) in lengths(),
        codepoint in 0u8..7,
        keyed in any::<bool>(),
        key in any::<[u8; 16]>(),
        self_describing in any::<bool>(),
        material in proptest::collection::vec(any::<u8>(), MAX_PLAINTEXT_LEN),
        random in any::<u8>(),
        trailer in proptest::collection::vec(any::<u8>(), 0..32),
    ) {
        let config = Config::new(codepoint, sid_len, nonce_len, keyed.then_some(key), self_describing)
            .expect("valid");
        let (sid, nonce) = (&material[..sid_len], &material[sid_len..sid_len + nonce_len]);
        let cid = config.encode(sid, nonce, random).expect("encode");
        prop_assert_eq!(cid.as_bytes().len(), 1 + sid_len + nonce_len);
        prop_assert_eq!(cid.as_bytes()[0] >> 5, codepoint);
        if self_describing {
            prop_assert_eq!(usize::from(cid.as_bytes()[0] & 0x1f), sid_len + nonce_len);
        }
        let back = config.decode(cid.as_bytes()).expect("routable");
        prop_assert_eq!(back.server_id.as_bytes(), sid);
        prop_assert_eq!(back.nonce.as_bytes(), nonce);
        let mut set = Configs::new();
        set.insert(config.clone()).expect("insert");
        let (_, routed) = set.route_long(cid.as_bytes()).expect("routable");
        prop_assert_eq!(routed.as_bytes(), sid);
        let mut packet = cid.as_bytes().to_vec();
        packet.extend_from_slice(&trailer);
        let (_, routed) = set.route_short(&packet).expect("routable");
        prop_assert_eq!(routed.as_bytes(), sid);
        if keyed && sid_len + nonce_len >= 8 {
            // Encrypted: the octets are not the plaintext (equal by chance
            // with probability 2^-64 at 8 octets or more).
            prop_assert_ne!(&cid.as_bytes()[1..], &material[..sid_len + nonce_len]);
        }
    }

    /// Any octets at all: routing never panics, and what routes decodes to a
    /// server ID of the configured length.
    #[test]
    fn hostile_octets_never_panic(
        (sid_len, nonce_len) in lengths(),
        key in any::<[u8; 16]>(),
        bytes in proptest::collection::vec(any::<u8>(), 0..40),
    ) {
        let mut set = Configs::new();
        for codepoint in 0..7u8 {
            let keyed = codepoint % 2 == 0;
            set.insert(Config::new(codepoint, sid_len, nonce_len, keyed.then_some(key), codepoint < 4)
                .expect("valid")).expect("insert");
        }
        for routed in [set.route_short(&bytes), set.route_long(&bytes)] {
            match routed {
                Ok((codepoint, sid)) => {
                    prop_assert!(codepoint < 7);
                    prop_assert_eq!(sid.as_bytes().len(), sid_len);
                    prop_assert!(bytes.len() > sid_len + nonce_len);
                }
                Err(Unroutable::Reserved) => prop_assert_eq!(bytes[0] >> 5, 7),
                Err(_) => {}
            }
        }
        // The load balancer's form (the server ID as a number, read
        // without copies for plaintext) says exactly what the octets' form
        // says, for every encoding, routable or not.
        let as_number = |r: Result<(u8, quic_lb::ServerId), Unroutable>| {
            r.map(|(c, s)| (c, quic_lb::server_id_number(s.as_bytes())))
        };
        prop_assert_eq!(set.route_short_number(&bytes), as_number(set.route_short(&bytes)));
        prop_assert_eq!(set.route_long_number(&bytes), as_number(set.route_long(&bytes)));
        if let Ok((_, n)) = set.route_short_number(&bytes) {
            let (_, sid) = set.route_short(&bytes).expect("routable");
            prop_assert_eq!(quic_lb::server_id_of_number(n), sid);
        }
    }
}
