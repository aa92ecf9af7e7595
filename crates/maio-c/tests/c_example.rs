//! The C example client, compiled with gcc against maio.h and the static
//! library, run against a local echo server.

use std::io::{Read, Write};
use std::net::TcpListener;
use std::path::PathBuf;
use std::process::Command;

fn lib_dir() -> PathBuf {
    // target/<profile>/deps/c_example-... -> target/<profile>
    let exe = std::env::current_exe().unwrap();
    exe.parent().unwrap().parent().unwrap().to_path_buf()
}

#[test]
fn c_client_sends_zero_copy_and_receives_scatter_gather() {
    let dir = env!("CARGO_MANIFEST_DIR");
    let lib = lib_dir().join("libmaio_c.a");
    if !lib.exists() {
        // Integration tests link the rlib; make sure the static library exists.
        let st = Command::new(env!("CARGO"))
            .args(["build", "-p", "maio-c", "--lib"])
            .status()
            .unwrap();
        assert!(st.success());
    }
    assert!(lib.exists(), "{} missing", lib.display());
    let out = std::env::temp_dir().join(format!("maio-client-{}", std::process::id()));
    let cc = Command::new("gcc")
        .args(["-O2", "-Wall", "-Wextra", "-Werror", "-I"])
        .arg(format!("{dir}/include"))
        .arg(format!("{dir}/examples/client.c"))
        .arg(&lib)
        .args(["-lpthread", "-ldl", "-lm", "-o"])
        .arg(&out)
        .output()
        .expect("gcc (scripts/setup.sh installs it with clang)");
    assert!(
        cc.status.success(),
        "gcc failed:\n{}",
        String::from_utf8_lossy(&cc.stderr)
    );

    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = l.local_addr().unwrap().port();
    let echo = std::thread::spawn(move || {
        let (mut c, _) = l.accept().unwrap();
        let mut buf = [0u8; 65536];
        let mut total = 0;
        loop {
            let n = c.read(&mut buf).unwrap();
            if n == 0 {
                break;
            }
            c.write_all(&buf[..n]).unwrap();
            total += n;
        }
        total
    });
    let run = Command::new(&out)
        .args(["127.0.0.1", &port.to_string()])
        .output()
        .unwrap();
    let _ = std::fs::remove_file(&out);
    let stdout = String::from_utf8_lossy(&run.stdout);
    assert!(
        run.status.success(),
        "client failed: {}\n{stdout}",
        String::from_utf8_lossy(&run.stderr)
    );
    assert!(
        stdout.contains("sent 32773 bytes, received 32773 bytes back"),
        "{stdout}"
    );
    assert_eq!(echo.join().unwrap(), 32773);
}
